"""Unprivileged confinement of the ``process`` sandbox: Landlock and seccomp-bpf layers.

Where bubblewrap cannot run (no bwrap, no user namespaces), the kernel still offers two
unprivileged ways for a process to restrict itself and everything it later executes:

``landlock`` (Linux >= 5.13, through the ``landlockpy`` binding): the filesystem becomes
read-only and shrinks to the same view bwrap gives (``/usr``, ``/bin``, ``/lib*``, the
interpreter's prefix, ``/etc/ld.so.cache``, a few ``/dev`` nodes); only the program's private
scratch directory is writable. Where the kernel's Landlock ABI has them, TCP bind/connect (ABI 4)
and UDP (ABI 10) are denied, and signals and abstract UNIX sockets are scoped to the sandbox's own
processes (ABI 6), so ``kill(-1)`` reaches no other process.

``seccomp`` (through ``pyseccomp``, libseccomp's API over ctypes; libseccomp writes the BPF): no
``socket()`` except ``AF_UNIX``, no ``io_uring`` (it opens sockets without ``socket()``), no
``ptrace``/``process_vm_*``, no ``mount``/``kexec``/module/namespace/keyring/``bpf``/
``perf_event_open`` calls, and no ``setsid``/``setpgid``: every process the program starts stays
in its process group, which the host kills at the end of each run.

Both are applied in the sandbox's child process after ``fork`` and before ``exec`` (Popen's
``preexec_fn``), so the trusted scorer itself is never restricted. The child only calls into
objects built beforehand in the parent (the Landlock ruleset's file descriptor, the libseccomp
filter context): no imports, no locks, no Python-level state another thread could hold.
See docs/SCORING.md for what each level still allows.
"""
from __future__ import annotations

import errno
import importlib
import os
import threading
from functools import lru_cache

LAYERS = ("landlock", "seccomp")

# Files (not directories) of /dev a program may use; /dev/null and /dev/full also for writing.
DEV_READ = ("/dev/zero", "/dev/random", "/dev/urandom")
DEV_WRITE = ("/dev/null", "/dev/full")

# Denied with EPERM: debugging other processes, kernel/administration interfaces, namespaces,
# and leaving the process group the host kills (setsid/setpgid).
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "swapon", "swapoff", "reboot", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "quotactl",
    "unshare", "setns", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key",
    "request_key", "open_by_handle_at", "name_to_handle_at", "fanotify_init", "iopl", "ioperm",
    "syslog", "io_uring_setup", "io_uring_enter", "io_uring_register", "setsid", "setpgid",
)
CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                    0x40000000, 0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
#                                               NEWNET, NEWTIME
AF_UNIX = 1

_lock = threading.Lock()


@lru_cache(maxsize=1)
def layer_support() -> dict[str, str]:
    """layer -> "" where it works on this kernel with the installed bindings, else why not."""
    return {"landlock": _landlock_support(), "seccomp": _seccomp_support()}


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is unavailable."""
    try:
        import landlockpy
    except ImportError:
        return 0
    return landlockpy.abi_version()


def _landlock_support() -> str:
    try:
        import landlockpy
    except ImportError as e:
        return f"the landlockpy package is not installed ({e})"
    try:
        landlockpy._syscall.abi_version()
    except landlockpy.LandlockError as e:
        if e.errno == errno.ENOSYS:
            return ("the kernel has no Landlock (ENOSYS: older than 5.13, built without "
                    "CONFIG_SECURITY_LANDLOCK, or a container's seccomp profile hides it)")
        if e.errno == errno.EOPNOTSUPP:
            return ("Landlock is disabled at boot (EOPNOTSUPP: add 'landlock' to the kernel's "
                    "lsm= parameter)")
        return f"Landlock is unusable: {e}"
    return ""


def _seccomp_support() -> str:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            if not any(line.startswith("Seccomp:") for line in f):
                return "the kernel has no seccomp (built without CONFIG_SECCOMP)"
    except OSError as e:
        return f"cannot read /proc/self/status: {e}"
    try:
        importlib.import_module("pyseccomp")  # loads libseccomp
    except ImportError as e:
        return f"the pyseccomp package is not installed ({e})"
    except (RuntimeError, OSError) as e:
        return f"libseccomp is not installed (e.g. apt-get install libseccomp2): {e}"
    return ""


@lru_cache(maxsize=1)
def _seccomp_filter():
    """The libseccomp filter context, built once; each sandbox child loads it."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    f.add_rule(sc.ERRNO(errno.EACCES), "socket", sc.Arg(0, sc.NE, AF_UNIX))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # flags unreadable: libc falls back to clone
    for flag in CLONE_NAMESPACES:
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for name in DENIED_SYSCALLS:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:  # negative: not on this arch
            f.add_rule(sc.ERRNO(errno.EPERM), name)
    return f


def _landlock_ruleset(read_paths: list[str], scratch: str):
    """A ruleset granting read (and execute) under ``read_paths``, everything in ``scratch``,
    and nothing else; handling every right this kernel's ABI knows, TCP/UDP included."""
    import landlockpy as ll

    abi = ll.abi_version()
    ruleset = ll.Ruleset(handled_fs=ll.fs_for_abi(abi), handled_net=ll.net_for_abi(abi),
                         scoped=ll.scope_for_abi(abi))
    try:
        file_read = ll.AccessFS.READ_FILE | ll.AccessFS.EXECUTE
        for path in read_paths:
            if os.path.isdir(path):
                ruleset.allow_path(path, file_read | ll.AccessFS.READ_DIR)
            elif os.path.exists(path):
                ruleset.allow_path(path, file_read)
        for path in DEV_READ:
            if os.path.exists(path):
                ruleset.allow_path(path, ll.AccessFS.READ_FILE)
        for path in DEV_WRITE:
            if os.path.exists(path):
                ruleset.allow_path(path, ll.AccessFS.READ_FILE | ll.AccessFS.WRITE_FILE
                                   | ll.AccessFS.TRUNCATE)
        ruleset.allow_path(scratch, ll.fs_for_abi(abi))
    except BaseException:
        ruleset.close()
        raise
    return ruleset


class Confinement:
    """The layers for one sandbox run: built in the parent, applied by ``apply`` in the child."""

    def __init__(self, layers: tuple[str, ...], read_paths: list[str], scratch: str):
        unknown = set(layers) - set(LAYERS)
        if unknown:
            raise ValueError(f"unknown confinement layer(s) {sorted(unknown)}")
        self.ruleset = _landlock_ruleset(read_paths, scratch) if "landlock" in layers else None
        with _lock:
            self.filter = _seccomp_filter() if "seccomp" in layers else None

    def apply(self) -> None:
        """Runs in the forked child (``preexec_fn``): restrict it, then Popen execs."""
        if self.ruleset is not None:
            self.ruleset.restrict()  # sets no_new_privs first
        if self.filter is not None:
            self.filter.load()

    def close(self) -> None:
        if self.ruleset is not None:
            self.ruleset.close()
