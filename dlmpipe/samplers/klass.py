"""KLASS: KL-adaptive stability sampling (Kim et al. 2025; docs/METHODS.md §1.10).

LLaDA's blocks and per-block schedule (§1.1). Every step computes each response position's
distribution p_t (float64 softmax) and its KL divergence to the previous step's,
``sum p_t (log(p_t + 1e-12) - log(p_(t-1) + 1e-12))`` (the previous one is all zeros before the
first step), and keeps the last ``history_length`` of them. A masked position of the block is
ready when all of its recorded KLs are below ``kl_threshold`` and its confidence (probability of
its token) is above ``conf_threshold``; the step unmasks the ready positions (all of them, or one
by ``unmask_strategy``), or when none is ready the top-k by confidence, k from LLaDA's schedule.
A block ends when it has no masks or after its scheduled steps; its last step tops up to what
the schedule still owes the block, so no block ends with masks left. ``rule: released`` adds the
LLaDA release's gate (no position is ready in the first ``history_length - 1`` steps of a block)
and, at temperature > 0, takes confidences and KLs from the softmax of the Gumbel-perturbed
values as that code does.

The KL history of a position starts before its block does (its distributions while earlier
blocks were decoded), so KLASS reads every response row at every step (``all_rows``): caches that
serve only the block's rows cannot serve it. The history (previous log-probabilities ``[G, V]``
and the last KLs ``[G, history_length]``, float64) stays on the model's device; the step reads
back one small tensor (the accept decision's counts).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import gumbel_noise, to_device
from .llada_confidence import LLaDASchedule, transfer_schedule

UNMASK_STRATEGIES = ("all", "max_conf", "min_kl", "random")
#: the reference's epsilon inside both logarithms of the KL
KL_EPS = 1e-12


class KLASS(LLaDASchedule):
    def __init__(self, *, conf_threshold: float, kl_threshold: float, history_length: int,
                 unmask_strategy: str, rule: str, block_length: int | None, steps: int | None,
                 temperature: float):
        if unmask_strategy not in UNMASK_STRATEGIES:
            raise ValueError(f"unmask_strategy must be one of {', '.join(UNMASK_STRATEGIES)}")
        self.conf_threshold, self.kl_threshold = conf_threshold, kl_threshold
        self.history_length, self.unmask_strategy = history_length, unmask_strategy
        self.released = rule == "released"
        super().__init__(block_length=block_length, steps=steps, temperature=temperature)

    def begin(self, prompt_len, gen_len, mask_id, generator=None, device="cpu") -> None:
        super().begin(prompt_len, gen_len, mask_id, generator, device)
        self.schedule = transfer_schedule(self.block_length, self.steps_per_block)
        self.remaining = self.block_length  # masks left in the block, read back once per step
        self.unmasked_in_block = 0          # positions the block's steps chose so far
        # the history: log(p_(t-1) + eps) of every response row (allocated at the first step, when
        # the vocabulary is known; p_(-1) = 0) and the last history_length KLs (zeros at first)
        self.log_prev: Tensor | None = None
        self.kl_history = torch.zeros(gen_len, self.history_length, dtype=torch.float64, device=self.device)
        self.accepted_per_step: list[int] = []
        self.ready_steps = 0

    def _distribution(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's token and float64 distribution (§1.1's tokens; the released rule at
        temperature > 0: the softmax of the perturbed values ``exp(l) / (-log u)^T``)."""
        if not self.temperature:
            return logits.argmax(-1), torch.softmax(logits.to(torch.float64), dim=-1)
        u = gumbel_noise(logits.shape, self.generator, logits.device)
        perturbed = logits.to(torch.float64).exp() / (-torch.log(u)) ** self.temperature
        tokens = perturbed.argmax(-1)
        source = perturbed if self.released else logits.to(torch.float64)
        return tokens, torch.softmax(source, dim=-1)

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        lo, hi = self.block
        tokens, probs = self._distribution(logits)
        log_probs = torch.log(probs + KL_EPS)
        if self.log_prev is None:
            self.log_prev = torch.full_like(probs, math.log(KL_EPS))
        kl = (probs * (log_probs - self.log_prev)).sum(-1)
        self.log_prev = log_probs
        self.kl_history = torch.cat([self.kl_history[:, 1:], kl[:, None]], dim=1)
        confidence = probs.gather(-1, tokens[:, None])[:, 0]

        position = torch.arange(self.gen_len, device=response.device)
        candidates = (response == self.mask_id) & (position >= lo) & (position < hi)
        stable = (self.kl_history < self.kl_threshold).all(-1)
        ready = stable & (confidence > self.conf_threshold) & candidates
        if self.released and self.block_step < self.history_length - 1:
            ready = torch.zeros_like(ready)
        ready = self._narrow(ready, confidence, kl)

        # the fallback's k: LLaDA's schedule. The schedule still owes the block ``owed`` positions
        # (positions given the MASK token count as decoded, as in LLaDA's schedule); a ready step
        # can unmask fewer than its k, so the block's last step tops the ready positions up to
        # what is owed (by confidence) and its fallback takes at least that many: no block ends
        # with masks left. With one token per step nothing is ever owed beyond the schedule.
        last = self.block_step == self.steps_per_block - 1
        owed = max(self.block_length - self.unmasked_in_block, 0)
        k = self.schedule[self.block_step]
        if last:
            k = max(k, owed)
        k = min(k, self.remaining)
        by_confidence = confidence.masked_fill(~candidates, float("-inf"))
        fallback = torch.zeros_like(candidates)
        if k > 0:  # (index_fill: a Python value assigned through [] is a host copy on CUDA)
            fallback.index_fill_(0, torch.topk(by_confidence, k).indices, True)
        any_ready = ready.any()
        if last and owed > 0:
            rest = by_confidence.masked_fill(ready, float("-inf"))
            rank = torch.empty_like(position)
            rank[torch.sort(rest, descending=True, stable=True).indices] = position
            ready = ready | ((rank < owed - ready.sum()) & candidates & ~ready)
        chosen = torch.where(any_ready, ready, fallback)
        response.copy_(torch.where(chosen, tokens, response))

        self.steps += 1
        self._track(response)
        self.block_step += 1
        # the step's one host read: how many were unmasked, how many masks the block has left,
        # and whether the stable set decided
        n, self.remaining, decided = torch.stack([chosen.sum(), (response[lo:hi] == self.mask_id).sum(),
                                                  any_ready.to(torch.int64)]).tolist()
        self.accepted_per_step.append(n)
        self.unmasked_in_block += n
        self.ready_steps += decided
        if self.remaining == 0 or self.block_step == self.steps_per_block:
            self.block_index, self.block_step = self.block_index + 1, 0
            self.remaining, self.unmasked_in_block = self.block_length, 0
            self.done = self.block_index == self.num_blocks

    def _narrow(self, ready: Tensor, confidence: Tensor, kl: Tensor) -> Tensor:
        """``unmask_strategy``: all ready positions, or the one with the highest confidence, the
        lowest current KL, or one drawn uniformly (a random key per position from the sample's
        generator, the largest ready one wins); none when none is ready. No host read."""
        if self.unmask_strategy == "all":
            return ready
        if self.unmask_strategy == "max_conf":
            key = confidence
        elif self.unmask_strategy == "min_kl":
            key = -kl
        else:
            key = to_device(torch.rand(ready.shape, dtype=torch.float64, generator=self.generator),
                            ready.device)
        pick = key.masked_fill(~ready, float("-inf")).argmax()
        return torch.zeros_like(ready).index_fill(0, pick[None], True) & ready

    def stats(self) -> dict:
        return {**super().stats(), "accepted_per_step": list(self.accepted_per_step),
                "ready_steps": self.ready_steps}
