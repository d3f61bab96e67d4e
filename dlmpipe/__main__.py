import os
import sys

if os.environ.get("DLMPIPE_JOB_SERVER", "0") != "0":  # a workflow's local job (dlmpipe/jobserver.py)
    from .jobserver import enabled, run_served

    status = run_served(enabled(), sys.argv[1:])
    if status is not None:
        raise SystemExit(status)
    print(f"dlmpipe: job server {enabled()} unreachable; this job imports torch itself",
          file=sys.stderr)

from .cli import main

raise SystemExit(main())
