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

    def begin(self, prompt_len, gen_len, mask_id, generator=None) -> None:
        super().begin(prompt_len, gen_len, mask_id, generator)
        self.block_length = self.block_length_opt or gen_len
        if gen_len % self.block_length:
            raise ValueError(f"gen_length {gen_len} is not a multiple of block_length {self.block_length}")
        self.block_index, self.block_step = 0, 0
        self.committed = torch.zeros(gen_len, dtype=torch.bool)
        self.acc = torch.full((gen_len,), float("nan"), dtype=torch.float64)
        self.prev_s = torch.zeros(gen_len, dtype=torch.float64)
        self.accepted_total = 0
        self.remasked_total = 0

    @property
    def block(self) -> tuple[int, int]:
        return (self.block_index * self.block_length, (self.block_index + 1) * self.block_length)

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        device = response.device
        edge = self.block[1]
        without_mask = logits.clone()
        without_mask[:, self.mask_id] = float("-inf")
        tok = gumbel_argmax(without_mask, self.temperature, self.generator)
        p = torch.softmax(logits.to(torch.float64), dim=-1).gather(-1, tok[:, None])[:, 0].cpu()
        tok = tok.cpu()

        # 2. scores left of the block edge, drift against last step's scores
        s = torch.full((self.gen_len,), float("-inf"), dtype=torch.float64)
        s[:edge] = p[:edge]
        drift = s - self.prev_s
        drift[~torch.isfinite(drift)] = float("inf")
        self.prev_s = s

        # 3. accept above the running mean of acceptance confidences, at least n
        recorded = self.acc[~torch.isnan(self.acc)]
        tau = float(recorded.mean()) if recorded.numel() else 1.0
        candidate = ~self.committed
        candidate[edge:] = False
        accept = candidate & (s > tau)
        if int(accept.sum()) < self.n:
            conf = torch.where(candidate, s, torch.tensor(float("-inf"), dtype=torch.float64))
            top = torch.topk(conf, min(self.n, int(candidate.sum()))).indices
            accept = torch.zeros_like(candidate)
            accept[top] = True
        k = int(accept.sum())
        idx = accept.nonzero()[:, 0]
        response[idx.to(device)] = tok[idx].to(device)
        self.committed[idx] = True
        self.acc[idx] = p[idx]
        self.accepted_total += k
        self.last_action = (idx, tok[idx], idx[:0])
        self.steps += 1
        self.block_step += 1
        self._track(response.cpu())

        # 4. stop, or move to the next block without backtracking
        if bool(self.committed.all()):
            self.done = True
            return
        if not bool((~self.committed[:edge]).any()):
            self.block_index += 1
            self.block_step = 0
            return

        # 5. backtrack: re-mask the visible positions with the most negative drift
        if self.block_step >= self.max_steps_per_block:
            return
        r = remask_count(self.n, self.mu, k)
        if r == 0:
            return
        visible = self.committed.clone()
        visible[edge:] = False
        d = torch.where(visible, drift, torch.tensor(float("inf"), dtype=torch.float64))
        worst = torch.topk(d, min(r, int(visible.sum())), largest=False).indices
        response[worst.to(device)] = self.mask_id
        self.committed[worst] = False
        self.remasked_total += int(worst.numel())
        self.last_action = (idx, tok[idx], worst)
        self._track(response.cpu())

    def stats(self) -> dict:
        return {**super().stats(), "accepted": self.accepted_total, "remasked": self.remasked_total}
