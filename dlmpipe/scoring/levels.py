"""Which sandbox runs untrusted code: fail closed unless the user opts in to less.

``bwrap`` is the default and is required: where bubblewrap is missing or fails its self-check,
scoring stops before any candidate runs, with one message that names what is missing and both
ways out (install bubblewrap; or opt in to the weaker ``process`` level with the campaign's
``sandbox:`` key, ``--sandbox`` on ``dlmpipe score``/``score-samples``, or ``DLMPIPE_SANDBOX``)
and what that level does not protect. ``process`` carries every confinement layer this kernel
supports (confine.py) and records them in its name (``process+landlock+seccomp``); ``auto`` is an
opt-in to bwrap where it works and the process level where bwrap is missing or broken.

A level is checked once per process by running Python inside it (unprivileged uid, read-only
/usr, only ``lo`` for bwrap, each confinement layer's effect for the process level). A check
that did not start for a transient reason (EAGAIN: the sandbox uid's process budget still held
by a previous batch) is retried for up to ``START_RETRY_S``; it never falls back to a weaker
level, even under ``auto``. See docs/SCORING.md.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

from .confine import landlock_abi, layer_support
from .sandbox import (NOBODY, START_RETRY_S, Isolation, _clean_env, _is_root, _tool,
                      run_suites)

LEVELS = ("bwrap", "process", "auto")  # what a user may ask for; bwrap is the default
DEFAULT_LEVEL = "bwrap"
# start failures worth retrying: the uid's process budget or memory is momentarily exhausted
_TRANSIENT = ("Resource temporarily unavailable", "EAGAIN", "Cannot allocate memory")
INSTALL_BWRAP = ("sudo apt-get install bubblewrap (Debian/Ubuntu), sudo dnf install bubblewrap "
                 "(Fedora/RHEL)")


class SandboxUnavailable(RuntimeError):
    """No sandbox of the requested level can run Python here (nothing was run)."""


# What each level leaves open (the error message, score-samples and the report quote this)


def weaker_than_bwrap(level: str) -> bool:
    """Whether scores recorded with ``level`` ran with less isolation than bubblewrap."""
    return level not in ("bwrap", "none")


def level_caveats(level: str) -> str:
    """What a program can still reach under ``level``, one clause per gap (docs/SCORING.md)."""
    if not weaker_than_bwrap(level):
        return ""
    layers, abi = level.split("+")[1:], landlock_abi()
    gaps = ["it shares the host's kernel and PID namespace, and its scratch directory is on the "
            "host's disk (each file's size capped, not the total)"]
    if "landlock" in layers:
        gaps.append("it reads the same files as under bwrap (the system's /usr and libraries), "
                    "read-only")
        if 0 < abi < 6:
            gaps.append(f"signals reach other processes of its uid (Landlock ABI {abi} < 6 "
                        "cannot scope them)")
        elif abi == 0:  # described where the kernel that scored is not known
            gaps.append("signals reach other processes of its uid where the scoring kernel's "
                        "Landlock ABI is below 6")
    else:
        gaps.append("the host filesystem is readable, and writable wherever ordinary "
                    "permissions allow its uid")
        gaps.append("signals and ptrace reach other processes of its uid")
    if "seccomp" in layers:
        gaps.append("named UNIX sockets its uid may write stay reachable")
    else:
        if "landlock" in layers and abi >= 4:
            gaps.append("non-TCP sockets (UDP, netlink, ...) stay usable" if abi < 10 else
                        "non-IP sockets (netlink, ...) stay usable")
        elif "landlock" in layers and abi == 0:
            gaps.append("the host's network is reachable (but TCP where the scoring kernel's "
                        "Landlock ABI is 4 or newer)")
        else:
            gaps.append("the host's network is reachable")
        gaps.append("a child that calls setsid() can outlive the wall-clock kill")
    return "; ".join(gaps)


# Choosing and checking the isolation level (once per process)


def _self_check(iso: Isolation) -> str:
    """What must hold inside the sandbox before any generated code runs in it."""
    lines = ["import os, socket, sys",
             "assert sys.version_info >= (3, 8), sys.version",
             "assert not os.access('/usr', os.W_OK), '/usr is writable'"]
    if _is_root():
        lines.append("assert os.getuid() != 0 and os.getgid() != 0, 'still root'")
    if iso.level == "bwrap":
        lines += ["names = [n for _, n in socket.if_nameindex()]",
                  "assert names == ['lo'], 'network interfaces visible: %s' % names"]
    if "landlock" in iso.layers:  # the parent of scratch is writable for us without Landlock
        lines += ["outside = os.path.dirname(os.getcwd())",
                  "probe = os.path.join(outside, '.dlmpipe-landlock-probe-%d' % os.getpid())",
                  "try:",
                  "    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))",
                  "    os.unlink(probe)",
                  "    raise AssertionError('landlock: created a file outside scratch')",
                  "except PermissionError:",
                  "    pass",
                  "try:",
                  "    os.listdir(outside)",
                  "    raise AssertionError('landlock: listed a directory outside the view')",
                  "except PermissionError:",
                  "    pass"]
    if "seccomp" in iso.layers:
        lines += ["try:",
                  "    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()",
                  "    raise AssertionError('seccomp: opened an AF_INET socket')",
                  "except PermissionError:",
                  "    pass"]
    return "\n".join(lines) + "\n"


_lock = threading.Lock()
_cache: dict[tuple, Isolation] = {}


def _python_candidates() -> list[str]:
    forced = os.environ.get("DLMPIPE_SANDBOX_PYTHON")
    if forced:
        return [forced]
    seen, out = set(), []
    for p in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3"),
              shutil.which("python")):
        if p and os.access(p, os.X_OK) and os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            out.append(p)
    return out


_probed: dict[str, list] = {}  # interpreter -> its prefixes, once it answered


def _interpreter_paths(python: str) -> tuple[str, ...]:
    """Directories the interpreter needs that /usr does not cover (a conda or /opt install).
    Asked once per process and interpreter (a pyenv shim takes ~0.1 s CPU to answer); a probe
    that failed is asked again next time."""
    probe = ("import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, "
             "sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]))")
    dirs = _probed.get(python)
    if dirs is None:
        try:
            out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True,
                                 timeout=30, env=_clean_env("/tmp")).stdout
            dirs = json.loads(out)
        except (OSError, ValueError, subprocess.SubprocessError):
            return ()
        _probed[python] = dirs
    keep = []
    for d in dirs:
        d = os.path.realpath(d)
        if d.startswith("/usr/") or d == "/usr" or d in keep:
            continue
        if d.rstrip("/").endswith("/bin"):
            d = os.path.dirname(d)
        keep.append(d)
    return tuple(sorted(set(keep)))


def requested_level(level: str | None = None) -> str:
    """The level asked for: ``level``, else ``$DLMPIPE_SANDBOX``, else bwrap (the default)."""
    level = level or os.environ.get("DLMPIPE_SANDBOX") or DEFAULT_LEVEL
    if level not in LEVELS:
        raise ValueError(f"sandbox must be one of {', '.join(LEVELS)} (DLMPIPE_SANDBOX, "
                         f"--sandbox, or the campaign's `sandbox:` key), not {level!r}")
    return level


def isolation(level: str | None = None) -> Isolation:
    """The sandbox this process uses, chosen once and checked by running Python inside it.

    ``level`` (default: ``requested_level()``): ``bwrap`` requires bubblewrap and raises
    ``SandboxUnavailable`` where it cannot work; ``process`` is the weaker opt-in level, with
    every confinement layer this kernel supports; ``auto`` is an opt-in to bwrap where it works
    and the process level where bwrap is missing or permanently broken.
    """
    level = requested_level(level)
    key = (level, _tool("bwrap"), os.environ.get("DLMPIPE_SANDBOX_PYTHON"))
    with _lock:
        if key not in _cache:
            _cache[key] = _choose(level)
        return _cache[key]


def _process_layers() -> tuple[str, ...]:
    support = layer_support()
    return tuple(layer for layer, reason in support.items() if not reason)


def _candidates(variant: str) -> Iterator[Isolation]:
    """The variant with each interpreter in turn, made (its paths probed) only when the one
    before failed its check: where the first works, the others are never started."""
    layers = _process_layers() if variant == "process" else ()
    level = "+".join(("process", *layers)) if variant == "process" else "bwrap"
    for python in _python_candidates():
        yield Isolation(level, variant, python, _interpreter_paths(python), layers)


def _check(iso: Isolation, retry_s: float) -> tuple[bool, str, bool]:
    """Run the self-check: (passed, what went wrong, whether the failure looked transient).
    A check that did not start for a transient reason is retried for ``retry_s`` seconds."""
    give_up, attempt = time.monotonic() + retry_s, 0
    while True:
        result = run_suites(_self_check(iso), [{"name": "check", "format": "assert",
                                                "code": "pass"}],
                            wall_s=30, iso=iso, start_retry_s=0)
        if result.passed:
            return True, "", False
        outcome = result.suites["check"]
        error = f"{outcome.status}: {outcome.detail} {result.stderr.strip()[-300:]}".strip()
        transient = outcome.detail.startswith("sandbox did not start") and any(
            t in error for t in _TRANSIENT)
        if not transient or time.monotonic() > give_up:
            return False, error, transient
        attempt += 1
        time.sleep(min(0.25 * 2 ** attempt, 5.0))


def _choose(level: str) -> Isolation:
    errors, transient = [], False
    if level in ("bwrap", "auto"):
        if _tool("bwrap"):
            for variant in ["userns"] + (["rootns"] if _is_root() else []):
                for iso in _candidates(variant):
                    ok, error, was_transient = _check(iso, START_RETRY_S)
                    if ok:
                        return iso
                    transient |= was_transient
                    errors.append(f"bwrap ({variant}) with {iso.python}: {error}")
        else:
            errors.append("bubblewrap (bwrap) is not installed"
                          + (f" (DLMPIPE_BWRAP={os.environ['DLMPIPE_BWRAP']!r})"
                             if "DLMPIPE_BWRAP" in os.environ else ""))
    if level == "process" or (level == "auto" and not transient):
        for iso in _candidates("process"):
            ok, error, was_transient = _check(iso, START_RETRY_S)
            if ok:
                return iso
            errors.append(f"{iso.level} with {iso.python}: {error}")
    raise SandboxUnavailable(_unavailable_message(level, errors, transient))


def _unavailable_message(level: str, errors: list[str], transient: bool) -> str:
    tried = "; ".join(errors) or "no interpreter found to run inside the sandbox"
    if level == "process":
        return (f"the process sandbox (an explicit opt-in) does not work here, so nothing was "
                f"run: {tried}")
    if transient:
        return (f"the bubblewrap sandbox failed its self-check for {START_RETRY_S:.0f} s with a "
                f"transient error (is another job's fork bomb still holding uid {NOBODY}'s "
                f"process budget?); nothing was run and nothing was downgraded. Rerun "
                f"later. Details: {tried}")
    layers = _process_layers()
    weaker = "+".join(("process", *layers))
    missing = {k: v for k, v in layer_support().items() if v}
    return (
        f"no sandbox for untrusted code: scoring requires bubblewrap (sandbox: {level}) and it "
        f"is not usable here ({tried}). Nothing was run. Two ways out:\n"
        f"  1. install bubblewrap: {INSTALL_BWRAP}; where it is installed but fails, "
        f"unprivileged user namespaces may be off (sysctl kernel.unprivileged_userns_clone=1, "
        f"user.max_user_namespaces > 0), or run as root.\n"
        f"  2. opt in to the weaker process isolation: `sandbox: process` in the campaign "
        f"config, `--sandbox process` on `dlmpipe score-samples` / `dlmpipe score`, or "
        f"DLMPIPE_SANDBOX=process in the environment. On this machine that level is {weaker}: "
        f"{level_caveats(weaker)}"
        + ("".join(f"; no {k}: {v}" for k, v in missing.items())) + ". See docs/SCORING.md.")
