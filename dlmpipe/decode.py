"""The decode loop: one sample, a sampler and a cache meeting at the seam (docs/ARCHITECTURE.md).

Per step: the cache learns which positions the sampler will decode when they are fixed in
advance (``note_due_positions``), computes the response logits of the current state
(``response_logits``; it owns every reuse and refresh decision), and the sampler turns them
into the next state (``step``; it never calls the model). The loop ends when the sampler is
done. Time is synchronized wall time of the whole generation (docs/METHODS.md, measurement).

Time to first token (``ttft_s``) is the synchronized time from the same start until the end of
the first step after which some response position holds a token (is no longer the mask): the
prefill forward, the first step's sampler update, and any steps that committed nothing. To find
that step the loop reads back one boolean per step until it flips (a host sync on CUDA), and none
after: LLaDA-style schedules, the parallel rules and Saber commit in their first step, so this is
one read-back per generation; a schedule that commits nothing in its first steps (Dream's, with
as many steps as tokens) adds one per step until its first commit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .backbones.model import Backbone
from .engine.base import Cache
from .samplers.base import Sampler


@dataclass
class DecodeResult:
    response: Tensor              # [G] final response token ids
    time_s: float                 # synchronized wall time of the whole generation
    ttft_s: float = float("nan")  # synchronized time until the first response token is committed
    stats: dict = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode(model: Backbone, sampler: Sampler, cache: Cache, prompt_ids: Tensor, gen_len: int,
           generator: torch.Generator | None = None) -> DecodeResult:
    """Decode one sample: ``prompt_ids [P]`` -> response ``[G]`` (batch size 1)."""
    device = model.device
    P = prompt_ids.shape[0]
    x = torch.cat([prompt_ids.to(device),
                   torch.full((gen_len,), model.cfg.mask_id, dtype=torch.long, device=device)])
    _sync(device)
    start = time.perf_counter()
    sampler.begin(P, gen_len, model.cfg.mask_id, generator, device)
    cache.begin(x, P)
    first_token_at = None
    while not sampler.done:
        cache.note_due_positions(sampler.due_positions())
        logits = cache.response_logits(x, sampler.block)
        sampler.step(x, logits)
        if first_token_at is None and bool((x[P:] != model.cfg.mask_id).any()):
            _sync(device)  # the read-back above waited for this stream; other streams too
            first_token_at = time.perf_counter()
    _sync(device)
    end = time.perf_counter()
    elapsed = end - start
    ttft = (first_token_at if first_token_at is not None else end) - start
    stats = {**sampler.stats(), **cache.stats.as_dict(), **cache.extra_stats()}
    return DecodeResult(response=x[P:].cpu(), time_s=elapsed, ttft_s=ttft, stats=stats)
