"""The sampler side of the seam: logits -> next response state. A sampler never calls the model."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor


class Sampler(ABC):
    """Which logit rows a sampler reads (all, block, masked) is declared in dlmpipe.registry."""

    def begin(self, prompt_len: int, gen_len: int, mask_id: int,
              generator: torch.Generator | None = None) -> None:
        self.prompt_len, self.gen_len, self.mask_id = prompt_len, gen_len, mask_id
        self.generator = generator
        self.steps = 0
        self.done = False
        self.first_token: Tensor | None = None  # token first held by each position (revisions)
        self.revised: Tensor | None = None
        self.last_action: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def block(self) -> tuple[int, int]:
        """Current block in response coordinates."""
        return (0, self.gen_len)

    @abstractmethod
    def step(self, x: Tensor, logits: Tensor) -> None:
        """Update ``x [N]`` in place from response logits ``[G, V]``."""

    #: The last step's action when the sampler records it: (accepted positions, the tokens
    #: written there, re-masked positions), response coordinates. Saber records it
    #: (a position can be accepted and re-masked in one step); None: the shadow probe derives
    #: it from the states before and after the step (docs/ANALYSES.md).
    last_action: tuple[Tensor, Tensor, Tensor] | None = None

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
        self.first_token[newly] = response[newly]

    def stats(self) -> dict:
        revisions = int(self.revised.sum()) if self.revised is not None else 0
        return {"steps": self.steps, "revisions": revisions}


def gumbel_argmax(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """LLaDA's sampling: ``argmax(exp(l) / (-log u) ** T)`` in float64; plain argmax at T = 0."""
    if temperature == 0:
        return logits.argmax(-1)
    l64 = logits.to(torch.float64)
    u = torch.rand(l64.shape, dtype=torch.float64, generator=generator, device="cpu").to(l64.device)
    return (l64.exp() / (-torch.log(u)) ** temperature).argmax(-1)
