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
"""
from __future__ import annotations

import copy
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


def capture_cuda(fn: Callable, inputs: tuple[Tensor, ...], pool) -> tuple[Callable[[], None], object]:
    """Capture ``fn(*inputs)`` as a CUDA graph; returns (replay, static outputs). One eager run on
    a side stream first does the lazy initializations (cuBLAS workspaces, kernel choices) that
    must not happen inside a capture (PyTorch's CUDA graph recipe); ``fn`` must be idempotent."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*inputs)
    return graph.replay, out


#: device type -> capture function for ``cuda_graphs`` (tests register a CPU stand-in that
#: replays the recorded operations on the same tensors, to check the capture logic on a CPU)
CAPTURE: dict[str, Callable] = {"cuda": capture_cuda}


class StepRunner:
    """``fn(*inputs)`` run eagerly, replayed from a captured graph, or compiled (module docstring)."""

    def __init__(self, fn: Callable, mode: str = "none"):
        self.fn, self.mode = fn, check_mode(mode)
        self.key = None
        self.replay: Callable[[], None] | None = None
        self.static_inputs: tuple[Tensor, ...] = ()
        self.out = None
        self.pool = None
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
        for static, t in zip(self.static_inputs, inputs):
            if static.data_ptr() != t.data_ptr():  # host metadata only: no sync
                static.copy_(t)
        self.replay()
        return self.out

    def _capture(self, inputs: tuple[Tensor, ...], key) -> None:
        device = inputs[0].device
        check_device("cuda_graphs", device)
        self.replay = self.out = None  # release the previous graph before capturing the next
        if self.pool is None and device.type == "cuda":
            self.pool = torch.cuda.graph_pool_handle()
        self.static_inputs = tuple(t.clone() for t in inputs)
        self.replay, self.out = CAPTURE[device.type](self.fn, self.static_inputs, self.pool)
        self.key = key
        self.captures += 1

    def _compiled(self, device: torch.device) -> Callable:
        if self.compiled is None:
            options = {"mode": "reduce-overhead"} if device.type == "cuda" else {}
            self.compiled = torch.compile(self.fn, fullgraph=True, **options)
        return self.compiled
