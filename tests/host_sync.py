"""Counting host reads (device -> host synchronizations) on a CPU, and replaying captured steps.

On a GPU a host read waits for the device to finish everything queued;
``torch.cuda.set_sync_debug_mode`` catches them there (benchmarks/device_parts.py, part 4). On a
CPU nothing synchronizes, so ``HostReads`` finds the same calls at the level they happen (a
``TorchDispatchMode`` over the ATen operations, and the Python methods that read without one).
The rule, every case of which waits for the device on CUDA:

1. A scalar read: an ATen operation tagged ``data_dependent_output`` (``item``,
   ``_local_scalar_dense``: ``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``if t``) or one
   that compares on the host (``is_nonzero``, ``equal``, ``allclose``); a kernel that checks its
   argument on the host (``multinomial``: two reads when it draws one sample or any without
   replacement); and the Python methods that copy to host memory without an ATen operation
   here: ``tolist``, ``cpu``, ``numpy``.
2. A size that depends on the data: an operation tagged ``dynamic_output_shape`` (``nonzero``,
   ``torch.where(c)`` with one argument, ``argwhere``, ``masked_select``, ``unique``,
   ``bincount``, ``repeat_interleave`` without ``output_size``), and boolean-mask indexing
   ``t[mask]`` and ``t[mask] = v`` (a ``nonzero`` inside; counted even where CUDA's
   ``index_put_`` would turn a scalar ``v`` into ``masked_fill``: write that). Indexing with
   integer tensors has a fixed size and is free (``aten.index`` is tagged for its boolean case).
3. A host value copied to the device: ``torch.tensor``/``torch.as_tensor`` (host data), and a
   Python value or list assigned or indexed through ``[]``: ``t[i] = 1.0`` on a 1-d ``t``,
   ``t[idx] = True``, ``t[[1, 2]]`` build the value in pageable host memory (``aten.lift_fresh``
   here; PyTorch keeps it there for a CUDA ``t``) and copy it over synchronously (``copy_``,
   ``index_put_``, ``index``). A scalar passed as a kernel argument is free: ``t[a:b] = 1.0`` and
   ``t[i] = 1.0`` on a 2-d ``t`` (``fill_``), ``masked_fill``, ``index_fill``, ``scatter``,
   ``torch.where(c, t, 0.0)``; so is a tensor already on the device (``t[i] = u[j]``).

Not seen here: ``.to("cpu")`` (on a CPU the same as ``.to(device)``; write ``.cpu()``), other
kernels' host-side checks (``torch.linalg``'s error checks: none runs in a step) and an explicit
``torch.cuda.synchronize``. Counted here though free on CUDA: rule 3 on a tensor a step keeps on
the CPU on purpose (here every tensor is), and rule 2's ``t[mask] = scalar``.
``per_step_reads`` counts the whole of each update (``Decoding.step``: the seams and the loop's
own code between them).

``replay_capture`` stands in for a CUDA graph on a CPU (registered as ``dlmpipe.graphs.CAPTURE
["cpu"]`` by the tests): it records the ATen operations of one call with the very tensors they
ran on and replays them on the same tensors, like a graph, so a step that reads state the
capture did not see (a tensor reallocated after it, a host value that changed) or reads
something back to the host fails as it would on a GPU.
"""
from __future__ import annotations

import contextlib
import traceback
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from dlmpipe import registry

aten = torch.ops.aten
#: rule 1 besides the tagged operations; ``multinomial`` checks its probabilities with two
#: scalar reads inside its kernel (drawing one sample, or any without replacement)
SCALAR_READS = {aten.is_nonzero, aten.equal, aten.allclose}
KERNEL_READS = {aten.multinomial.default: 2}
#: rule 2 besides the tagged operations: what inference mode (the decode loop's) passes to a
#: dispatch mode undecomposed; ``repeat_interleave`` is free given ``output_size``
SIZED_BY_DATA = {aten.where.default, aten.nonzero_numpy.default}
REPEATS = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
INDEX_WRITES = {aten.index_put, aten.index_put_, aten._index_put_impl_}
#: rule 3: what builds a tensor from a host value, and what copies such a tensor to the device
HOST_BUILT = {aten.lift_fresh, aten.lift_fresh_copy}
HOST_COPIES = {aten.copy_, aten._to_copy, aten.index, *INDEX_WRITES}


def _masks(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


#: id(operation) -> (operation, kind): looked up on every operation a counted decode dispatches,
#: so by ``id`` (an ``OpOverload``'s ``__hash__`` is Python code, a third of a dict lookup's cost
#: through a cache keyed by the operation); the operation is kept, so its id is never reused
_KINDS: dict[int, tuple] = {}


def kind(func) -> str | None:
    """Which rule can apply to an ATen operation (fixed per operation, so looked up once): "read"
    (always one), "kernel" (``KERNEL_READS``), "repeat", "index" (rule 2 with a boolean mask,
    rule 3 with a host-built index or value), "copy" (rule 3), "built" (makes a host-built
    tensor), or None."""
    hit = _KINDS.get(id(func))
    if hit is None:
        hit = _KINDS[id(func)] = (func, _kind(func))
    return hit[1]


def _kind(func) -> str | None:
    op = func.overloadpacket
    if func in KERNEL_READS:
        return "kernel"
    if op in SCALAR_READS or func in SIZED_BY_DATA or torch.Tag.data_dependent_output in func.tags:
        return "read"
    if op is aten.index or op in INDEX_WRITES:
        return "index"
    if func in REPEATS:
        return "repeat"
    if torch.Tag.dynamic_output_shape in func.tags:
        return "read"
    return "copy" if op in HOST_COPIES else "built" if op in HOST_BUILT else None


def reads_of(func, args, kwargs, host_built) -> int:
    """How many host reads one ATen call makes on CUDA (the module docstring's rules), given the
    tensors built from host values so far (``host_built``)."""
    k = kind(func)
    if k in (None, "built"):
        return 0
    if k == "read":
        return 1
    if k == "kernel":
        replacement = args[2] if len(args) > 2 else kwargs.get("replacement", False)
        return KERNEL_READS[func] if not replacement or args[1] == 1 else 0
    if k == "repeat":
        return int(kwargs.get("output_size") is None)
    if k == "index" and _masks(args[1]):
        return 1
    if not host_built:  # (no host-built tensor alive: nothing to look for in the arguments)
        return 0
    return int(any(isinstance(a, torch.Tensor) and a in host_built for a in tree_flatten((args, kwargs))[0]))


class HostReads(TorchDispatchMode):
    """Counts host reads while ``active`` (see the module docstring); ``where`` keeps a short
    stack of each, for the failure message."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: no ``torch._dynamo.disable`` wrapper around each ATen operation (half the
        counter's cost per operation); nothing compiles under the counter."""
        return False

    def __init__(self):
        super().__init__()
        self.count = 0
        self.active = 0
        self.where: list[str] = []
        self.host_built = WeakIdKeyDictionary()

    def record(self, what: str) -> None:
        if self.active:
            self.count += 1
            frames = [f for f in traceback.extract_stack() if "dlmpipe" in f.filename][-2:]
            self.where.append(f"{what} at " + " <- ".join(f"{f.filename.split('dlmpipe/')[-1]}:{f.lineno}"
                                                        for f in reversed(frames)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        k = None
        if self.active:
            hit = _KINDS.get(id(func))  # (kind's lookup inline: this runs for every operation)
            k = hit[1] if hit is not None else kind(func)
        if k is not None and k != "built":
            for _ in range(reads_of(func, args, kwargs, self.host_built)):
                self.record(str(func))
        out = func(*args, **kwargs)
        if k == "built":  # (inside a patched torch.tensor: counted there)
            self.host_built[out] = True
        return out

    @contextlib.contextmanager
    def paused(self):
        active, self.active = self.active, 0
        try:
            yield
        finally:
            self.active = active

    @contextlib.contextmanager
    def counting(self):
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


@contextlib.contextmanager
def host_reads(monkeypatch):
    """``HostReads`` active over the block, with the Python-level reads patched to count too
    (reads of inference tensors, as in the decode loop, do not reach a dispatch mode)."""
    counter = HostReads()

    def patch(owner, name: str) -> None:
        original = getattr(owner, name)

        def read(*a, **k):
            counter.record(f"{getattr(owner, '__name__', owner)}.{name}")
            with counter.paused():  # the same read is not counted again at the ATen level
                return original(*a, **k)
        monkeypatch.setattr(owner, name, read)

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        patch(torch.Tensor, name)
    for name in ("tensor", "as_tensor"):
        patch(torch, name)
    with counter:
        yield counter


def counted(counter: HostReads, fn):
    """``fn`` with counting switched on while it runs."""
    def wrapper(*args, **kwargs):
        with counter.counting():
            return fn(*args, **kwargs)
    return wrapper


class CudaSyncs:
    """The same count on a GPU: ``torch.cuda.set_sync_debug_mode("warn")`` while counting, one
    warning per synchronizing CUDA call."""

    def __init__(self):
        self.count = 0
        self.where: list[str] = []

    @contextlib.contextmanager
    def counting(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        self.count += len(syncs)
        self.where += [f"{w.filename.split('dlmpipe/')[-1]}:{w.lineno}" for w in syncs]


#: host reads per step each sampler's decision needs (the budget the tests and the device check
#: hold every sampler to), the sampler specs they are checked with, and per cache setting the
#: reads its decision needs at the first step and at every later one: each entry's
#: ``host_sync`` (dlmpipe/registry/), so a new method is held to its own budget here
SAMPLER_READS = {n: c.host_sync[0] for n, c in registry.SAMPLERS.items()}
SAMPLER_SPECS = {n: {"name": n, **c.host_sync[1]} for n, c in registry.SAMPLERS.items()}
CACHE_READS = {label: ({"name": n, **params}, first, later)
               for n, c in registry.CACHES.items()
               for label, (params, first, later) in c.host_sync.items()}


def per_step_reads(counter, model, sampler, cache, prompt, gen_len: int = 16):
    """Decode with the real loop's state (``Decoding``), counting host reads inside each whole
    update (the seams and the loop's code between them); returns (response, reads per step).
    The model runs the plain ops a GPU runs (``rowwise.plain_ops``, as ``launches_per_call``):
    the CPU's row-invariant path exists only on the CPU and reads nothing back, but chunks and
    pads every product, several times the operations for the counter to dispatch (a decode under
    it cost 1.7x the plain ops'; issue 46)."""
    from dlmpipe.backbones import rowwise
    from dlmpipe.decode import Decoding

    steps: list[int] = []
    with torch.inference_mode(), rowwise.plain_ops():
        run = Decoding(model, sampler, cache, prompt, gen_len, torch.Generator().manual_seed(0))
        while not run.done:
            before = counter.count
            with counter.counting():
                run.step()
            steps.append(counter.count - before)
    return run.response, steps


def expected_reads(sampler: str, cache_id: str, n_steps: int) -> list[int]:
    _, first, later = CACHE_READS[cache_id]
    return [SAMPLER_READS[sampler] + (first if i == 0 else later) for i in range(n_steps)]


# ---- a CUDA graph's semantics on the CPU -----------------------------------------------------
class HostReadInCapture(RuntimeError):
    pass


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False, as ``HostReads``: no ``torch._dynamo.disable`` wrapper around each operation,
        whose first use imports torch._dynamo (~3 CPU s of a process that compiles nothing)."""
        return False

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.host_built = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kind(func) and reads_of(func, args, kwargs, self.host_built):
            raise HostReadInCapture(f"{func} inside a captured step (a host sync: a CUDA graph "
                                    f"capture fails on it)")
        out = func(*args, **kwargs)
        if kind(func) == "built":
            self.host_built[out] = True
        self.ops.append((func, args, kwargs, out))
        return out


def replay_capture(fn, inputs):
    """``dlmpipe.graphs.CAPTURE`` entry for the CPU: record one call, replay it on the same
    tensors. Each replayed operation writes its result into the tensor the recorded one returned,
    so later operations read the new values, as a graph's kernels read the same buffers."""
    recorder = _Recorder()
    with recorder:
        out = fn(*inputs)

    def replay() -> None:
        for func, args, kwargs, recorded in recorder.ops:
            fresh = func(*args, **kwargs)
            old, _ = tree_flatten(recorded)
            new, _ = tree_flatten(fresh)
            for o, n in zip(old, new):
                if isinstance(o, torch.Tensor) and o is not n:
                    o.copy_(n)
    return replay, out


# ---- kernel launches of a step, counted on the CPU --------------------------------------------
#: operations that launch no kernel on CUDA: allocations (views are skipped by ``is_view``)
NO_KERNEL = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
             aten.new_empty.default, aten.new_empty_strided.default}
_NO_KERNEL_IDS = {id(func) for func in NO_KERNEL}  # (NO_KERNEL keeps them: ids never reused)


class Launches(TorchDispatchMode):
    """Counts the ATen operations that would each launch a kernel on CUDA: every dispatched
    operation but views and allocations (an operation that may alias, such as ``to``, counts
    when it copied). A stand-in for the kernels an eager step launches (one
    operation may launch more than one kernel there, SDPA's for instance): what the launch
    budgets of ``dlmpipe.graphs.LAUNCHES`` are stated in. ``ops`` counts them by operation, for
    the failure message. Operations are told apart by ``id`` and named only for ``ops`` (an
    ``OpOverload``'s ``__hash__`` and ``__str__`` are Python code, run for every operation of a
    32-layer step otherwise; issue 46)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False, as ``HostReads``: no ``torch._dynamo.disable`` wrapper around each operation."""
        return False

    def __init__(self):
        super().__init__()
        self.count = 0
        self._by_op: dict[int, list] = {}  # id(operation) -> [operation, launches]

    @property
    def ops(self) -> dict[str, int]:
        return {str(func): n for func, n in self._by_op.values()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if id(func) in _NO_KERNEL_IDS or func.is_view and _aliases(out, args):
            return out
        self.count += 1
        hit = self._by_op.get(id(func))
        if hit is None:
            hit = self._by_op[id(func)] = [func, 0]
        hit[1] += 1
        return out


def _aliases(out, args) -> bool:
    """Whether a view operation returned a view (``to``, ``reshape``, ``contiguous`` are tagged
    as views but copy when they must: a dtype change, a strided input)."""
    first = args[0] if args else None
    return (isinstance(out, torch.Tensor) and isinstance(first, torch.Tensor)
            and out.untyped_storage().data_ptr() == first.untyped_storage().data_ptr())


def launches_per_call(model, sampler, cache, prompt, gen_len: int = 8,
                      max_cached: int = 6) -> list[tuple[bool, int]]:
    """Decode with the real loop, counting the launches of each ``response_logits`` call with the
    plain ops a GPU runs (``rowwise.plain_ops``: the CPU's row-invariant path splits products into
    chunks, which a GPU does not); returns ``(cached, launches)`` per call, ``cached`` when the
    call took the cache's cached path (``stats.cached_forwards`` grew), always for the full
    recompute (which has no other). Stops after ``max_cached`` cached calls."""
    from dlmpipe.backbones import rowwise
    from dlmpipe.decode import Decoding

    calls: list[tuple[bool, int]] = []
    original = cache.response_logits

    def counted_call(x, block):
        before = cache.stats.cached_forwards
        with Launches() as launches:
            out = original(x, block)
        full_only = type(cache).__name__ == "FullRecompute"
        calls.append((full_only or cache.stats.cached_forwards > before, launches.count))
        return out

    cache.response_logits = counted_call
    with torch.inference_mode(), rowwise.plain_ops():
        run = Decoding(model, sampler, cache, prompt, gen_len, torch.Generator().manual_seed(0))
        while not run.done and sum(c for c, _ in calls) < max_cached:
            run.step()
    return calls
