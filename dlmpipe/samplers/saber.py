"""Saber: rollback decoding with drift-based backtracking (docs/METHODS.md §1.3).

Per step: accept every uncommitted position left of the block edge whose confidence beats the
running mean of acceptance confidences (at least ``n``), then re-mask the visible positions
whose confidence dropped the most. Net progress per step is at least one token.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Sampler, gumbel_argmax


def remask_count(n: int, mu: float, k: int) -> int:
    """``r = min(max(floor(n/2), ceil(k/mu)), k - 1)``, never negative."""
    return max(0, min(max(n // 2, math.ceil(k / mu)), k - 1))


class Saber(Sampler):
    def __init__(self, *, n: int, mu: float, block_length: int | None, temperature: float,
                 max_steps_per_block: int):
        self.n, self.mu, self.block_length_opt = n, mu, block_length
        self.temperature, self.max_steps_per_block = temperature, max_steps_per_block

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.block_length = self.block_length_opt or gen_len
        if gen_len % self.block_length:
            raise ValueError(f"gen_length {gen_len} is not a multiple of block_length {self.block_length}")
        self.block_index, self.block_step = 0, 0
        dev = self.device
        self.committed = torch.zeros(gen_len, dtype=torch.bool, device=dev)
        self.acc = torch.full((gen_len,), float("nan"), dtype=torch.float64, device=dev)
        self.prev_s = torch.zeros(gen_len, dtype=torch.float64, device=dev)
        self.positions = torch.arange(gen_len, device=dev)
        self.accepted_total = 0
        self.remasked_total = 0

    @property
    def block(self) -> tuple[int, int]:
        return (self.block_index * self.block_length, (self.block_index + 1) * self.block_length)

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        edge = self.block[1]
        without_mask = logits.clone()
        without_mask[:, self.mask_id] = float("-inf")
        tok = gumbel_argmax(without_mask, self.temperature, self.generator)
        p = torch.softmax(logits.to(torch.float64), dim=-1).gather(-1, tok[:, None])[:, 0]

        # 2. scores left of the block edge, drift against last step's scores
        s = torch.full_like(p, float("-inf"))
        s[:edge] = p[:edge]
        drift = s - self.prev_s
        drift = drift.masked_fill(~torch.isfinite(drift), float("inf"))
        self.prev_s = s

        # 3. accept above the running mean of acceptance confidences (1 before any), at least
        # n: then the n most confident candidates (top n of all positions, non-candidates
        # dropped: the same choice as top min(n, #candidates) of the candidates)
        recorded = ~torch.isnan(self.acc)
        count = recorded.sum()
        tau = torch.where(count > 0, torch.where(recorded, self.acc, 0.0).sum() / count, 1.0)
        candidate = ~self.committed & (self.positions < edge)
        accept = candidate & (s > tau)
        conf = torch.where(candidate, s, float("-inf"))
        most = torch.topk(conf, min(self.n, self.gen_len)).indices
        top = torch.zeros_like(candidate).index_fill(0, most, True)  # (no host copy, as below)
        accept = torch.where(accept.sum() < self.n, top & candidate, accept)
        response.copy_(torch.where(accept, tok, response))
        self.committed |= accept
        self.acc = torch.where(accept, p, self.acc)
        self.last_action = (accept, tok, None)  # no host read: the shadow probe reads it
        self.steps += 1
        self.block_step += 1
        self._track(response)

        # the step's one host read: what decides the next move
        visible = self.committed & (self.positions < edge)
        k, finished, block_open, n_visible = torch.stack([
            accept.sum(), self.committed.all(), (~self.committed[:edge]).any(), visible.sum()
        ]).tolist()
        self.accepted_total += k

        # 4. stop, or move to the next block without backtracking
        if finished:
            self.done = True
            return
        if not block_open:
            self.block_index += 1
            self.block_step = 0
            return

        # 5. backtrack: re-mask the visible positions with the most negative drift
        if self.block_step >= self.max_steps_per_block:
            return
        r = remask_count(self.n, self.mu, k)
        if r == 0:
            return
        d = torch.where(visible, drift, float("inf"))
        worst = torch.topk(d, min(r, n_visible), largest=False).indices
        # index_fill_, not ``response[worst] = mask_id``: on CUDA that copies the value over from
        # the host, a sync (docs/ARCHITECTURE.md, performance shape)
        response.index_fill_(0, worst, self.mask_id)
        self.committed.index_fill_(0, worst, False)
        self.remasked_total += int(worst.numel())
        self.last_action = (accept, tok, worst)
        self._track(response)

    def stats(self) -> dict:
        return {**super().stats(), "accepted": self.accepted_total, "remasked": self.remasked_total}
