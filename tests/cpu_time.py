"""Each test's CPU seconds in the JUnit XML (property ``cpu_s``), beside the seconds pytest
records: what a slower machine multiplies, where the time a test waits stays the same
(benchmarks/cost_by_part.py suite). Hooks imported by tests/conftest.py."""
from __future__ import annotations

import os

import pytest

#: when each test's setup began, in CPU seconds of this process and its waited-for children
CPU_START = pytest.StashKey[float]()


#: CPU seconds of processes this one did not wait for itself (a fork server's children), as
#: their reaper reported them (``add_cpu``)
_reported = 0.0


def add_cpu(seconds: float) -> None:
    """Counts a command's CPU seconds that ``os.times`` cannot see: a process another one
    reaped (tests/workflow.py's fork server reports its children's)."""
    global _reported
    _reported += seconds


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, of the children it has waited for and of the
    commands reported by ``add_cpu``."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _reported


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[CPU_START] = cpu_seconds()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds (setup to teardown, its commands' included) as the JUnit property
    ``cpu_s``: what a slower machine multiplies, where the time a test waits stays the same
    (benchmarks/cost_by_part.py suite)."""
    if call.when == "teardown" and CPU_START in item.stash:
        item.user_properties.append(("cpu_s", round(cpu_seconds() - item.stash[CPU_START], 3)))
