"""A local job server: a workflow's ``python -m dlmpipe`` jobs start without importing torch.

Why: on a CPU every job pays the interpreter start and ``import torch`` (about 1.2 s on a 2.6 GHz
Zen 5, several seconds on a 2 GHz Zen 1) before it decodes anything, and a toy campaign's jobs
decode for only a second or two each: start-up was a third of the default campaign's
job-seconds (docs/ARCHITECTURE.md, "Job start-up"). When Snakemake executes jobs on this machine,
the Snakefile's ``onstart`` starts one server, which imports torch and the job modules once and
waits; each job's ``python -m dlmpipe <command>`` (the client) hands its arguments, working
directory, environment and standard streams to the server, which forks a child that runs the
command exactly as a fresh process would (same code path, the client's environment and thread
count) and reports its exit status, which the client exits with.

What a job keeps:
- its output, log and exit status (a child killed by signal N makes the client die by N);
- being killable: a signal the client gets is forwarded to the child, and a client killed
  outright (SIGKILL) is noticed by the child at once (its socket closes) and the child kills
  itself, so a killed job stops decoding as it would have alone;
- its thread count (``OMP_NUM_THREADS`` of the job, Snakemake's ``threads``).
Not served: jobs on a cluster (``onstart`` starts no server unless jobs run locally; a client
that cannot reach the server runs the command itself), dry runs, and any run where
``DLMPIPE_JOB_SERVER=0``. The server's socket lives in a fresh 0700 directory (only this user
can connect) and the server exits when Snakemake does (its stdin, a pipe, closes).
Client side: the standard library only (it must start fast).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "DLMPIPE_JOB_SERVER"
#: the modules a served job would import first: loaded once by the server
PRELOAD = ("torch", "dlmpipe.cli", "dlmpipe.generate", "dlmpipe.timing")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2)


# ---- framing: 4-byte length + JSON ------------------------------------------------------------
def _send(sock: socket.socket, obj, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv(sock: socket.socket, with_fds: int = 0):
    fds: list[int] = []
    if with_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, 4, with_fds)
        if len(head) < 4:
            head += _recv_exact(sock, 4 - len(head))
    else:
        head = _recv_exact(sock, 4)
    (size,) = struct.unpack("!I", head)
    return json.loads(_recv_exact(sock, size)), fds


# ---- client ---------------------------------------------------------------------------------
def enabled() -> str | None:
    """The server's socket path this process was given, or None."""
    path = os.environ.get(ENV, "")
    return path if path and path != "0" else None


def run_served(path: str, argv: list[str]) -> int | None:
    """Run ``python -m dlmpipe <argv>`` in the server; its exit status (or this process dies by
    the child's signal). None when the server cannot be reached: the caller runs it itself."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    try:
        _send(sock, {"argv": argv, "argv0": sys.argv[0], "cwd": os.getcwd(),
                     "env": dict(os.environ)}, fds=[0, 1, 2])
        (hello, _) = _recv(sock)
    except (EOFError, OSError):  # the server went before forking: nothing ran
        sock.close()
        return None
    child = hello["pid"]

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    for sig in _FORWARDED:
        signal.signal(sig, forward)
    try:
        (status, _) = _recv(sock)
    except (EOFError, ConnectionError):
        print(f"dlmpipe: the job server ({path}) went away while running this job", file=sys.stderr)
        return 1
    if "signal" in status:  # die as the child died
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
        return 128 + status["signal"]
    return status["exit"]


# ---- server ---------------------------------------------------------------------------------
def start(workflow, source: str, checkpoints=()) -> subprocess.Popen | None:
    """From the Snakefile's ``onstart``: start a server for this run's local jobs and name it in
    this process's environment (its jobs inherit it); None where jobs are not served. ``source``:
    the checkout whose dlmpipe the jobs import (the Snakefile's folder); ``checkpoints``: the
    campaign's checkpoint directories, whose tokenizer classes the server imports too where
    transformers reads them (``serve``)."""
    if os.environ.get(ENV) == "0" or not workflow.local_exec or workflow.touch:
        return None
    directory = tempfile.mkdtemp(prefix="dlmpipe-jobs-")  # mode 0700
    path = os.path.join(directory, "socket")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [source] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    proc = subprocess.Popen([sys.executable, "-m", "dlmpipe.jobserver", path, *map(str, checkpoints)],
                            stdin=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)  # listening before the first job starts (it imports after that)
    if not os.path.exists(path):
        stop(proc)
        return None
    os.environ[ENV] = path
    return proc


def stop(proc: subprocess.Popen | None) -> None:
    """From ``onsuccess``/``onerror``: close the server's stdin (it exits) and forget it."""
    if proc is None:
        return
    os.environ.pop(ENV, None)
    if proc.stdin and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def serve(path: str, checkpoints=()) -> None:
    """Import the job modules, then fork a child per client until stdin closes. Where one of
    ``checkpoints`` is read by transformers (Dream's vocab.json + merges.txt: no tokenizer.json
    for the light tokenizer), its tokenizer class too (backbones/tokenizer.py ``preload_for``):
    else every model job on it imports transformers' model index itself (~1 CPU s)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as dlmpipe.cli.job_environment, before torch
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the jobs
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # first: a job that starts meanwhile waits for the imports, not runs alone
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    if checkpoints:
        from .backbones.tokenizer import preload_for

        preload_for(checkpoints)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    clients: dict[int, socket.socket] = {}  # child pid -> its client's connection
    served = 0
    try:
        while True:
            for key, _ in selector.select(timeout=0.01):
                if key.data == "stdin":
                    if not os.read(sys.stdin.fileno(), 4096):
                        print(f"dlmpipe job server: served {served} jobs", file=sys.stderr)
                        return
                else:
                    conn, _ = listener.accept()
                    pid = _fork_job(conn, listener)
                    if pid:
                        clients[pid] = conn
                        served += 1
            _reap(clients)
    finally:
        listener.close()
        Path(path).unlink(missing_ok=True)
        os.rmdir(os.path.dirname(path)) if not os.listdir(os.path.dirname(path)) else None


def _reap(clients: dict[int, socket.socket]) -> None:
    while clients:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is None:
            continue
        report = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                  else {"exit": os.WEXITSTATUS(status)})
        try:
            _send(conn, report)
        except OSError:
            pass  # the client is gone
        conn.close()


def _fork_job(conn: socket.socket, listener: socket.socket) -> int:
    try:
        request, fds = _recv(conn, with_fds=3)
    except (EOFError, OSError, ValueError):
        conn.close()
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        try:
            _send(conn, {"pid": pid})
        except OSError:
            pass
        return pid
    # the child: become the job, then exit without returning into the server's loop
    code = 1
    try:
        listener.close()
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[2], 2)
        for fd in fds:
            os.close(fd)
        code = _run_job(request, conn)
    finally:
        os._exit(code)


def _run_job(request: dict, conn: socket.socket) -> int:
    import random
    import threading
    import traceback

    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request.get("argv0", sys.argv[0])] + request["argv"]
    random.seed()  # a fresh process's own seed, not the server's state
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))

    def watch() -> None:  # the client died (its end closed): die with it, as a killed job does
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True).start()
    try:
        from .cli import main

        code = main(request["argv"])
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
