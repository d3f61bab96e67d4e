"""Retraining the shipped toy in a background process for tests/test_shipped_toy.py.

The retraining is the shipped toy's whole training (~15 minutes on one core). The test suite runs
its tests on one thread, so conftest.py starts this process on the machine's other core as soon
as the test is collected, and runs the test last (it joins the process): the suite's wall time
grows by the join's wait, if any, not by the training."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .workflow import REPO


class ToyRetraining:
    """``python -m dlmpipe ship-toy --out DIR`` (the record's options) running in the background."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dlmpipe-toy-retraining-"))
        self.out = self.root / "toy"
        self.log = self.root / "ship-toy.log"
        env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "dlmpipe", "ship-toy", "--out",
                                          str(self.out)], cwd=REPO, env=env, stdout=log,
                                         stderr=subprocess.STDOUT)

    def join(self, timeout: float = 3600) -> Path:
        """The retrained checkpoint directory once the process has finished; its log in the
        error where it failed."""
        rc = self.proc.wait(timeout)
        if rc != 0:
            raise AssertionError(f"ship-toy exited with {rc}:\n{self.log.read_text()[-3000:]}")
        return self.out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
