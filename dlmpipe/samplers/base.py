"""The sampler side of the seam: logits -> next response state. A sampler never calls the model.

A sampler keeps its per-step state on the model's device (``begin``'s ``device``) and reads
nothing back to the host inside a step except what its decision needs (docs/ARCHITECTURE.md,
performance shape): LLaDA confidence and random order need nothing, Saber and the parallel
samplers read one small tensor per step. Random numbers are drawn on the CPU from the sample's
generator (the same tokens on every device) and copied to the device without a host sync.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor


class Sampler(ABC):
    """Which logit rows a sampler reads (all, block, masked) is declared in dlmpipe.registry."""

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

    @property
    def block(self) -> tuple[int, int]:
        """Current block in response coordinates."""
        return (0, self.gen_len)

    @abstractmethod
    def step(self, x: Tensor, logits: Tensor) -> None:
        """Update ``x [N]`` in place from response logits ``[G, V]``."""

    def due_positions(self) -> Tensor | None:
        """Response positions the next ``step`` will decode, when they are fixed before the
        logits are known (fixed-order decoding); None when the logits decide (the default).
        The decode loop passes this to the cache (``Cache.note_due_positions``)."""
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


def gumbel_argmax(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """LLaDA's sampling: ``argmax(exp(l) / (-log u) ** T)`` in float64; plain argmax at T = 0.
    The uniforms come from the sample's CPU generator, so every device draws the same noise."""
    if temperature == 0:
        return logits.argmax(-1)
    l64 = logits.to(torch.float64)
    u = to_device(torch.rand(l64.shape, dtype=torch.float64, generator=generator, device="cpu"), l64.device)
    return (l64.exp() / (-torch.log(u)) ** temperature).argmax(-1)
