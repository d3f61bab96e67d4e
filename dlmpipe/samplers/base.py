"""The sampler side of the seam: logits -> next response state. A sampler never calls the model.

A sampler keeps its per-step state on the model's device (``begin``'s ``device``) and reads
nothing back to the host inside a step except what its decision needs (docs/ARCHITECTURE.md,
performance shape): LLaDA confidence, certainty prior, PC-Sampler and random order need nothing,
Saber, the parallel samplers and WINO read one small tensor per step. Random numbers are drawn on
the CPU from the sample's
generator (the same tokens on every device) and copied to the device without a host sync.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from ..graphs import check_mode


class Sampler(ABC):
    """Which logit rows a sampler reads (all, block, masked) is declared in dlmpipe.registry."""

    compile_mode = "none"

    def use_compile(self, mode: str) -> None:
        """How the sampler's fixed-shape per-step work runs (dlmpipe/graphs.py; the campaign key
        ``compile``); samplers without such a step run eagerly (those with one: the samplers
        scoring on LLaDA's schedule, LLaDA confidence, certainty prior and PC-Sampler)."""
        self.compile_mode = check_mode(mode)

    def begin(self, prompt_len: int, gen_len: int, mask_id: int,
              generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> None:
        """Start a sample; ``device`` is where the sequence and the logits live."""
        self.prompt_len, self.gen_len, self.mask_id = prompt_len, gen_len, mask_id
        self.generator = generator
        self.device = torch.device(device)
        self.steps = 0
        self.done = False
        self.first_token: Tensor | None = None  # token first held by each position (revisions)
        self.revised: Tensor | None = None
        self.last_action: tuple[Tensor, Tensor, Tensor | None] | None = None

    @property
    def block(self) -> tuple[int, int]:
        """Current block in response coordinates."""
        return (0, self.gen_len)

    @property
    def block_start(self) -> int:
        """The row of ``x`` where the current block begins, its prompt rows included: the
        block's first response position, unless the sampler counts its blocks from before the
        response (Fast-dLLM v2's sub-blocks); the decode loop passes it to the cache."""
        return self.prompt_len + int(self.block[0])

    #: (first response position, confidences ``[n]`` of the positions from there) of the last
    #: step, for samplers that record them (the decode trace, dlmpipe/trace.py); else None
    last_confidence: tuple[int, Tensor] | None = None

    @abstractmethod
    def step(self, x: Tensor, logits: Tensor) -> None:
        """Update ``x [N]`` in place from response logits ``[G, V]``."""

    #: The last step's action when the sampler records it: (accepted mask ``[G]``, the token
    #: each accepted position received ``[G]``, re-masked positions or None), on the sampler's
    #: device, without a host read. Saber records it (a position can be accepted and re-masked
    #: in one step); None: the shadow probe derives it from the states before and after the
    #: step (docs/ANALYSES.md).
    last_action: tuple[Tensor, Tensor, Tensor | None] | None = None

    def due_positions(self) -> Tensor | None:
        """Response positions the next ``step`` will decode, when they are fixed before the
        logits are known (fixed-order decoding); None when the logits decide (the default).
        The decode loop passes this to the cache (``Cache.note_due_positions``)."""
        return None

    def shadow_block(self) -> tuple[int, int] | None:
        """Response positions ``[lo, hi)`` whose leave-one-out verification logits the next
        ``step`` reads (WINO's shadow block, docs/METHODS.md §1.8), or None (the default). The
        decode loop passes this to the cache (``Cache.note_shadow_block``), which appends those
        rows after the ``G`` response rows of the logits ``step`` receives."""
        return None

    # -- revision bookkeeping shared by all samplers ------------------------------------
    def _track(self, response: Tensor) -> None:
        """Record first tokens and mark positions re-masked or replaced after holding one."""
        if self.first_token is None:
            self.first_token = torch.full_like(response, -1)
            self.revised = torch.zeros_like(response, dtype=torch.bool)
        held = self.first_token >= 0
        self.revised |= held & (response != self.first_token)
        newly = (~held) & (response != self.mask_id)
        self.first_token = torch.where(newly, response, self.first_token)  # no boolean indexing

    def stats(self) -> dict:
        revisions = int(self.revised.sum()) if self.revised is not None else 0
        return {"steps": self.steps, "revisions": revisions}


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A CPU tensor on ``device`` without a host sync: a CUDA copy from pageable memory waits for
    the stream, one from pinned memory does not (the pinned block is kept until it is done)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def gumbel_noise(shape: torch.Size, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Float64 uniforms from the sample's CPU generator, so every device draws the same noise."""
    return to_device(torch.rand(shape, dtype=torch.float64, generator=generator, device="cpu"), device)


def perturbed_argmax(logits: Tensor, temperature: float, u: Tensor) -> Tensor:
    """``argmax(exp(l) / (-log u) ** T)`` in float64 (``u`` from ``gumbel_noise``)."""
    return (logits.to(torch.float64).exp() / (-torch.log(u)) ** temperature).argmax(-1)


def gumbel_argmax(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """LLaDA's sampling: ``argmax(exp(l) / (-log u) ** T)`` in float64; plain argmax at T = 0."""
    if temperature == 0:
        return logits.argmax(-1)
    return perturbed_argmax(logits, temperature, gumbel_noise(logits.shape, generator, logits.device))
