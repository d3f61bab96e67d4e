"""The sandbox holds its limits: no network, no writes outside scratch, no inherited secrets,
hard time limits, capped output, and a pass only on the driver's explicit signal; at every
level: bwrap, the opt-in process level with the confinement layers this kernel supports, and the
plain process level (what that level is where the kernel has none).

These programs are misbehaving but not hostile to the host (no fork bombs, no kill(-1)); the
hostile suite (test_hostile.py) runs inside an outer PID namespace of its own. The choice of the
level (fail closed, opt-in, retries) is tested in test_sandbox_levels.py.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time

import pytest

from dlmpipe.scoring import levels as levels_module
from dlmpipe.scoring.confine import layer_support
from dlmpipe.scoring.levels import isolation
from dlmpipe.scoring.sandbox import Limits, run_program, run_suites

BWRAP = isolation("auto").level == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap sandbox unavailable here")


def levels():
    process = isolation("process")
    out = [isolation("bwrap")] if BWRAP else []
    out.append(process)
    if process.layers:  # the plain level, as on a kernel without Landlock and seccomp
        out.append(dataclasses.replace(process, level="process", layers=()))
    return out


@pytest.fixture(params=levels(), ids=lambda iso: iso.level)
def iso(request):
    return request.param


def test_isolation_level_is_checked_and_recorded(iso):
    result = run_program("x = 1\n", iso=iso)
    assert result.passed and result.isolation == iso.level
    assert isolation("auto") is isolation("auto")  # chosen once per process
    assert iso.level == "+".join((iso.level.split("+")[0], *iso.layers))


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


def _network_blocked(iso) -> bool:
    return iso.level == "bwrap" or bool(iso.layers)


def test_no_network(iso):
    if not _network_blocked(iso):
        pytest.skip("the plain process level shares the host's network (docs/SCORING.md)")
    # a server on the host's loopback is out of reach: bwrap has its own network namespace, the
    # process level's seccomp filter allows no AF_INET socket and Landlock denies TCP connect
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
    # public addresses only inside bwrap's empty network namespace: no packet can leave it
    public = [("1.1.1.1", 53), ("8.8.8.8", 443)] if iso.level == "bwrap" else []
    program = f"""
import socket
errors = []
for addr in [("127.0.0.1", {port})] + {public}:
    try:
        socket.create_connection(addr, timeout=2).close()
        errors.append("connected to %s" % (addr,))
    except OSError as e:
        pass
if {iso.level == "bwrap"}:
    print([n for _, n in socket.if_nameindex()])
assert not errors, errors
"""
    result = run_program(program, iso=iso)
    t.join()
    server.close()
    assert result.passed, result
    if iso.level == "bwrap":
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
    if iso.level == "bwrap" or "landlock" in iso.layers:  # not just ordinary permissions
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
    result = run_program(program, iso=isolation("bwrap"))
    assert result.stdout.split() == ["False", "False", "False", "/tmp", "/tmp"]


def test_landlock_limits_reads_to_bwraps_view(tmp_path):
    iso = isolation("process")
    if "landlock" not in iso.layers:
        pytest.skip(f"no Landlock here: {layer_support()['landlock']}")
    os.chmod(tmp_path, 0o755)
    (tmp_path / "secret.txt").write_text("hunter2")
    os.chmod(tmp_path / "secret.txt", 0o644)  # readable by anyone: only Landlock stops the read
    program = f"""
import os
denied = []
for read in [lambda: open({str(tmp_path / 'secret.txt')!r}).read(), lambda: os.listdir("/etc"),
             lambda: os.listdir("/proc"), lambda: open("/etc/hostname").read()]:
    try:
        read()
    except PermissionError:
        denied.append(1)
import json, textwrap  # the standard library under /usr stays readable
print(len(denied))
"""
    result = run_program(program, iso=iso)
    assert result.passed, result
    assert result.stdout.strip() == "4" and "hunter2" not in result.stdout


def test_seccomp_keeps_every_child_in_the_killed_process_group():
    iso = isolation("process")
    if "seccomp" not in iso.layers:
        pytest.skip(f"no seccomp here: {layer_support()['seccomp']}")
    program = """
import os, subprocess
denied = []
for call in (os.setsid, lambda: os.setpgid(0, 0),
             lambda: subprocess.run(["true"], start_new_session=True)):
    try:
        call()
    except PermissionError:
        denied.append(1)
print(len(denied))
"""
    result = run_program(program, iso=iso)
    assert result.passed, result
    assert result.stdout.strip() == "3"


def test_time_limits(iso):
    start = time.monotonic()
    # the driver's own timer ends a busy loop at its limit, long before the wall clock
    spin = run_program("while True:\n    pass\n", timeout_s=0.2, iso=iso)  # wall: 3.2 s
    assert spin.suites["program"].status == "timeout" and not spin.timed_out
    assert spin.suites["program"].detail == "program: time limit exceeded"
    # signals ignored: the host's wall-clock kill still ends it (the program was looping)
    stubborn = run_suites("import os, signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                          "os.write(1, b'looping')\nwhile True:\n    pass\n",
                          [{"name": "program", "format": "assert", "code": "pass"}],
                          wall_s=1.5, iso=iso)
    assert stubborn.suites["program"].status == "timeout" and stubborn.timed_out
    assert stubborn.stdout == "looping"
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
    monkeypatch.setattr(levels_module, "_tool", lambda name: None)
    with pytest.raises(levels_module.SandboxUnavailable):
        levels_module._choose("bwrap")
