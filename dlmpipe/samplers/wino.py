"""WINO: Wide-In, Narrow-Out revokable decoding (Hong et al. 2025; docs/METHODS.md §1.8).

Blocks are decoded left to right; each block is looped until it has no masks. Per step, over
the verification window (the current block):

- wide-in: every masked position whose confidence (softmax probability of its token, float64;
  tokens chosen like the threshold sampler's: Gumbel noise at temperature > 0, never the MASK
  id) is >= ``wide_in`` is unmasked, and at least the most confident one;
- narrow-out: every position decoded before this step is verified with the shadow block (its
  leave-one-out logits, appended by the cache after the response rows; engine/shadow.py) and
  re-masked when the probability of its token there is < ``narrow_out``, the least confident
  first and at most (unmasked this step) - 1 of them, so every step leaves fewer masks.

``rule: released`` follows d2Cache's WINO instead: it caps wide-in at
clamp(floor(0.7 m), 5, 20) of the window's m masks (the official code's cap), and its
``check_can_generate`` ANDs the block mask in place with the masks of every step, so the window
(the shadow block and the positions verified and decoded) shrinks to the span of the positions
masked at the start of every earlier step, and the block ends when none of those is masked
(positions re-masked after that stay masked).

Per step the sampler reads back one small tensor (the window's masks left, and for
``released`` the next window).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Sampler
from .parallel import block_candidates


def wide_in_count(sorted_confidence: Tensor, wide_in: float, cap: int | None = None) -> Tensor:
    """How many of the descending candidate confidences wide-in unmasks: those >= ``wide_in``,
    at least one (none of none), at most ``cap``; a 0-d tensor (no host sync)."""
    n = (sorted_confidence >= wide_in).sum().clamp(min=min(sorted_confidence.numel(), 1))
    return n if cap is None else n.clamp(max=cap)


def narrow_out_count(verification: Tensor, narrow_out: float, unmasked: Tensor) -> Tensor:
    """How many decoded tokens narrow-out re-masks: those whose verification confidence is
    < ``narrow_out`` (``verification`` +inf elsewhere), at most ``unmasked - 1``; 0-d."""
    return torch.minimum((verification < narrow_out).sum(), unmasked - 1)


def released_cap(masked: int) -> int:
    """The official code's wide-in cap, min(max(int(0.7 m), 5), 20), computed as it does (an
    int64 tensor times 0.7 in float32, truncated)."""
    return min(max(int(torch.tensor(masked) * 0.7), 5), 20)


class Wino(Sampler):
    def __init__(self, *, wide_in: float, narrow_out: float, block_length: int | None,
                 temperature: float, rule: str):
        self.wide_in, self.narrow_out = wide_in, narrow_out
        self.block_length_opt, self.temperature = block_length, temperature
        self.released = rule == "released"

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.block_length = self.block_length_opt or gen_len
        if gen_len % self.block_length:
            raise ValueError(f"gen_length {gen_len} is not a multiple of block_length {self.block_length}")
        self.num_blocks = gen_len // self.block_length
        self.accepted_per_step: list[int] = []
        self.remasked_per_step: list[int] = []
        self._start_block(0)

    def _start_block(self, index: int) -> None:
        self.block_index = index
        lo = index * self.block_length
        self.window = (lo, lo + self.block_length)
        self.remaining = self.block_length  # masks in the window; a block is untouched until its first step
        # released: block positions masked at the start of every step so far (d2Cache's block mask)
        self.eligible = torch.ones(self.block_length, dtype=torch.bool, device=self.device)

    @property
    def block(self) -> tuple[int, int]:
        lo = self.block_index * self.block_length
        return (lo, lo + self.block_length)

    def shadow_block(self) -> tuple[int, int]:
        return self.window

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        lo, hi = self.window
        G, W, m = self.gen_len, hi - lo, self.remaining
        span = response[lo:hi]
        masked = span == self.mask_id
        if self.released:  # check_can_generate's in-place AND (the mask lies inside the window)
            b0 = self.block[0]
            self.eligible[lo - b0:hi - b0] &= masked
        # wide-in over the window's masked positions
        _, candidates, rows, tokens = block_candidates(span, logits[lo:hi], m, self.mask_id,
                                                       self.temperature, self.generator)
        confidence = torch.softmax(rows.to(torch.float64), -1).gather(-1, tokens[:, None])[:, 0]
        order = torch.sort(confidence, descending=True, stable=True).indices
        n_in = wide_in_count(confidence[order], self.wide_in,
                             released_cap(m) if self.released else None)
        take = torch.empty_like(masked[:m])
        take[order] = torch.arange(m, device=span.device) < n_in
        accepted = torch.zeros_like(masked)
        accepted[candidates] = take
        chosen = span.clone()
        chosen[candidates] = tokens
        # narrow-out over the tokens decoded before this step, by their shadow rows
        shadow = logits[G:G + W].to(torch.float64)
        verification = torch.softmax(shadow, -1).gather(-1, span[:, None])[:, 0]
        verification = verification.masked_fill(masked, float("inf"))
        n_out = narrow_out_count(verification, self.narrow_out, n_in)
        ascending = torch.sort(verification, stable=True).indices
        remask = torch.empty_like(masked)
        remask[ascending] = torch.arange(W, device=span.device) < n_out
        new = torch.where(accepted, chosen, span)
        response[lo:hi] = new.masked_fill(remask, self.mask_id)
        self.steps += 1
        self._track(response)
        self._end_step(response, n_in, n_out)

    def _end_step(self, response: Tensor, n_in: Tensor, n_out: Tensor) -> None:
        """The step's one host read: counts, masks left, and (released) the next window."""
        b0, b1 = self.block
        masked_now = response[b0:b1] == self.mask_id
        if self.released:
            # the window of the next step is the span of this step's block mask; the block goes
            # on while one of those positions is still masked
            index = torch.arange(self.block_length, device=response.device)
            span_lo = torch.where(self.eligible, index, self.block_length).min()
            span_hi = torch.where(self.eligible, index + 1, 0).max()
            going = (self.eligible & masked_now).sum()
            in_window = (masked_now & (index >= span_lo) & (index < span_hi)).sum()
            n_in, n_out, going, span_lo, span_hi, left = torch.stack(
                [n_in, n_out, going, span_lo, span_hi, in_window]).tolist()
        else:
            n_in, n_out, left = torch.stack([n_in, n_out, masked_now.sum()]).tolist()
            going, span_lo, span_hi = left, 0, self.block_length
        self.accepted_per_step.append(n_in)
        self.remasked_per_step.append(n_out)
        if going:
            self.window, self.remaining = (b0 + span_lo, b0 + span_hi), left
            return
        if self.block_index + 1 == self.num_blocks:
            self.done = True
        else:
            self._start_block(self.block_index + 1)

    def stats(self) -> dict:
        return {**super().stats(), "accepted_per_step": list(self.accepted_per_step),
                "remasked_per_step": list(self.remasked_per_step)}
