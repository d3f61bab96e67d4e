"""Running a fixed-shape step without per-kernel launch cost: CUDA graphs or torch.compile.

A cached step on a fast GPU is launch-bound: Archer's cached forward over G = 256 rows of a
32-layer model is ~1,500 small kernels, and launching them one by one from Python costs more
host time than the GPU spends on them (docs/ARCHITECTURE.md, performance shape); the sampler's
per-step scoring is a few more. The campaign key ``compile`` chooses how such steps run (Archer's
cached forward; the scoring step of LLaDA confidence, certainty prior and PC-Sampler; every
other step runs eagerly whatever the mode):

- ``none`` (default): eagerly, kernel by kernel.
- ``cuda_graphs``: the step is captured once as a CUDA graph for its shapes and then replayed,
  all kernels in one launch. The same kernels run on the same data, so results are bit for bit
  the eager ones. Needs a CUDA device.
- ``torch_compile``: ``torch.compile`` (Inductor; on CUDA ``mode="reduce-overhead"``, which also
  replays CUDA graphs). Fused kernels may round differently from eager ones, so logits can
  differ in the last bits and a token can differ where two candidates nearly tie.

A step is a function ``fn(*inputs)`` of tensors returning a tensor (or a tuple of them) that
reads and writes only its inputs and state allocated before the call (a K/V buffer, position
tables), and reads nothing back to the host. The runner copies each call's inputs into static
buffers, so the captured graph always reads the same memory; the caller passes ``state_key``,
which must change whenever the state ``fn`` reads is reallocated or a host value ``fn`` reads
changes (a graph bakes in the addresses and host values of its capture). The returned tensors
are the runner's static outputs: valid until its next call.

One graph per runner, for the latest shape key: a new key (another prompt length, reallocated
state) releases the old graph and captures anew into a memory pool of its own; no pool is shared
or reused, as a pool whose graph was released cannot take a new capture (CUDA's caching
allocator asserts). Shapes are not bucketed (padding would change the rounding, and with it
tokens): a job whose prompts have many lengths captures once per change of length, a warm-up
and a capture, about two eager steps, against the sample's tens to hundreds of replayed ones;
keeping older graphs would buy nothing, as the state they read (Archer's K/V buffer) is
reallocated for each length. A capture that fails (an operation a graph cannot hold, memory)
warns and runs that key eagerly: the same tokens, without the launch savings; the failed
capture is unwound first (``capture_cuda``) so the process stays usable.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Callable

import torch
from torch import Tensor

MODES = ("none", "cuda_graphs", "torch_compile")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"compile: unknown mode {mode!r}; use one of {', '.join(MODES)}")
    return mode


def check_device(mode: str, device: torch.device) -> None:
    """A clear error, before any work, when the mode cannot run on ``device``."""
    if check_mode(mode) == "cuda_graphs" and torch.device(device).type not in CAPTURE:
        raise ValueError(f"compile: cuda_graphs needs a CUDA device; the model is on {device} "
                         f"(use compile: none or torch_compile there)")


class CaptureFailed(RuntimeWarning):
    """A step could not be captured; it runs eagerly for that shape key."""


class CaptureStateLost(RuntimeError):
    """A failed capture could not be unwound: the process cannot go on (not caught by the runner)."""


def capture_cuda(fn: Callable, inputs: tuple[Tensor, ...]) -> tuple[Callable[[], None], object]:
    """Capture ``fn(*inputs)`` as a CUDA graph in a memory pool of its own, freed with the graph;
    returns (replay, static outputs). One eager run on a side stream first does the lazy
    initializations (cuBLAS workspaces, kernel choices) that must not happen inside a capture
    (PyTorch's CUDA graph recipe); ``fn`` must be idempotent. A failed capture is unwound before
    its error is raised: the caller's stream is current again and ``end_failed_capture`` undoes
    what the capture left behind."""
    device = inputs[0].device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    pool = torch.cuda.graph_pool_handle()  # a new pool for every capture, never one released
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device), torch.cuda.stream(side):  # leaving restores the caller's stream
        fn(*inputs)
        try:
            with torch.cuda.graph(graph, pool=pool, stream=side):
                out = fn(*inputs)
        except Exception:
            end_failed_capture(device, pool)
            raise
    torch.cuda.current_stream(device).wait_stream(side)
    return graph.replay, out


def end_failed_capture(device: torch.device, pool) -> None:
    """Undo what a failed capture leaves behind, which torch 2.11 does not (a failed
    ``capture_end`` skips its clean-up): the caching allocator still routing allocations to the
    capture's pool, and the device's default generator in capture mode, which makes every later
    random draw outside a graph raise ("Offset increment outside graph capture"). A small capture
    run to completion takes the generator out of capture mode (its ``capture_end`` does)."""
    with contextlib.suppress(RuntimeError):  # "not currently recording": torch ended it itself
        torch._C._cuda_endAllocateToPool(device.index, pool)
    try:
        probe, scratch = torch.cuda.CUDAGraph(), torch.zeros(1, device=device)
        with torch.cuda.graph(probe):
            scratch.add_(1)
    except Exception as e:
        raise CaptureStateLost(f"compile: cuda_graphs: a failed capture left CUDA in a state that "
                               f"could not be restored ({type(e).__name__}: {e}); run the job "
                               f"again with compile: none") from e


#: device type -> capture function ``(fn, inputs) -> (replay, outputs)`` for ``cuda_graphs``
#: (tests register a CPU stand-in that replays the recorded operations on the same tensors, to
#: check the capture logic on a CPU)
CAPTURE: dict[str, Callable] = {"cuda": capture_cuda}


class StepRunner:
    """``fn(*inputs)`` run eagerly, replayed from a captured graph, or compiled (module docstring)."""

    def __init__(self, fn: Callable, mode: str = "none"):
        self.fn, self.mode = fn, check_mode(mode)
        self.key = None
        self.replay: Callable[[], None] | None = None
        self.static_inputs: tuple[Tensor, ...] = ()
        self.out = None
        self.compiled: Callable | None = None
        self.captures = 0  # how many times a graph was captured (statistics, tests)

    def __deepcopy__(self, memo):
        """A copy re-captures for its own state (a graph cannot be copied; ``fn``, a bound
        method, is rebound to the copied owner)."""
        return StepRunner(copy.deepcopy(self.fn, memo), self.mode)

    def __call__(self, *inputs: Tensor, state_key=()):
        if self.mode == "none":
            return self.fn(*inputs)
        if self.mode == "torch_compile":
            return self._compiled(inputs[0].device)(*inputs)
        key = (tuple((t.shape, t.dtype, t.device) for t in inputs), state_key)
        if key != self.key:
            self._capture(inputs, key)
        if self.replay is None:  # this key's capture failed: eagerly
            return self.fn(*inputs)
        for static, t in zip(self.static_inputs, inputs):
            if static.data_ptr() != t.data_ptr():  # host metadata only: no sync
                static.copy_(t)
        self.replay()
        return self.out

    def _capture(self, inputs: tuple[Tensor, ...], key) -> None:
        device = inputs[0].device
        check_device("cuda_graphs", device)
        self.key = key
        self.replay = self.out = None  # release the previous graph (and its pool) first
        self.static_inputs = tuple(t.clone() for t in inputs)
        try:
            self.replay, self.out = CAPTURE[device.type](self.fn, self.static_inputs)
        except CaptureStateLost:
            raise
        except Exception as e:
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            warnings.warn(f"compile: cuda_graphs: capturing {name} failed ({type(e).__name__}: {e}); "
                          f"it runs eagerly for these shapes (the same tokens, without the launch "
                          f"savings)", CaptureFailed, stacklevel=3)
            self.static_inputs = ()
            return
        self.captures += 1

    def _compiled(self, device: torch.device) -> Callable:
        if self.compiled is None:
            options = {"mode": "reduce-overhead"} if device.type == "cuda" else {}
            self.compiled = torch.compile(self.fn, fullgraph=True, **options)
        return self.compiled


#: Kernel launches of one cached step, eager, per cache setting (tests/host_sync.py's
#: ``CACHE_READS`` labels): ``(per layer, constant)``, the step at L layers launching at most
#: ``per_layer * L + constant`` (docs/ARCHITECTURE.md, performance shape). Counted on the CPU
#: as the ATen operations the step dispatches with a GPU's plain ops, views and allocations
#: aside (tests/test_launches.py, on a tiny model of 2 and 32 layers); on a GPU each is a
#: kernel launch, which a captured step (``cuda_graphs``) replays in one. A launch added to
#: every layer fails the test: lower a budget here when a change removes launches, raise one
#: only with the reason in the commit. "none" is the full forward every cache refreshes with.
LAUNCHES: dict[str, tuple[int, int]] = {
    # measured at 2 / 32 layers (d_model 16, bf16): per layer = 6 products, 2 norms, RoPE on
    # queries and keys (a roll, two products and a sum each), SDPA, SiLU and their dtype casts
    # (40); a cache's own reads and writes of its K/V or rows on top
    "none": (40, 24),               # 104 / 1304: the full forward
    "archer-kinf": (42, 11),        # 95 / 1355: + 2 K/V writes per layer
    "archer-k4": (42, 14),          # 98 / 1358
    "archer-age": (42, 11),         # 95 / 1355
    "fast_dllm_prefix": (42, 25),   # 109 / 1369
    "fast_dllm_dual": (42, 25),     # 109 / 1369
    "fast_dllm_v2": (60, 28),       # 148 / 1948 (SDAR: q/k norms, the finished prefix's K/V)
    "dkv_decode": (42, 42),         # 126 / 1386
    "dkv_greedy": (42, 49),         # 133 / 1393
    "spa": (65, -2),                # 128 / 2068: + per layer the drift, top-k and scatters
    "dllm_cache": (65, -4),         # 126 / 2076
    "d2cache": (54, 106),           # 214 / 1834: + per layer the attention probabilities
    "dinfer_vicinity": (42, 25),    # 109 / 1369
}
