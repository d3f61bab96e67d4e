"""Hostile programs are contained, scored as failures, and leave the host unchanged.

We are root on a shared machine: an escaped ``kill(-1, SIGKILL)`` or fork bomb would take every
other process with it. So no hostile program runs in the pytest process's own namespaces. The
test re-runs this file as ``--hostile-inner`` inside an outer containment it builds and verifies
first: a fresh pids cgroup (``pids.max``) and, inside it, ``unshare --pid --fork --kill-child
--mount-proc --net`` (a private PID namespace whose init is the inner runner, and a private
network namespace with only loopback, so no packet of a case that aims at a public address can
leave the machine at any level). The inner runner checks it is PID 1 of a namespace with no other
process, a member of that cgroup, and sees no interface but ``lo`` before anything hostile runs;
otherwise the test is skipped with the reason. When the inner runner exits, the
kernel kills whatever is left in its namespace, and the outer test kills anything left in the
cgroup and fails if there was anything.

Inside, every case goes through the real scorer (sandbox + driver), two at a time as in a scoring
job, with tighter time and memory limits than the defaults to keep the suite short and gentle.
It runs at each isolation level: bwrap; the opt-in process level with the Landlock and seccomp
layers (skipped, with the kernel's reason, where they are unavailable); and the plain process
level (what the process level is on a kernel with neither), against the cases each is meant to
contain (docs/SCORING.md).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
INNER = "--hostile-inner"

ADD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TEST = ("assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(5, 5) == 10\n"
        "assert abs(add(0.1, 0.2) - 0.3) < 1e-9\n")
FLOAT_WRONG = "def add(a, b):\n    return a + b if isinstance(a, int) else 42.0\n"

# name -> (program, what must happen: "pass", "fail" or "any" (host checks only))
CASES = {
    "benign": (ADD, "pass"),
    "infinite_loop": ("def add(a, b):\n    while True:\n        pass\n", "fail"),
    "infinite_loop_at_import": (ADD + "while True:\n    pass\n", "fail"),
    "sleep_ignoring_alarm": ("import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                             + ADD + "time.sleep(10 ** 6)\n", "fail"),
    "fork_bomb": ("import os\n" + ADD + "while True:\n    try:\n        os.fork()\n"
                  "    except OSError:\n        pass\n", "fail"),
    "fork_bomb_setsid": ("import os\nwhile True:\n    try:\n        if os.fork() == 0:\n"
                         "            os.setsid()\n    except OSError:\n        pass\n" + ADD, "fail"),
    "memory_bomb": ("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))\n" + ADD,
                    "fail"),
    "memory_bomb_one_shot": ("x = bytearray(1 << 40)\n" + ADD, "fail"),
    "network_host_loopback": ("import socket\ns = socket.create_connection(('127.0.0.1', PORT), "
                              "timeout=3)\ns.sendall(b'leak SECRET_VALUE')\n" + ADD, "fail"),
    "network_internet": ("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)\n"
                         + ADD, "fail"),
    "network_udp": ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "s.sendto(b'x', ('8.8.8.8', 53))\n" + ADD, "fail"),
    "write_outside_scratch": ("open('HOSTDIR/pwned.txt', 'w').write('x')\n" + ADD, "fail"),
    "write_outside_os_level": ("import os\nfd = os.open('HOSTDIR/pwned2', os.O_CREAT | os.O_WRONLY)\n"
                               "os.write(fd, b'x')\n" + ADD, "fail"),
    "delete_outside_scratch": ("import shutil\nshutil.rmtree('HOSTDIR')\n" + ADD, "fail"),
    "overwrite_host_file": ("open('HOSTDIR/secret.txt', 'w').write('overwritten')\n" + ADD, "fail"),
    "read_env_secret": ("import os, sys\nleak = os.environ['SECRET_NAME']\n"
                        "sys.stdout.write(leak)\n" + ADD, "fail"),
    "read_home_secret": ("import os, sys\nleak = open('HOSTDIR/secret.txt').read()\n"
                         "sys.stdout.write(leak)\nhome = os.listdir('/root')\n" + ADD, "fail"),
    "exit0_before_asserts": (WRONG + "import sys\nsys.exit(0)\n", "fail"),
    "os_exit0_before_asserts": (WRONG + "import os\nos._exit(0)\n", "fail"),
    "os_exit0_inside_test": ("import os\ndef add(a, b):\n    os._exit(0)\n", "fail"),
    "patch_assertion_error": ("import builtins\nclass Quiet(Exception):\n    pass\n"
                              "builtins.AssertionError = Quiet\n" + WRONG, "fail"),
    "patch_builtins_and_exits": ("import builtins, os, sys\nbuiltins.print = lambda *a, **k: None\n"
                                 "sys.exit = lambda *a: None\nos._exit = lambda *a: None\n"
                                 "builtins.BaseException = object\n" + WRONG, "fail"),
    "patch_builtin_the_test_uses": ("import builtins\nbuiltins.abs = lambda x: 0\n" + FLOAT_WRONG,
                                    "fail"),
    "shadow_builtin_the_test_uses": (FLOAT_WRONG + "def abs(x):\n    return 0\n", "fail"),
    "patch_builtin_during_the_call": ("def add(a, b):\n    import builtins\n"
                                      "    builtins.abs = lambda x: 0\n"
                                      "    return a + b if isinstance(a, int) else 42.0\n", "fail"),
    "excepthook_and_atexit": ("import atexit, os, sys\nsys.excepthook = lambda *a: None\n"
                              "atexit.register(lambda: os.write(1, b'passed'))\n" + WRONG, "fail"),
    "forge_signal_lines": ("import os\nfor fd in range(0, 64):\n    try:\n"
                           "        os.write(fd, b'0' * 32 + b'\\tbase\\tpassed\\t\\n')\n"
                           "    except OSError:\n        pass\n" + WRONG, "fail"),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + ADD, "any"),
    "kill_everything": ("import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
                        "except OSError:\n    pass\n" + ADD, "any"),
    "kill_by_proc_scan": ("import os, signal\nfor p in os.listdir('/proc'):\n"
                          "    if p.isdigit() and int(p) != os.getpid():\n        try:\n"
                          "            os.kill(int(p), signal.SIGKILL)\n"
                          "        except OSError:\n            pass\n" + ADD, "any"),
    "flood_stdout_python": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n" + ADD,
                            "fail"),
    "flood_fd1": ("import os\nwhile True:\n    os.write(1, b'x' * 65536)\n" + ADD, "fail"),
    "flood_fd2": ("import os\nwhile True:\n    os.write(2, b'y' * 65536)\n" + ADD, "fail"),
    "fill_scratch": ("n = 0\nwhile True:\n    with open('f%d' % n, 'wb') as f:\n"
                     "        f.write(b'z' * (1 << 20))\n    n += 1\n" + ADD, "fail"),
}

# Cases that wait out their limit using no CPU: the sleeper sleeps until the wall-clock
# backstop (load + 5 s + time limit); a flood blocks on its full pipe once the host stops reading
# it (64 MiB). They run beside the two-at-a-time pair (_inner), not in it.
WAITING = {"sleep_ignoring_alarm", "flood_stdout_python", "flood_fd1", "flood_fd2"}

# Cases that run until a time limit ends them, spinning (loops, fork bombs, writes into the
# driver's capped stdout) or sleeping: they get 0.5 s limits (the driver's timer, as in
# test_sandbox.py's time-limit tests; the wall-clock backstop then 6 s), the others 3 s, so a
# short-lived case never fails for want of CPU beside a spinning one. A limit ends each either
# way; the CPU they burn, and the wall time, is what the length changes (3 s: a level's tests
# took 12-15 CPU s).
TIMED = {"infinite_loop", "infinite_loop_at_import", "fork_bomb", "fork_bomb_setsid",
         "flood_stdout_python", "sleep_ignoring_alarm"}

# The process level with Landlock and seccomp contains everything bwrap does but filling the
# scratch directory, which lies on the host's disk (each file capped, not the total). Signals are
# scoped to the sandbox from Landlock ABI 6 on; below that kill(-1) reaches the sandbox uid's
# other processes (the "kill" cases then stay out).
CONFINED_CASES = [c for c in CASES if c != "fill_scratch"]
SCOPED_SIGNAL_CASES = ["kill_everything", "kill_by_proc_scan"]

# The plain ``process`` level shares the host's network and filesystem view (protected by
# ordinary permissions only) and its uid with other sandboxes (docs/SCORING.md): only the cases
# it is meant to contain run there, against a host directory with the usual 0755/0644 modes.
PROCESS_CASES = ["benign", "infinite_loop", "infinite_loop_at_import", "sleep_ignoring_alarm",
                 "fork_bomb", "memory_bomb", "memory_bomb_one_shot", "read_env_secret",
                 "exit0_before_asserts", "os_exit0_before_asserts", "os_exit0_inside_test",
                 "patch_assertion_error", "patch_builtins_and_exits", "excepthook_and_atexit",
                 "patch_builtin_the_test_uses", "shadow_builtin_the_test_uses",
                 "patch_builtin_during_the_call",
                 "forge_signal_lines", "flood_stdout_python", "flood_fd1", "flood_fd2",
                 "overwrite_host_file", "delete_outside_scratch"]


# ---------------------------------------------------------------------------------------------
# Outer side (pytest): build the containment, run the inner runner in it, tear it down


def _pids_cgroup_root() -> Path | None:
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists():
        return v1
    v2 = Path("/sys/fs/cgroup")
    control = v2 / "cgroup.subtree_control"
    if control.exists() and "pids" in control.read_text().split():
        return v2
    return None


def _cgroup_pids(cg: Path) -> list[int]:
    try:
        return [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def run_contained(mode: str, cases: list[str], plain: bool = False) -> dict:
    """Run ``cases`` at level ``mode`` (DLMPIPE_SANDBOX) inside the containment; ``plain``: the
    process level without its confinement layers."""
    if os.geteuid() != 0:
        pytest.skip("hostile suite needs root (PID namespace, pids cgroup); not contained here")
    unshare = shutil.which("unshare")
    root = _pids_cgroup_root()
    if unshare is None or root is None:
        pytest.skip(f"hostile suite needs unshare and a pids cgroup (unshare={unshare}, "
                    f"pids cgroup={root})")
    cg = root / f"dlmpipe-hostile-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        cg.mkdir()
        (cg / "pids.max").write_text("400\n")
    except OSError as e:
        pytest.skip(f"cannot create a pids cgroup under {root}: {e}")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "DLMPIPE_SANDBOX": mode, "DLMPIPE_HOSTILE_CGROUP": cg.name, "LANG": "C.UTF-8",
           "DLMPIPE_HOSTILE_PLAIN": "1" if plain else ""}
    script = ('echo $$ > "$0/cgroup.procs" && exec "$1" --pid --fork --kill-child --mount-proc '
              '--net "$2" "$3" ' + INNER + ' "$4"')
    cmd = ["sh", "-c", script, str(cg), unshare, sys.executable, str(HERE), json.dumps(cases)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env,
                              cwd=REPO, start_new_session=True)
        leftovers = _cgroup_pids(cg)
    finally:
        for _ in range(100):  # kill what is left in *our* cgroup, by pid, then remove it
            pids = _cgroup_pids(cg)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        try:
            cg.rmdir()
        except OSError:
            pass
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"inner runner said nothing (rc {proc.returncode}): {proc.stderr[-3000:]}"
    report = json.loads(lines[-1])
    if "skip" in report:
        pytest.skip("containment not established: " + report["skip"])
    report["leftovers"] = leftovers
    return report


def check_report(report: dict, cases: list[str]) -> None:
    assert report["leftovers"] == [], "processes outlived the inner runner's namespace"
    host = report["host"]
    assert host["sentinels_alive"], host
    assert host["hostdir_unchanged"], host
    assert host["connections"] == 0, host
    assert host["stray_processes"] == [], host
    for name in cases:
        got = report["results"][name]
        expected = CASES[name][1]
        if expected == "pass":
            assert got["status"] == "passed", (name, got)
        elif expected == "fail":
            assert got["status"] != "passed", (name, got)
        assert not got["leaked"], (name, got)
        assert got["wall_s"] < 120, (name, got)


@pytest.mark.hostile
def test_hostile_programs_contained_bwrap():
    report = run_contained("bwrap", list(CASES))
    assert report["isolation"] == "bwrap"
    check_report(report, list(CASES))
    statuses = {k: v["status"] for k, v in report["results"].items()}
    assert statuses["os_exit0_inside_test"] == "no-signal"
    assert statuses["infinite_loop"] == statuses["sleep_ignoring_alarm"] == "timeout"


@pytest.mark.hostile
def test_hostile_programs_contained_process_landlock_seccomp():
    from dlmpipe.scoring.confine import landlock_abi, layer_support

    missing = {k: v for k, v in layer_support().items() if v}
    if missing:
        pytest.skip("; ".join(f"no {k}: {v}" for k, v in missing.items()))
    cases = CONFINED_CASES
    if landlock_abi() < 6:
        cases = [c for c in cases if c not in SCOPED_SIGNAL_CASES]
    report = run_contained("process", cases)
    assert report["isolation"] == "process+landlock+seccomp"
    check_report(report, cases)
    statuses = {k: v["status"] for k, v in report["results"].items()}
    for name in ("network_host_loopback", "network_internet", "network_udp",
                 "write_outside_scratch", "write_outside_os_level", "read_home_secret"):
        assert "PermissionError" in report["results"][name]["detail"], (name, statuses[name])


@pytest.mark.hostile
def test_hostile_programs_contained_process_plain():
    report = run_contained("process", PROCESS_CASES, plain=True)
    assert report["isolation"] == "process"
    check_report(report, PROCESS_CASES)


# ---------------------------------------------------------------------------------------------
# Inner side: verify the containment, set up host probes, run the cases, check the host


def _loopback_up() -> None:
    """Bring up ``lo`` of the private network namespace (SIOCGIFFLAGS/SIOCSIFFLAGS, IFF_UP)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 0x1))


def _containment_problems() -> list[str]:
    problems = []
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"]:
        problems.append(f"not in a private network namespace (interfaces {interfaces})")
    if os.getpid() != 1:
        problems.append(f"not PID 1 of a private PID namespace (pid {os.getpid()})")
    others = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
    if others:
        problems.append(f"other processes visible in the namespace: {others[:5]}")
    expected = os.environ.get("DLMPIPE_HOSTILE_CGROUP", "")
    cgroups = Path("/proc/self/cgroup").read_text()
    if not expected or expected not in cgroups:
        problems.append(f"not in the pids cgroup {expected!r}")
    return problems


def _inner(cases: list[str]) -> dict:
    problems = _containment_problems()
    if problems:
        return {"skip": "; ".join(problems)}
    _loopback_up()
    sys.path.insert(0, str(REPO))
    from concurrent.futures import ThreadPoolExecutor

    import dataclasses

    from dlmpipe.scoring.code import Settings, program_of, run_code, verdict
    from dlmpipe.scoring.levels import isolation
    from dlmpipe.scoring.sandbox import Limits

    iso = isolation()
    if os.environ.get("DLMPIPE_HOSTILE_PLAIN"):
        iso = dataclasses.replace(iso, level="process", layers=())
    secret_name, secret_value = "DLMPIPE_HOSTILE_SECRET", "s3cr3t-" + secrets.token_hex(8)
    os.environ[secret_name] = secret_value
    hostdir = Path(f"/tmp/dlmpipe-hostile-{secrets.token_hex(4)}")
    hostdir.mkdir()
    (hostdir / "secret.txt").write_text(secret_value)
    if iso.level == "bwrap" or "landlock" in iso.layers:
        # world-writable: only the sandbox stands between it and the program
        os.chmod(hostdir, 0o777)
        os.chmod(hostdir / "secret.txt", 0o666)
    else:  # the process level relies on ordinary permissions (and uid 65534)
        os.chmod(hostdir, 0o755)
        os.chmod(hostdir / "secret.txt", 0o644)
    before = sorted(os.listdir(hostdir))

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    connections, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                connections.append(conn.recv(100))
                conn.close()
            except OSError:
                pass

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    sentinels = [subprocess.Popen(["sleep", "1000"])]
    if os.geteuid() == 0:
        sentinels.append(subprocess.Popen(["sleep", "1000"], user=65534, group=65534,
                                          extra_groups=[]))

    # 256 MB: the memory bomb's MemoryError after 256 MB of page faults, not 1 GB (it took
    # ~3 s, at times past its time limit)
    limits = Limits(memory_mb=256, scratch_mb=32, file_mb=16)
    settings = Settings(time_limit=3.0, load_time_limit=3.0, min_input_time=1.0, limits=limits)
    timed = Settings(time_limit=0.5, load_time_limit=0.5, min_input_time=1.0, limits=limits)
    row = {"task_id": "hostile/0", "kind": "code", "entry_point": "add", "code_prefix": "",
           "response_prefix": "", "test": TEST}

    def run(name):
        program = CASES[name][0]
        for key, value in (("PORT", str(port)), ("HOSTDIR", str(hostdir)),
                           ("SECRET_NAME", secret_name), ("SECRET_VALUE", "sv")):
            program = program.replace(key, value)
        start = time.monotonic()
        result = run_code(row, program_of(row, "```python\n" + program + "```"),
                          timed if name in TIMED else settings, iso)
        v = verdict(result)
        text = result.stdout + result.stderr + v["detail"]
        return name, {"status": v["status"], "detail": v["detail"][:200],
                      "isolation": v["isolation"], "leaked": secret_value in text,
                      "wall_s": time.monotonic() - start}

    # Two at a time, as in a scoring job; beside the pair, each in a thread of its own, the
    # cases that wait rather than compute (WAITING): with them in the pair, the sleeper held one
    # of its two places for the whole wall-clock backstop (then 11 s of a level's 19). Each still
    # runs in its own sandbox under its limits, with its own result and checks.
    waiting = [c for c in cases if c in WAITING]
    with ThreadPoolExecutor(max(len(waiting), 1)) as side, ThreadPoolExecutor(2) as pool:
        beside = [side.submit(run, name) for name in waiting]
        results = dict(pool.map(run, [c for c in cases if c not in WAITING]))
        results.update(f.result() for f in beside)

    time.sleep(0.5)
    stop.set()
    listener.join()
    server.close()
    alive = all(s.poll() is None for s in sentinels)
    sentinel_pids = {str(s.pid) for s in sentinels}
    stray = [p for p in os.listdir("/proc")
             if p.isdigit() and p != "1" and p not in sentinel_pids
             and Path(f"/proc/{p}/status").exists()
             and "State:\tZ" not in Path(f"/proc/{p}/status").read_text()]
    unchanged = (hostdir.is_dir() and sorted(os.listdir(hostdir)) == before
                 and (hostdir / "secret.txt").read_text() == secret_value)
    for s in sentinels:
        s.kill()
        s.wait()
    shutil.rmtree(hostdir, ignore_errors=True)
    return {"isolation": iso.level, "results": results,
            "host": {"sentinels_alive": alive, "hostdir_unchanged": unchanged,
                     "connections": len(connections), "stray_processes": stray}}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == INNER:
    print(json.dumps(_inner(json.loads(sys.argv[2]))), flush=True)
