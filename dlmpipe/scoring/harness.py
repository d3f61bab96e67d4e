"""The trusted driver that runs inside the sandbox: one candidate program, its test suites.

The host never imports this module: ``sandbox.py`` reads its source, has the sandbox's
interpreter compile it once per process, and runs it as ``python -I -B -c <DRIVER_BOOT>
<signal_fd>`` inside the sandbox, its bytecode first on stdin, then the job (marshal
format 4: a per-run random ``token``, the ``program``, the ``suites`` with their tuples, sets
and complex numbers, and the resource ``limits``). It uses the standard library only and runs on
any Python >= 3.8, because the sandboxed interpreter is the system's, not the project's. It
imports little (marshal, not json; ``_signal``, not ``signal``: both would load ``enum``, and
``json`` also ``re``): every sandbox starts the interpreter and this driver afresh.

Why a token: a program that calls ``exit(0)`` / ``os._exit(0)`` before its asserts, or patches
``AssertionError`` or builtins, fools any scorer that trusts the exit status. Here a suite counts
as passed only when this driver writes ``token<TAB>suite<TAB>passed`` to the signal pipe after
the suite's code ran to completion. The token arrives on stdin, which is read and replaced by
/dev/null before any untrusted code runs; every function and class the driver needs afterwards
is bound beforehand, the driver and the test code resolve builtins in private copies (patching
``builtins`` steers only the program itself), and test code does not see program globals that
shadow builtins. The program still shares this interpreter with its tests, so code written to
dig the token out of this driver's frames, to patch stdlib modules the tests use, or to return
objects whose ``==`` always holds could forge a pass (as with every in-process test runner); the
sandbox contains what such code can do, it does not make it score.

Suite formats (``format`` key):
- ``assert``: exec the program, then the test code with the program's functions and classes
  in scope (the test code calls ``check(entry_point)`` itself where the benchmark defines it).
- ``evalplus``: differential testing as EvalPlus does it: the reference solution's outputs on
  ``inputs`` are computed *before* the program runs; the candidate must match them (``atol``,
  per-benchmark special oracles) within a per-input time limit derived from the reference time.
  A suite may carry them as ``expected`` (what an earlier run of this driver wrote, opaque to the
  host): then the reference does not run again. Freshly computed ones go, pickled as EvalPlus
  passes them to its workers, to the ``reference_fd`` pipe (argv[2]), closed before candidate
  code runs, so nothing the candidate does can reach what later samples are compared with; not
  those of a suite with ``share_reference`` false (an earlier run found them too large).
- ``stdin``: LiveCodeBench standard-input problems: the program runs once per case with the
  case's input on stdin; its stdout must match the expected output (whitespace/number tolerant).
- ``functional``: LiveCodeBench LeetCode-style problems: ``Solution().<entry_point>(*args)``
  with JSON-encoded arguments, one per line.
"""
import builtins as _builtins_module

_PRISTINE = dict(_builtins_module.__dict__)
# Functions defined below resolve builtins here, not in the module the program can patch.
__builtins__ = dict(_PRISTINE)

import io  # noqa: E402
import marshal  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

try:
    import _signal as signal  # the functions and numbers without signal.py's enums
except ImportError:  # not CPython
    import signal

# decimal (stdin suites), json (functional suites), copy, the pickler and binascii
# (differential suites) are imported only where a suite needs them, always before candidate code
# runs.


class _Tools:
    """Everything the driver calls after candidate code has run, bound before it runs."""

    def __init__(self):
        self.write, self.exit_now, self.open_fd = os.write, os._exit, os.open
        self.dup2, self.close, self.abspath, self.O_RDONLY = os.dup2, os.close, os.path.abspath, os.O_RDONLY
        self.monotonic, self.perf_counter = time.monotonic, time.perf_counter
        self.set_handler, self.setitimer = signal.signal, signal.setitimer
        self.SIGALRM, self.ITIMER_REAL = signal.SIGALRM, signal.ITIMER_REAL
        self.pow, self.sqrt = math.pow, math.sqrt
        self.TextIOWrapper, self.BufferedReader, self.FileIO = (io.TextIOWrapper, io.BufferedReader,
                                                                io.FileIO)
        self.settrace, self.setprofile = sys.settrace, sys.setprofile
        self.sys = sys


class _Timeout(BaseException):
    """Derives from BaseException so ``except Exception`` in candidate code cannot eat it."""


def _main():
    t = _Tools()
    signal_fd = int(sys.argv[1])
    job = marshal.loads(sys.stdin.buffer.read())
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    token = job.pop("token")
    formats = {s["format"] for s in job["suites"]}
    if "stdin" in formats:
        from decimal import Decimal, InvalidOperation
        t.Decimal, t.InvalidOperation = Decimal, InvalidOperation
    if "functional" in formats:
        import json
        t.json_loads = json.loads
    if "evalplus" in formats:
        import copy  # ~1 ms of every other sandbox's start-up (types, weakref)
        t.deepcopy = copy.deepcopy
    _apply_limits(job.get("limits") or {})
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(50000)  # EvalPlus's setting: big-int outputs stay comparable
    t.write(signal_fd, ("%s\t*\tready\t\n" % token).encode())  # the sandbox started

    def emit(suite, status, detail=""):
        detail = str(detail).replace("\t", " ").replace("\n", " ")[:300]
        t.write(signal_fd, ("%s\t%s\t%s\t%s\n" % (token, suite, status, detail)).encode())

    def on_alarm(signum, frame):
        raise _Timeout("time limit")

    def arm(seconds):
        t.set_handler(t.SIGALRM, on_alarm)
        t.setitimer(t.ITIMER_REAL, max(seconds, 0.001))

    def disarm():
        t.setitimer(t.ITIMER_REAL, 0)

    t.arm, t.disarm = arm, disarm
    suites, program = job["suites"], job["program"]
    out_cap = int(job.get("output_cap", 1 << 16))
    real_stdout, real_stderr = sys.stdout, sys.stderr
    sink_out, sink_err = _Sink(out_cap), _Sink(out_cap)

    # 1. Reference outputs first, while no candidate code has run.
    references, fresh = {}, []
    for suite in suites:
        if suite["format"] == "evalplus":
            references[suite["name"]] = _given_reference(suite)
            if references[suite["name"]] is not None:
                continue
            try:
                references[suite["name"]] = _reference_outputs(suite, t)
                if suite.get("share_reference", True):  # False: an earlier run could not send it
                    fresh.append(suite["name"])
            except BaseException as e:
                references[suite["name"]] = e
    if len(sys.argv) > 2:
        _share_references(int(sys.argv[2]), {n: references[n] for n in fresh},
                          int(job.get("reference_cap", 16 << 20)))

    # 2. The candidate program, once, for every suite that calls into it.
    namespace = {"__name__": "__candidate__", "__builtins__": _builtins_module}
    program_error = None
    if any(s["format"] != "stdin" for s in suites):
        sys.stdout, sys.stderr = sink_out, sink_err
        try:
            arm(float(job.get("load_time_limit", 10.0)))
            exec(compile(program, "<program>", "exec"), namespace)
            disarm()
        except BaseException as e:
            disarm()
            program_error = _describe(e)
        t.sys.stdout, t.sys.stderr = real_stdout, real_stderr

    # 3. The suites, each ended by an explicit signal.
    for suite in suites:
        name = suite["name"]
        emit(name, "started")
        if program_error is not None and suite["format"] != "stdin":
            emit(name, program_error[0], "program: " + program_error[1])
            continue
        ref = references.get(name)
        if isinstance(ref, BaseException):
            emit(name, "error", "reference solution failed: %r" % (ref,))
            continue
        t.settrace(None)
        t.setprofile(None)
        t.sys.stdout, t.sys.stderr = sink_out, sink_err
        try:
            status, detail = _run_suite(suite, program, namespace, ref, t)
        except BaseException as e:
            disarm()
            status, detail = _describe(e)
        t.sys.stdout, t.sys.stderr = real_stdout, real_stderr
        emit(name, status, detail)

    for fd, sink in ((1, sink_out), (2, sink_err)):
        try:
            t.write(fd, sink.getvalue().encode("utf-8", "replace"))
        except BaseException:
            pass
    t.exit_now(0)


def _describe(e):
    if isinstance(e, _Timeout):
        return "timeout", "time limit exceeded"
    if isinstance(e, SystemExit):
        return "failed", "SystemExit(%r) before the tests completed" % (e.code,)
    try:
        name, msg = type(e).__name__, str(e)
    except BaseException:
        name, msg = "exception", ""
    return "failed", "%s: %s" % (name, msg) if msg else name


def _apply_limits(limits):
    names = {"as": "RLIMIT_AS", "cpu": "RLIMIT_CPU", "fsize": "RLIMIT_FSIZE",
             "nproc": "RLIMIT_NPROC", "core": "RLIMIT_CORE", "nofile": "RLIMIT_NOFILE"}
    for key, value in limits.items():
        rlimit = getattr(resource, names.get(key, ""), None)
        if rlimit is None or value is None:
            continue
        soft, hard = resource.getrlimit(rlimit)
        value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        try:
            resource.setrlimit(rlimit, (value, value))
        except (ValueError, OSError):
            pass


class _Sink:
    """A capped text stream standing in for stdout/stderr (``.buffer`` for byte writers)."""

    def __init__(self, cap):
        self.parts, self.size, self.cap = [], 0, cap
        self.buffer = _ByteSink(self)

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        if self.size < self.cap:
            self.parts.append(text[: self.cap - self.size])
        self.size += len(text)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    @property
    def overflowed(self):
        return self.size > self.cap

    def getvalue(self):
        return "".join(self.parts)


class _ByteSink:
    def __init__(self, text_sink):
        self.text_sink = text_sink

    def write(self, data):
        self.text_sink.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self):
        pass


def _pickler():
    """The C pickler, which CPython's ``pickle`` re-exports (``pickle.Pickler``/``loads`` are
    ``_pickle``'s), without pickle.py, which imports ``re`` and so ``enum``; base64.py does too,
    and ``binascii`` is what it calls. Together ~6 ms of CPU in every differential sample's
    sandbox (whose candidate does not import ``re`` itself), for the same bytes."""
    try:
        import _pickle as pickle
    except ImportError:  # not CPython
        import pickle
    return pickle


def _given_reference(suite):
    """(outputs, times) an earlier run computed for this suite, or None to compute them."""
    try:
        if suite.get("expected"):
            import binascii
            return _pickler().loads(binascii.a2b_base64(suite["expected"]))
        return None
    except Exception:
        return None


class _CappedBytes:
    def __init__(self, cap):
        self.parts, self.size, self.cap = [], 0, cap

    def write(self, data):
        self.size += len(data)
        if self.size > self.cap:
            raise ValueError("reference outputs larger than the cap")
        self.parts.append(bytes(data))
        return len(data)


def _share_references(fd, fresh, cap):
    """One ``name<TAB>base64 pickle`` line per fresh reference and an empty line, then the pipe
    is closed: the candidate never holds it. A reference that cannot be pickled or exceeds
    ``cap`` gets ``name<TAB>`` (the next sample computes it again, and does not pickle it)."""
    import binascii

    pickle = _pickler()
    lines = []
    for name, ref in fresh.items():
        out = _CappedBytes(cap * 3 // 4 - 64)  # base64 makes 4 of 3
        try:
            pickle.Pickler(out, 4).dump(ref)  # stops at the cap: MBPP+ has a 1 GB reference
        except Exception:
            lines.append(b"%s\t\n" % name.encode())
            continue
        blob = binascii.b2a_base64(b"".join(out.parts), newline=False)  # base64.b64encode's
        lines.append(b"%s\t%s\n" % (name.encode(), blob))
    view = memoryview(b"".join(lines) + b"\n")
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass
    finally:
        os.close(fd)


def _reference_outputs(suite, t):
    namespace = {"__name__": "__reference__", "__builtins__": dict(_PRISTINE)}
    exec(compile(suite["reference"], "<reference>", "exec"), namespace)
    fn = namespace[suite["entry_point"]]
    not_none = suite.get("oracle") == "output_not_none"
    outputs, times = [], []
    for inp in suite["inputs"]:
        args = t.deepcopy(inp)
        start = t.perf_counter()
        t.arm(float(suite.get("reference_time_limit", 60.0)))
        out = fn(*args)
        t.disarm()
        times.append(t.perf_counter() - start)
        outputs.append(out is not None if not_none else out)
    return outputs, times


def _run_suite(suite, program, namespace, ref, t):
    fmt = suite["format"]
    limit = float(suite.get("time_limit", 30.0))
    if fmt == "assert":
        # the program's functions and classes, but neither its builtins nor names shadowing them
        test_ns = {k: v for k, v in namespace.items() if k not in _PRISTINE}
        entry = suite.get("entry_point")
        if entry and entry in namespace:  # e.g. MBPP's `sum`: the function under test wins
            test_ns[entry] = namespace[entry]
        test_ns.update(__name__="__test__", __builtins__=dict(_PRISTINE))
        t.arm(limit)
        exec(compile(suite["code"], "<test>", "exec"), test_ns)
        t.disarm()
        return "passed", ""
    if fmt == "evalplus":
        return _run_evalplus(suite, namespace, ref, t)
    if fmt == "functional":
        return _run_functional(suite, namespace, t, limit)
    if fmt == "stdin":
        return _run_stdin(suite, program, t, limit)
    return "error", "unknown suite format %r" % (fmt,)


def _floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(i, float) for i in x)


def _allclose(out, exp, atol, rtol=1e-07):
    """``numpy.allclose`` semantics for numbers and (nested) sequences of numbers."""
    if isinstance(exp, (list, tuple)):
        return (isinstance(out, (list, tuple)) and len(out) == len(exp)
                and all(_allclose(o, e, atol, rtol) for o, e in zip(out, exp)))
    numbers = (int, float, complex)
    if not isinstance(out, numbers) or not isinstance(exp, numbers):
        return False
    try:
        return abs(out - exp) <= atol + rtol * abs(exp)
    except (OverflowError, TypeError):
        return False


def _poly(xs, x, t):
    return sum(c * t.pow(x, i) for i, c in enumerate(xs))


def _surface_area(base_edge, height, t):
    slant = t.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 4 * (base_edge * slant) / 2)


def _digit_distance(a, b):
    sa, sb = str(a), str(b)
    n = max(len(sa), len(sb))
    return sum(abs(int(x) - int(y)) for x, y in zip(sa.zfill(n), sb.zfill(n)))


def _matches(suite, out, exp, inp, t):
    """EvalPlus's comparison, special oracles included (facts from evalplus 0.3)."""
    oracle = suite.get("oracle", "")
    atol = float(suite.get("atol", 0) or 0)
    if oracle == "find_zero":
        return abs(_poly(inp[0], out, t)) <= atol
    exact = out == exp
    if oracle == "always_true":
        exact = True
    elif oracle == "or_zero":
        exact = exact or out == 0
    elif oracle == "surface_area":
        exact = exact or abs(out - _surface_area(inp[0], inp[1], t)) <= atol
    elif oracle == "digit_distance":
        exact = exact or out == _digit_distance(*inp)
    elif oracle == "set_eq":
        exact = set(out) == set(exp)
    elif oracle == "output_not_none":
        exact = out == exp if isinstance(out, bool) else exp == (out is not None)
    if atol == 0 and _floats(exp):
        atol = 1e-6
    if not exact and atol != 0:
        return type(out) == type(exp) and _allclose(out, exp, atol)
    return bool(exact)


def _run_evalplus(suite, namespace, ref, t):
    expected, ref_times = ref
    fn = namespace.get(suite["entry_point"])
    if not callable(fn):
        return "failed", "entry point %r not defined" % (suite["entry_point"],)
    min_t, factor = float(suite.get("min_input_time", 4.0)), float(suite.get("time_factor", 4.0))
    # EvalPlus bounds a suite by the sum of its per-input limits; we bound it by the larger of the
    # suite limit and factor x the reference's total time (measured in a sandbox like this one,
    # here or, reused, in the process's first sample of the problem; EvalPlus measures once too).
    budget = max(float(suite.get("time_limit", 30.0)), factor * sum(ref_times) + min_t)
    deadline = t.monotonic() + budget
    inputs = suite["inputs"]
    for i, inp in enumerate(inputs):
        remaining = deadline - t.monotonic()
        if remaining <= 0:
            return "timeout", "suite time limit at input %d/%d" % (i, len(inputs))
        args = t.deepcopy(inp)
        t.arm(min(max(min_t, factor * ref_times[i]), remaining))
        out = fn(*args)
        t.disarm()
        if not _matches(suite, out, expected[i], inp, t):
            return "failed", "input %d/%d: wrong output" % (i, len(inputs))
    return "passed", "%d inputs" % len(inputs)


def _run_functional(suite, namespace, t, limit):
    solution = namespace.get("Solution")
    if solution is None:
        return "failed", "class Solution not defined"
    deadline = t.monotonic() + limit
    case_limit = float(suite.get("case_time_limit", 6.0))
    for i, case in enumerate(suite["cases"]):
        args = [t.json_loads(line) for line in case["input"].split("\n") if line.strip()]
        expected = t.json_loads(case["output"])
        remaining = deadline - t.monotonic()
        if remaining <= 0:
            return "timeout", "suite time limit at case %d" % i
        t.arm(min(case_limit, remaining))
        out = getattr(solution(), suite["entry_point"])(*args)
        t.disarm()
        if isinstance(out, tuple):
            out = list(out)
        if out != expected:
            return "failed", "case %d: wrong output" % i
    return "passed", "%d cases" % len(suite["cases"])


def _same_output(got, want, t):
    """LiveCodeBench-style: line-wise after stripping; numeric tokens compared as decimals."""
    g = [line.strip() for line in got.strip().splitlines()]
    w = [line.strip() for line in want.strip().splitlines()]
    if g == w:
        return True
    if len(g) != len(w):
        return False
    for gl, wl in zip(g, w):
        gt, wt = gl.split(), wl.split()
        if gt == wt:
            continue
        if len(gt) != len(wt):
            return False
        for a, b in zip(gt, wt):
            if a == b:
                continue
            try:
                if t.Decimal(a) != t.Decimal(b):
                    return False
            except (t.InvalidOperation, ValueError):
                return False
    return True


def _run_stdin(suite, program, t, limit):
    code = compile(program, "<program>", "exec")
    deadline = t.monotonic() + limit
    case_limit = float(suite.get("case_time_limit", 6.0))
    real_stdin, real_stdout = t.sys.stdin, t.sys.stdout
    for i, case in enumerate(suite["cases"]):
        remaining = deadline - t.monotonic()
        if remaining <= 0:
            return "timeout", "suite time limit at case %d" % i
        path = t.abspath(".case-input")
        with open(path, "w", encoding="utf-8") as f:
            f.write(case["input"])
        fd = t.open_fd(path, t.O_RDONLY)
        if fd != 0:  # fd 0 is free when the program closed it (e.g. via open(0))
            t.dup2(fd, 0)
            t.close(fd)
        sink = _Sink(int(suite.get("case_output_cap", 1 << 24)))
        t.sys.stdin = t.TextIOWrapper(t.BufferedReader(t.FileIO(0, closefd=False)), encoding="utf-8")
        t.sys.stdout = sink
        try:
            t.arm(min(case_limit, remaining))
            exec(code, {"__name__": "__main__", "__builtins__": _builtins_module})
        except SystemExit as e:
            if e.code not in (None, 0):
                t.disarm()
                return "failed", "case %d: exit status %r" % (i, e.code)
        finally:
            t.disarm()
            t.sys.stdin, t.sys.stdout = real_stdin, real_stdout
        if sink.overflowed or not _same_output(sink.getvalue(), case["output"], t):
            return "failed", "case %d: wrong output" % i
    return "passed", "%d cases" % len(suite["cases"])


if __name__ == "__main__":
    _main()
