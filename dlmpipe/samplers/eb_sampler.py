"""EB-Sampler: entropy-bounded parallel unmasking (Ben-Hamu et al. 2025; docs/METHODS.md §1.9).

Blocks left to right, each looped until it has no masks (Fast-dLLM's block loop, §1.2). Per step
the candidates are the block's masked positions with their tokens (argmax, Gumbel noise at
temperature > 0, never the MASK id), sorted best first by an error proxy: ``entropy``
(ascending), ``confidence`` (probability of the token, descending) or ``margin`` (top-1 minus
top-2 probability, descending). The step unmasks the largest sorted prefix U whose entropies
satisfy ``sum_U H - max_U H <= gamma`` (at least one: a single candidate gives 0).
``rule: released`` bounds ``sum_U H - H_last`` instead (the sum of all but the last one in
order), which is what the d2Cache release computes (its running maximum runs over the batch
axis); the two agree under the entropy ordering.

The sampler reads only the masked rows of its block, so every cache serves it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .parallel import BlockLoop, block_candidates

ERROR_PROXIES = ("entropy", "confidence", "margin")


def entropy_bound_accepts(sorted_entropy: Tensor, gamma: float, released: bool = False) -> Tensor:
    """How many of the candidates, in error-proxy order, the entropy bound accepts: the largest n
    with ``sum_{i<=n} H_i - max_{i<=n} H_i <= gamma`` (``released``: ``- H_n`` instead of the
    maximum); at least one of one or more, none of none. A 0-d tensor on the entropies' device
    (no host sync)."""
    total = torch.cumsum(sorted_entropy, 0)
    if released:
        bound = total - sorted_entropy
    else:
        bound = total - torch.cummax(sorted_entropy, 0).values
    # the bound never decreases along the order, so the passing n form a prefix; cumprod keeps
    # it one even where rounding would not
    return torch.cumprod((bound <= gamma).to(torch.int64), 0).sum()


def proxy_scores(probs: Tensor, log_probs: Tensor, tokens: Tensor, proxy: str) -> tuple[Tensor, Tensor]:
    """(entropy, score) per row of float64 ``probs``: the score sorts best first, descending."""
    entropy = -torch.where(probs > 0, probs * log_probs, 0.0).sum(-1)
    if proxy == "entropy":
        return entropy, -entropy
    if proxy == "confidence":
        return entropy, probs.gather(-1, tokens[:, None])[:, 0]
    top = torch.topk(probs, 2, dim=-1).values
    return entropy, top[:, 0] - top[:, 1]


class EBSampler(BlockLoop):
    def __init__(self, *, gamma: float, error_proxy: str, rule: str, block_length: int | None,
                 temperature: float):
        if error_proxy not in ERROR_PROXIES:
            raise ValueError(f"error_proxy must be one of {', '.join(ERROR_PROXIES)}")
        self.gamma, self.error_proxy, self.released = gamma, error_proxy, rule == "released"
        self.block_length_opt, self.temperature = block_length, temperature

    def step(self, x: Tensor, logits: Tensor) -> None:
        response = x[self.prompt_len:]
        lo, hi = self.block
        m = self.remaining
        masked, candidates, rows, tokens = block_candidates(
            response[lo:hi], logits[lo:hi], m, self.mask_id, self.temperature, self.generator)
        candidates = candidates + lo
        wide = rows.to(torch.float64)
        probs = torch.softmax(wide, dim=-1)
        entropy, score = proxy_scores(probs, torch.log_softmax(wide, dim=-1), tokens, self.error_proxy)
        order = torch.sort(score, descending=True, stable=True).indices
        n = entropy_bound_accepts(entropy[order], self.gamma, self.released)
        accepted = torch.empty_like(masked[:m])
        accepted[order] = torch.arange(m, device=response.device) < n  # the first n in order
        response[candidates] = torch.where(accepted, tokens, response[candidates])
        self.finish_step(response, n)
