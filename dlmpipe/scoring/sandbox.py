"""Run one untrusted Python program against its tests in a sandbox of its own.

Generated code is hostile until proven otherwise: it may loop, fork, allocate, open sockets,
write anywhere, read secrets, exit early to fake success or kill its parent. Every program gets
a fresh sandbox and an isolation level that is recorded with its result:

``bwrap`` (the default, required unless the user opts out): ``setpriv`` drops to uid/gid 65534
with no groups (RLIMIT_NPROC is not enforced for uid 0), ``prlimit`` sets address-space,
CPU-time, file-size, process-count, core and open-file limits, and ``bwrap --unshare-all`` gives
the program its own user, PID, network (loopback only), IPC and UTS namespaces, a read-only view
of /usr (and of the interpreter's prefix) and nothing else of the host, a size-capped private
tmpfs as cwd/HOME/TMPDIR, a cleared environment, ``--die-with-parent`` and ``--new-session``.
Where unprivileged user namespaces are off but we are root, bwrap runs as root without a user
namespace and ``setpriv`` drops the uid inside it (the same level).

``process`` (only when the user opts in: where bwrap or namespaces are unavailable, e.g. some
clusters): a separate process in its own session with the same rlimits, a cleared environment, a
private scratch directory as cwd, and uid/gid 65534 when we are root; plus every unprivileged
kernel layer that works here (confine.py): ``landlock`` (the filesystem read-only and reduced to
bwrap's view, scratch writable; TCP denied, signals scoped where the ABI has them) and
``seccomp`` (no sockets but AF_UNIX, no ptrace/mount/kexec/namespaces, no leaving the process
group). The recorded level names the active layers, e.g. ``process+landlock+seccomp``.

Which level runs, and whether it works here, is decided once per process in levels.py (fail
closed: bwrap unless the user opts in to the process level); every run here is given its level.

The host kills the whole process group at the wall-clock limit; captured stdout/stderr are
capped. The verdict comes only from token-authenticated lines the trusted driver (harness.py)
writes to a dedicated pipe after each suite ran, never from the exit status. Reference outputs
of differential suites come back on a second pipe that the driver closes before candidate code
runs (``RunResult.references``, for the caller to pass on as ``expected``: references.py).
"""
from __future__ import annotations

import marshal
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .confine import Confinement

NOBODY = 65534
HARNESS_SOURCE = Path(__file__).with_name("harness.py").read_text()
# The driver as bytecode ahead of the job on stdin, loaded by this line (its source: _driver_code)
DRIVER_BOOT = "import marshal, sys\nexec(marshal.load(sys.stdin.buffer))"
FINAL_STATUSES = ("passed", "failed", "timeout", "error")
_DRAIN_LIMIT = 64 << 20  # bytes read from a flooding program before its pipe is closed
START_RETRY_S = 90.0     # keep retrying a sandbox that failed to start for this long
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # besides /usr
REFERENCE_CAP = 16 << 20  # bytes of one suite's shared reference outputs (larger: not shared)


@dataclass(frozen=True)
class Limits:
    """Per-program resource limits. ``cpu`` follows the wall-clock limit."""

    memory_mb: int = 4096     # RLIMIT_AS (EvalPlus uses 4 GiB)
    file_mb: int = 64         # RLIMIT_FSIZE: largest file the program may write
    nproc: int = 64           # RLIMIT_NPROC for uid 65534: fork bombs stop here
    nofile: int = 256         # RLIMIT_NOFILE
    scratch_mb: int = 64      # size of the private tmpfs (bwrap)
    output_kb: int = 64       # captured stdout/stderr kept per stream


@dataclass(frozen=True)
class Isolation:
    level: str                # "bwrap" or "process[+landlock][+seccomp]": recorded with results
    variant: str              # "userns", "rootns" or "process"
    python: str               # interpreter checked to run inside this sandbox
    ro_paths: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()  # process only: the confine.py layers applied to each program


@dataclass
class SuiteOutcome:
    status: str               # passed, failed, timeout, error, no-signal
    detail: str = ""


@dataclass
class RunResult:
    suites: dict[str, SuiteOutcome]
    isolation: str
    returncode: int | None
    timed_out: bool
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)
    # suite -> the driver's ``expected`` ("": outputs it could not send: too large, unpicklable)
    references: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.suites) and all(s.status == "passed" for s in self.suites.values())


def _tool(name: str) -> str | None:
    if name == "bwrap" and "DLMPIPE_BWRAP" in os.environ:  # this bwrap, or none when empty
        path = os.environ["DLMPIPE_BWRAP"]
        return path if path and os.access(path, os.X_OK) else None
    for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def _is_root() -> bool:
    return os.geteuid() == 0


# ---------------------------------------------------------------------------------------------
# Building the command line


def _clean_env(home: str) -> dict[str, str]:
    """No inherited variables: API keys and tokens in the scorer's environment stay there."""
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"}


def _rlimit_args(limits: Limits, cpu_s: int) -> list[str]:
    return [f"--as={limits.memory_mb << 20}", f"--cpu={cpu_s}", f"--fsize={limits.file_mb << 20}",
            f"--nproc={limits.nproc}", f"--nofile={limits.nofile}", "--core=0"]


def _bwrap_args(iso: Isolation, limits: Limits, userns: bool) -> list[str]:
    unshare = (["--unshare-all"] if userns else
               ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try"])
    args = [*unshare, "--as-pid-1", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for top in SYSTEM_DIRS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in iso.ro_paths:
        args += ["--ro-bind", path, path]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
             "--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(limits.scratch_mb << 20), "--tmpfs", "/tmp",
             "--chdir", "/tmp", "--clearenv"]
    for key, value in _clean_env("/tmp").items():
        args += ["--setenv", key, value]
    return args


@lru_cache(maxsize=None)
def _driver_code(python: str) -> bytes:
    """The driver (harness.py) compiled by the sandbox's interpreter, marshalled: once per
    process, outside the sandbox (our own source; no candidate code runs), as compiling the source
    in every sandbox cost: a trivial program's sandbox ~16 -> ~14 ms CPU (bwrap), ~13.5 -> ~10.5
    (process+landlock+seccomp). Empty where that interpreter cannot do it here: the driver then
    goes as source (``-c``)."""
    compiler = ("import marshal, sys\n"
                "sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), '<string>', 'exec')))")
    try:
        out = subprocess.run([python, "-I", "-B", "-c", compiler], input=HARNESS_SOURCE.encode(),
                             capture_output=True, timeout=60, env=_clean_env("/tmp"))
    except (OSError, subprocess.SubprocessError):
        return b""
    return out.stdout if out.returncode == 0 else b""


def _command(iso: Isolation, limits: Limits, cpu_s: int, signal_fd: int,
             reference_fd: int | None = None, boot: bool = False) -> list[str]:
    """``boot``: the driver's bytecode comes first on stdin (DRIVER_BOOT), else its source."""
    python = [iso.python, "-I", "-B", "-c", DRIVER_BOOT if boot else HARNESS_SOURCE, str(signal_fd),
              *([str(reference_fd)] if reference_fd is not None else [])]
    prlimit, setpriv = _tool("prlimit"), _tool("setpriv")
    rlimits = [prlimit, *_rlimit_args(limits, cpu_s), "--"] if prlimit else []
    drop = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    if iso.variant == "userns":
        # bwrap itself never runs as root: the uid is dropped before the namespaces are made.
        return [*(drop if _is_root() else []), *rlimits, _tool("bwrap"),
                *_bwrap_args(iso, limits, userns=True), "--", *python]
    if iso.variant == "rootns":
        caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return [_tool("bwrap"), *_bwrap_args(iso, limits, userns=False), *caps, "--",
                *drop, *rlimits, *python]
    return [*rlimits, *python]  # process: Popen drops the uid, confine.py restricts the child


def _host_view(iso: Isolation) -> list[str]:
    """What a process-level program may read: the paths bwrap binds read-only."""
    return ["/usr", *SYSTEM_DIRS, *iso.ro_paths, "/etc/ld.so.cache"]


# ---------------------------------------------------------------------------------------------
# Running


def default_wall_s(suites: list[dict], load_time_limit: float = 10.0) -> float:
    """Wall-clock budget: every suite's limit (three times for differential suites, whose
    reference solution runs first and whose limit stretches with the reference's time), loading
    the program, and interpreter start-up. A backstop: the driver's own timers fire first."""
    total = load_time_limit + 5.0
    for s in suites:
        t = float(s.get("time_limit", 30.0))
        total += 3 * t if s.get("format") == "evalplus" else t
    return total


def run_suites(program: str, suites: list[dict], *, iso: Isolation, wall_s: float | None = None,
               limits: Limits = Limits(), load_time_limit: float = 10.0,
               start_retry_s: float = START_RETRY_S, on_references=None) -> RunResult:
    """Run ``program`` then each test suite in one fresh sandbox of ``iso`` (chosen and checked
    by levels.isolation, which runs its self-check through here); one outcome per suite.
    ``on_references(dict)`` is called with the fresh reference outputs as soon as they arrived
    (before the candidate's verdict), and once at the end if they never did; without it the
    driver gets no reference pipe and sends nothing back (nobody would reuse the outputs)."""
    wall = float(wall_s or default_wall_s(suites, load_time_limit))
    cpu_s = math.ceil(wall) + 1
    token = secrets.token_hex(16)
    job = {"token": token, "program": program, "suites": suites,
           "load_time_limit": load_time_limit, "output_cap": limits.output_kb << 10,
           "reference_cap": REFERENCE_CAP,
           "limits": {"as": limits.memory_mb << 20, "cpu": cpu_s, "fsize": limits.file_mb << 20,
                      "nproc": limits.nproc, "nofile": limits.nofile, "core": 0}}
    driver = _driver_code(iso.python)
    # the driver reads the job without importing json (harness.py)
    payload = driver + marshal.dumps(job, 4)

    scratch, confinement = None, None
    popen_kwargs: dict = {}
    if iso.variant == "process":
        scratch = tempfile.mkdtemp(prefix="dlmpipe-scratch-")
        os.chmod(scratch, 0o700)
        if _is_root():
            os.chown(scratch, NOBODY, NOBODY)
            popen_kwargs = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        popen_kwargs["cwd"] = scratch
    env = _clean_env(scratch or "/tmp")
    ready = f"{token}\t*\tready\t"
    give_up = time.monotonic() + start_retry_s
    attempt = 0
    sent = []
    notify = None
    if on_references:
        def notify(refs):
            if not sent:
                sent.append(True)
                on_references(refs)
    try:
        if iso.layers:  # applied in the child after the uid drop, before exec
            confinement = Confinement(iso.layers, _host_view(iso), scratch)
            popen_kwargs["preexec_fn"] = confinement.apply
        while True:
            rc, timed_out, out, err, sig, refs, elapsed = _execute(
                iso, limits, cpu_s, wall, payload, env, popen_kwargs,
                shared=sum(s.get("format") == "evalplus" for s in suites) if notify else 0,
                notify=notify,
                boot=bool(driver))
            if timed_out or ready in sig or time.monotonic() > give_up:
                break
            # the sandbox did not start (e.g. EAGAIN: another program's fork bomb holds the
            # uid's process budget until its own limit ends it): wait and try again
            attempt += 1
            time.sleep(min(0.25 * 2 ** attempt, 5.0))
    finally:
        if confinement:
            confinement.close()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if notify:
        notify(_references(refs))
    outcomes = _outcomes(suites, sig, token, rc, timed_out)
    if ready not in sig and not timed_out:
        for outcome in outcomes.values():
            outcome.status = "error"
            outcome.detail = f"sandbox did not start: {err.strip()[-200:]}"
    return RunResult(outcomes, iso.level, rc, timed_out, out, err, elapsed,
                     extra={"start_attempts": attempt + 1}, references=_references(refs))


def run_program(program: str, *, iso: Isolation, timeout_s: float = 10.0,
                limits: Limits = Limits()) -> RunResult:
    """Run a bare program; its one suite ``program`` passes iff the program ran to the end."""
    return run_suites(program, [{"name": "program", "format": "assert", "code": "pass",
                                 "time_limit": 1.0}],
                      wall_s=timeout_s + 3.0, limits=limits, iso=iso, load_time_limit=timeout_s)


def _execute(iso, limits, cpu_s, wall, payload, env, popen_kwargs, shared=0, notify=None,
             boot=False):
    """``shared``: how many suites may send reference outputs back (their own pipe), passed to
    ``notify`` once the driver's closing empty line arrived."""
    cap = limits.output_kb << 10
    sig_r, sig_w = os.pipe()
    ref_r, ref_w = os.pipe() if shared else (None, None)
    with tempfile.TemporaryFile() as stdin_file:  # unlinked: the token never has a path
        stdin_file.write(payload)
        stdin_file.seek(0)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(_command(iso, limits, cpu_s, sig_w, ref_w, boot), stdin=stdin_file,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=tuple(fd for fd in (sig_w, ref_w) if fd is not None),
                                    start_new_session=True, env=env, **popen_kwargs)
        except (OSError, subprocess.SubprocessError) as e:  # e.g. EAGAIN: uid's process budget
            for fd in (sig_r, ref_r):
                if fd is not None:
                    os.close(fd)
            return None, False, "", f"could not start the sandbox: {e}", "", "", 0.0
        finally:
            for fd in (sig_w, ref_w):
                if fd is not None:
                    os.close(fd)
    streams = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(),
               sig_r: bytearray(), **({ref_r: bytearray()} if shared else {})}
    keeps = {sig_r: 1 << 20, ref_r: shared * (REFERENCE_CAP + 64)}
    drained = dict.fromkeys(streams, 0)
    timed_out = False
    deadline = start + wall
    exited_at = None
    with selectors.DefaultSelector() as sel:
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = proc.poll() is None
                break
            if proc.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at > 1.0:  # a straggler holds the pipes open: stop listening
                    break
            for key, _ in sel.select(timeout=min(deadline - now, 0.2)):
                data = os.read(key.fd, 1 << 16)
                buf = streams[key.fd]
                if not data:
                    sel.unregister(key.fd)
                    continue
                drained[key.fd] += len(data)
                keep = keeps.get(key.fd, cap)
                if len(buf) < keep:
                    buf += data[: keep - len(buf)]
                if key.fd == ref_r and notify and (buf == b"\n" or buf.endswith(b"\n\n")):
                    notify(_references(buf.decode("ascii", "replace")))
                if drained[key.fd] > _DRAIN_LIMIT:
                    sel.unregister(key.fd)  # flooding: stop reading; its writes now fail
    _kill_group(proc)
    rc = proc.wait()
    for f in (proc.stdout, proc.stderr):
        f.close()
    text = [bytes(streams[fd]).decode("utf-8", "replace") for fd in streams]
    for fd in (sig_r, ref_r):
        if fd is not None:
            os.close(fd)
    elapsed = time.monotonic() - start
    return rc, timed_out, text[0], text[1], text[2], text[3] if shared else "", elapsed


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's process group. Under bwrap, killing the outer bwrap makes the
    namespace's init die (--die-with-parent), and the kernel then kills every process in it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _references(text: str) -> dict[str, str]:
    """Complete ``suite<TAB>base64`` lines of the reference pipe (a cut-off one is dropped);
    ``suite<TAB>`` (an empty text): the driver could not send that suite's outputs (too large,
    or not picklable)."""
    out = {}
    for line in text.split("\n")[:-1]:
        name, tab, blob = line.partition("\t")
        if name and tab:
            out[name] = blob
    return out


def _outcomes(suites: list[dict], sig: str, token: str, rc: int | None,
              timed_out: bool) -> dict[str, SuiteOutcome]:
    reported: dict[str, SuiteOutcome] = {}
    for line in sig.split("\n"):
        parts = line.split("\t", 3)
        if len(parts) == 4 and secrets.compare_digest(parts[0], token):
            reported[parts[1]] = SuiteOutcome(parts[2], parts[3])
    if timed_out:
        fallback = SuiteOutcome("timeout", "wall-clock limit; process group killed")
    elif rc == 0:
        fallback = SuiteOutcome("no-signal", "exited with status 0 before the tests completed")
    elif rc is not None and (rc in (-signal.SIGKILL, -signal.SIGXCPU)
                             or rc in (128 + signal.SIGKILL, 128 + signal.SIGXCPU)):
        fallback = SuiteOutcome("timeout", f"killed (status {rc}): CPU-time limit")
    else:
        fallback = SuiteOutcome("error", f"exited with status {rc} before the tests completed")
    out = {}
    for s in suites:
        got = reported.get(s["name"])
        out[s["name"]] = got if got and got.status in FINAL_STATUSES else fallback
    return out
