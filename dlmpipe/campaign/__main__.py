import sys

from .show import main

sys.exit(main())
