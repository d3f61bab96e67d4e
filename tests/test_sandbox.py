"""The sandbox holds its limits: no network, no writes outside scratch, no inherited secrets,
hard time limits, capped output, and a pass only on the driver's explicit signal.

These programs are misbehaving but not hostile to the host (no fork bombs, no kill(-1)); the
hostile suite (test_hostile.py) runs inside an outer PID namespace of its own.
"""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from dlmpipe.scoring import sandbox
from dlmpipe.scoring.sandbox import Limits, isolation, run_program, run_suites

BWRAP = isolation().level == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap sandbox unavailable here")


def levels():
    out = [isolation()]
    if BWRAP:
        out.append(isolation("process"))
    return out


@pytest.fixture(params=levels(), ids=lambda iso: iso.level)
def iso(request):
    return request.param


def test_isolation_level_is_checked_and_recorded(iso):
    result = run_program("x = 1\n", iso=iso)
    assert result.passed and result.isolation == iso.level
    assert isolation() is isolation()  # chosen once per process


def test_interpreter_runs_unprivileged(iso):
    result = run_program("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n", iso=iso)
    assert result.passed, result
    uid, gid, groups = result.stdout.split(maxsplit=2)
    if os.geteuid() == 0:
        assert (uid, gid) == ("65534", "65534") and groups.strip() == "[]"


def test_pass_requires_the_signal_after_the_tests(iso):
    suites = [{"name": "base", "format": "assert", "code": "assert f(2) == 4\n"}]
    good = run_suites("def f(x):\n    return 2 * x\n", suites, iso=iso)
    assert good.suites["base"].status == "passed"
    bad = run_suites("def f(x):\n    return x\n", suites, iso=iso)
    assert bad.suites["base"].status == "failed" and "AssertionError" in bad.suites["base"].detail
    for early in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "exit(0)\n",
                  "raise SystemExit\n"):
        r = run_suites("def f(x):\n    return x\n" + early, suites, iso=iso)
        assert r.suites["base"].status != "passed", early
    # exiting 0 from inside the test code
    r = run_suites("import os\ndef f(x):\n    os._exit(0)\n", suites, iso=iso)
    assert r.suites["base"].status == "no-signal"


@needs_bwrap
def test_no_network():
    # a server on the host's loopback is out of reach: the sandbox has its own network namespace
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    program = f"""
import socket
errors = []
for addr in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection(addr, timeout=2).close()
        errors.append("connected to %s" % (addr,))
    except OSError as e:
        pass
names = [n for _, n in socket.if_nameindex()]
print(names)
assert not errors, errors
"""
    result = run_program(program)
    t.join()
    server.close()
    assert result.passed, result
    assert result.stdout.strip() == "['lo']"
    assert not accepted


def test_writes_outside_scratch_fail(iso, tmp_path):
    target = tmp_path / "outside"
    target.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(target, 0o777)  # writable by anyone: only the sandbox can stop the write
    program = f"""
import os
blocked = []
for path in [{str(target / 'pwned.txt')!r}, "/usr/pwned.txt", {str(tmp_path / 'x')!r}]:
    try:
        with open(path, "w") as f:
            f.write("x")
    except OSError:
        blocked.append(path)
with open("scratch.txt", "w") as f:  # the scratch dir is the cwd and is writable
    f.write("ok")
print(len(blocked))
"""
    result = run_program(program, iso=iso)
    assert result.passed, result
    assert not (target / "pwned.txt").exists() and not (tmp_path / "x").exists()
    assert not os.path.exists("/usr/pwned.txt")
    if iso.level == "bwrap":
        assert result.stdout.strip() == "3"


def test_environment_is_clean(iso, monkeypatch):
    monkeypatch.setenv("DLMPIPE_TEST_SECRET", "hunter2-secret-value")
    result = run_program("import os\nprint(sorted(os.environ.items()))\n", iso=iso)
    assert result.passed
    assert "hunter2" not in result.stdout and "DLMPIPE_TEST_SECRET" not in result.stdout


@needs_bwrap
def test_host_files_are_invisible():
    program = """
import os
print(os.path.exists("/work"), os.path.exists("/root"), os.path.exists("/etc/shadow"),
      os.path.expanduser("~"), os.getcwd())
"""
    result = run_program(program)
    assert result.stdout.split() == ["False", "False", "False", "/tmp", "/tmp"]


def test_time_limits(iso):
    start = time.monotonic()
    spin = run_program("while True:\n    pass\n", timeout_s=1.0, iso=iso)
    assert spin.suites["program"].status == "timeout"
    # signals ignored: the host's wall-clock kill still ends it
    stubborn = run_program("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                           "while True:\n    pass\n", timeout_s=1.0, iso=iso)
    assert stubborn.suites["program"].status == "timeout"
    assert time.monotonic() - start < 20


def test_output_is_capped(iso):
    limits = Limits(output_kb=16)
    program = "import os\nfor _ in range(2000):\n    os.write(1, b'x' * 10000)\n"
    result = run_program(program, limits=limits, iso=iso)
    assert result.passed
    assert len(result.stdout) <= 16 << 10


def test_file_size_and_scratch_limits(iso):
    limits = Limits(file_mb=1, scratch_mb=8)
    program = "with open('big', 'wb') as f:\n    f.write(b'x' * (4 << 20))\n"
    result = run_program(program, limits=limits, iso=iso)
    assert result.suites["program"].status in ("failed", "error"), result


def test_memory_limit(iso):
    result = run_program("x = bytearray(8 << 30)\n", limits=Limits(memory_mb=512), iso=iso)
    assert result.suites["program"].status == "failed"
    assert "MemoryError" in result.suites["program"].detail


def test_forced_bwrap_fails_closed(monkeypatch):
    monkeypatch.setattr(sandbox, "_tool", lambda name: None)
    sandbox._cache.pop("bwrap", None)
    with pytest.raises(sandbox.SandboxUnavailable):
        sandbox._choose("bwrap")
