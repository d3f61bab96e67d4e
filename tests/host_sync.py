"""Counting host reads (device -> host synchronizations) on a CPU, and replaying captured steps.

On a GPU a host read waits for the device to finish everything queued: ``.item()``, ``int(t)``,
``bool(t)``, ``.tolist()``, ``.cpu()``, ``nonzero`` and boolean-mask indexing (whose result size
is data-dependent), and tensors built from host data (``torch.tensor``; a copy from pageable
memory). ``torch.cuda.set_sync_debug_mode`` catches them on a GPU (benchmarks/device_check.py
does); on a CPU nothing synchronizes, so ``HostReads`` finds the same calls at the level they
happen: the ATen operations a read dispatches (a ``TorchDispatchMode``) and the Python methods
that read without one (``tolist``, ``cpu``, ``numpy``, ``torch.tensor``).

``ReplayGraph`` stands in for a CUDA graph on a CPU (registered as ``dlmpipe.graphs.CAPTURE
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

from dlmpipe import registry

aten = torch.ops.aten
READ_OPS = {aten._local_scalar_dense, aten.is_nonzero, aten.nonzero, aten.masked_select,
            aten.equal, aten._unique2, aten.unique_consecutive, aten.unique_dim}
INDEX_OPS = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


def is_host_read(func, args) -> bool:
    if func.overloadpacket in READ_OPS:
        return True
    if func.overloadpacket in INDEX_OPS:  # a boolean mask index is a nonzero inside
        indices = args[1] if len(args) > 1 else []
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices if i is not None)
    return False


class HostReads(TorchDispatchMode):
    """Counts host reads while ``active`` (see the module docstring); ``where`` keeps a short
    stack of each, for the failure message."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.active = 0
        self.where: list[str] = []

    def record(self, what: str) -> None:
        if self.active:
            self.count += 1
            frames = [f for f in traceback.extract_stack() if "dlmpipe" in f.filename][-2:]
            self.where.append(f"{what} at " + " <- ".join(f"{f.filename.split('dlmpipe/')[-1]}:{f.lineno}"
                                                        for f in reversed(frames)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_host_read(func, args):
            self.record(str(func))
        return func(*args, **(kwargs or {}))

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
    """Decode with the real loop, counting host reads inside each step's seam calls;
    returns (result, reads per step)."""
    from dlmpipe.decode import decode

    steps: list[int] = []
    for obj, name in ((cache, "note_due_positions"), (sampler, "due_positions"),
                      (cache, "note_shadow_block"), (sampler, "shadow_block"),
                      (cache, "response_logits")):
        setattr(obj, name, counted(counter, getattr(obj, name)))
    inner = counted(counter, sampler.step)

    def step(x, logits):
        inner(x, logits)
        steps.append(counter.count - sum(steps))
    sampler.step = step
    out = decode(model, sampler, cache, prompt, gen_len, torch.Generator().manual_seed(0))
    return out, steps


def expected_reads(sampler: str, cache_id: str, n_steps: int) -> list[int]:
    _, first, later = CACHE_READS[cache_id]
    return [SAMPLER_READS[sampler] + (first if i == 0 else later) for i in range(n_steps)]


# ---- a CUDA graph's semantics on the CPU -----------------------------------------------------
class HostReadInCapture(RuntimeError):
    pass


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_host_read(func, args):
            raise HostReadInCapture(f"{func} inside a captured step (a host sync: a CUDA graph "
                                    f"capture fails on it)")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def replay_capture(fn, inputs, pool):
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
