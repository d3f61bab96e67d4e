"""Retraining the shipped toy in a background process for tests/test_shipped_toy.py.

The retraining is the shipped toy's whole training (~15 minutes on one core). The test suite runs
its tests on one thread, so the retraining starts on the machine's other core as soon as the
test is known to be collected, and the test runs last in its file (it joins the process): the
suite's wall time grows by the join's wait, if any, not by the training.

Under pytest-xdist the controller starts it (conftest.py, when the first worker has collected
the test), before any test runs, in a folder named by the run's ``testrunuid``; the worker that
runs the test finds it there (``ToyRetraining.attach``) instead of starting its own when it
reaches the test: started by the worker, the training began only when that worker got to the
test, and the worker then sat idle for most of it."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .workflow import REPO


#: the retraining's niceness where the user may raise priorities (root): where it runs it is the
#: suite's critical path (3000 steps on one thread; the last CI run on the record's kernels took
#: 25 minutes, most of it waiting for it), so it takes a core of its own while the tests' workers
#: share the other, instead of two thirds of one
RETRAINING_NICENESS = -5


def _ahead_of_the_tests() -> None:
    """In the retraining's child before exec: run ahead of the test workers where permitted."""
    try:
        os.nice(RETRAINING_NICENESS)
    except OSError:  # not root: the same priority as the tests
        pass


def shared_root(testrunuid: str) -> Path:
    """Where the controller's retraining for run ``testrunuid`` lives (workers look there)."""
    return Path(tempfile.gettempdir()) / f"dlmpipe-toy-retraining-{testrunuid}"


class ToyRetraining:
    """``python -m dlmpipe ship-toy --out DIR`` (the record's options) running in the background;
    its exit status is written to ``DIR/../rc`` so that another process can join it."""

    def __init__(self, root: Path | None = None, start: bool = True) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dlmpipe-toy-retraining-")) if root is None else root
        self.out = self.root / "toy"
        self.log = self.root / "ship-toy.log"
        self.rc = self.root / "rc"
        self.proc: subprocess.Popen | None = None
        if start:
            self.root.mkdir(parents=True, exist_ok=True)
            env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
            command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "dlmpipe", "ship-toy",
                                                         "--out", str(self.out)))
            # the status file is written by the shell after the training ends, however it ends
            self.proc = subprocess.Popen(
                ["bash", "-c", f'{command} > {shlex.quote(str(self.log))} 2>&1; echo $? > {shlex.quote(str(self.rc))}.tmp; '
                               f'mv {shlex.quote(str(self.rc))}.tmp {shlex.quote(str(self.rc))}'],
                cwd=REPO, env=env, start_new_session=True, preexec_fn=_ahead_of_the_tests)

    @classmethod
    def attach(cls, root: Path) -> "ToyRetraining | None":
        """The retraining another process started in ``root``, if there is one."""
        return cls(root, start=False) if root.is_dir() else None

    def join(self, timeout: float = 3600) -> Path:
        """The retrained checkpoint directory once the process has finished; its log in the
        error where it failed."""
        deadline = time.monotonic() + timeout
        while not self.rc.is_file():
            if self.proc is not None and self.proc.poll() is not None and not self.rc.is_file():
                raise AssertionError(f"the retraining's shell exited with {self.proc.returncode} "
                                     f"without a status:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the retraining did not finish in {timeout:.0f} s:\n{self._log_tail()}")
            time.sleep(1)
        rc = int(self.rc.read_text().strip() or -1)
        if rc != 0:
            raise AssertionError(f"ship-toy exited with {rc}:\n{self._log_tail()}")
        return self.out

    def _log_tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.is_file() else "(no log)"

    def stop(self) -> None:
        """Ends the retraining this object started (its whole process group) and removes its
        folder; an attached one is the starter's to stop."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
