"""Threshold and factor parallel decoding (Fast-dLLM; docs/METHODS.md §1.2).

Blocks are decoded left to right; each block is looped until it has no masks. Per step the
candidates are the masked positions of the current block, sorted by confidence (softmax
probability of the chosen token, float64; tokens chosen like LLaDA's, Gumbel noise at
temperature > 0, never the MASK id). The most confident candidate is always accepted; the rule
decides how many more:

- threshold (tau): every other candidate with confidence >= tau;
- factor (f): the largest prefix n of the sorted confidences with c_(i) >= 1 - f / (i + 1)
  for i = 2..n (1-based); ``rule: released`` follows Fast-dLLM's code instead, which differs
  when only the last of m >= 2 candidates fails (it accepts all m).

``max_steps_per_block`` (optional) caps a block's steps: its last allowed step accepts every
remaining candidate, so a block never ends with masks left. These samplers read only the rows
of the current block, so they pair with caches that serve blocks (Fast-dLLM, dKV-Cache).
"""
from __future__ import annotations

from abc import abstractmethod

import torch
from torch import Tensor

from .base import Sampler, gumbel_argmax


def threshold_accepts(sorted_confidence: Tensor, tau: float) -> Tensor:
    """How many of the descending confidences the threshold rule accepts (at least one; none of
    none), as a 0-d tensor on their device (no host sync)."""
    m = sorted_confidence.numel()
    return (sorted_confidence[1:] >= tau).sum() + min(m, 1)


def factor_accepts(sorted_confidence: Tensor, f: float, released: bool = False) -> Tensor:
    """Largest n with ``c_(i) >= 1 - f / (i + 1)`` for i = 2..n (the first always accepted), as a
    0-d tensor on the confidences' device (no host sync).

    ``released``: Fast-dLLM's code (``get_transfer_index_dynamic``) instead; its loop stops at
    the first failing candidate and adds one when it stopped at the last index, which also
    accepts the last of m >= 2 candidates when it alone fails (n = m - 1 becomes m)."""
    m = sorted_confidence.numel()
    i = torch.arange(2, max(m, 1) + 1, dtype=torch.float64, device=sorted_confidence.device)
    holds = sorted_confidence[1:].to(torch.float64) >= 1 - f / (i + 1)
    n = torch.cumprod(holds.to(torch.int64), 0).sum() + min(m, 1)
    return torch.where(n == m - 1, m, n) if released and m >= 2 else n


def block_candidates(span: Tensor, logits: Tensor, m: int, mask_id: int, temperature: float,
                     generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The ``m`` masked positions of ``span`` (a block's tokens; ``logits`` its rows), ascending
    and relative to the span, with their logit rows and their tokens (LLaDA's choice, Gumbel
    noise at temperature > 0, never the MASK id): ``(masked, candidates, rows, tokens)``. A
    stable sort puts the masked positions first, which needs no host sync (nonzero would read
    the count back; ``m`` is known from the last step)."""
    masked = span == mask_id
    candidates = torch.sort((~masked).to(torch.uint8), stable=True).indices[:m]
    rows = logits[candidates]
    without_mask = rows.clone()
    without_mask[:, mask_id] = float("-inf")
    return masked, candidates, rows, gumbel_argmax(without_mask, temperature, generator)


class BlockLoop(Sampler):
    """Fast-dLLM's block loop (§1.2): blocks left to right, each stepped until it has no masks.
    Subclasses set ``block_length_opt`` and end each ``step`` with ``finish_step``."""

    block_length_opt: int | None

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.block_length = self.block_length_opt or gen_len
        if gen_len % self.block_length:
            raise ValueError(f"gen_length {gen_len} is not a multiple of block_length {self.block_length}")
        self.num_blocks = gen_len // self.block_length
        self.block_index, self.block_step = 0, 0
        self.accepted_per_step: list[int] = []
        # masks left in the current block, read back once per step; a block is untouched (all
        # masks) until its first step, since a step writes inside its own block only
        self.remaining = self.block_length

    @property
    def block(self) -> tuple[int, int]:
        lo = self.block_index * self.block_length
        return (lo, lo + self.block_length)

    def finish_step(self, response: Tensor, accepted: Tensor) -> None:
        """Count the step and track revisions; the step's one host read: how many were accepted
        (``accepted``, 0-d), how many masks the block has left; then the next block if none."""
        lo, hi = self.block
        self.steps += 1
        self._track(response)
        n, self.remaining = torch.stack([accepted.to(torch.int64),
                                         (response[lo:hi] == self.mask_id).sum()]).tolist()
        self.accepted_per_step.append(n)
        if self.remaining == 0:
            self.block_index, self.block_step = self.block_index + 1, 0
            self.remaining = self.block_length
            self.done = self.block_index == self.num_blocks

    def stats(self) -> dict:
        return {**super().stats(), "accepted_per_step": list(self.accepted_per_step)}


class ParallelSampler(BlockLoop):
    """The threshold and factor rules' step; subclasses implement ``accepts``."""

    def __init__(self, *, block_length: int | None, temperature: float,
                 max_steps_per_block: int | None):
        self.block_length_opt, self.temperature = block_length, temperature
        self.max_steps_per_block = max_steps_per_block

    @abstractmethod
    def accepts(self, sorted_confidence: Tensor) -> Tensor:
        """How many of the descending candidate confidences this step accepts (at least one),
        a 0-d tensor."""

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        lo, hi = self.block
        m = self.remaining
        masked, candidates, rows, tokens = block_candidates(
            response[lo:hi], logits[lo:hi], m, self.mask_id, self.temperature, self.generator)
        candidates = candidates + lo
        confidence = torch.softmax(rows.to(torch.float64), dim=-1).gather(-1, tokens[:, None])[:, 0]
        order = torch.sort(confidence, descending=True, stable=True).indices
        n = self.accepts(confidence[order])
        self.block_step += 1
        if self.max_steps_per_block is not None and self.block_step >= self.max_steps_per_block:
            n = torch.full((), m, device=response.device)  # the capped block's last step: nothing stays masked
        accepted = torch.empty_like(masked[:m])
        accepted[order] = torch.arange(m, device=response.device) < n  # the n most confident
        response[candidates] = torch.where(accepted, tokens, response[candidates])
        self.finish_step(response, n)


class ThresholdSampler(ParallelSampler):
    def __init__(self, *, tau: float, **block_options):
        super().__init__(**block_options)
        self.tau = tau

    def accepts(self, sorted_confidence: Tensor) -> Tensor:
        return threshold_accepts(sorted_confidence, self.tau)


class FactorSampler(ParallelSampler):
    def __init__(self, *, f: float, rule: str, **block_options):
        super().__init__(**block_options)
        self.f, self.released = f, rule == "released"

    def accepts(self, sorted_confidence: Tensor) -> Tensor:
        return factor_accepts(sorted_confidence, self.f, self.released)
