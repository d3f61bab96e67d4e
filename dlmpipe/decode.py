"""The decode loop: one sample, a sampler and a cache meeting at the seam (docs/ARCHITECTURE.md).

Per step: the cache learns which positions the sampler will decode when they are fixed in
advance (``note_due_positions``) and which block's shadow rows it reads (``note_shadow_block``,
WINO's verification queries: appended after the response rows), computes the response logits of the current state
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

``Decoding`` is that loop's state between two updates (sequence, sampler, cache, the sampler's
random generator); ``Decoding.clone`` snapshots it so that the clone resumes exactly as the
original would (docs/ANALYSES.md: the shadow probe and the matched-state intervention start
from such clones). An ``Observer`` sees every update without taking part in it.

On a block-causal backbone (``BackboneConfig.block_size``) the same loop decodes one active
block at a time: the sampler and the cache see the block as their sequence, over the exact K/V
of the finished prefix (dlmpipe/blockwise.py); ``x`` then covers whole blocks.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .backbones.model import Backbone
from .blockwise import BlockCausal, BlockModel, padded_length
from .engine.base import Cache
from .samplers.base import Sampler


@dataclass
class DecodeResult:
    response: Tensor              # [G] final response token ids
    time_s: float                 # synchronized wall time of the whole generation
    ttft_s: float = float("nan")  # synchronized time until the first response token is committed
    stats: dict = field(default_factory=dict)


class Observer:
    """Sees each update of a ``Decoding``: the logits the cache computed, before the sampler
    steps, and the state after. It must not change the decoding (docs/ANALYSES.md)."""

    def before_update(self, run: "Decoding", logits: Tensor) -> None:
        """After the cache's forward, before the sampler's step (``run.x`` is the state the
        logits were computed for)."""

    def after_update(self, run: "Decoding") -> None:
        """After the sampler's step (``run.x`` is the next state)."""


class Decoding:
    """One sample's decoder state between updates: the sequence ``x [P + G]``, the sampler and
    the cache (the sampler holds the sample's generator). Build it, ``step`` until ``done``."""

    def __init__(self, model: Backbone, sampler: Sampler, cache: Cache, prompt_ids: Tensor,
                 gen_len: int, generator: torch.Generator | None = None):
        if isinstance(model, BlockModel):  # a cache's stand-in from its last sample
            model = model.inner
        device = model.device
        self.model, self.sampler, self.cache = model, sampler, cache
        self.prompt_len, self.gen_len = prompt_ids.shape[0], gen_len
        n = model.cfg.block_size
        length = self.prompt_len + gen_len if n is None else padded_length(self.prompt_len + gen_len, n)
        self.x = torch.cat([prompt_ids.to(device),
                            torch.full((length - self.prompt_len,), model.cfg.mask_id,
                                       dtype=torch.long, device=device)])
        self.updates = 0
        #: the block loop on a block-causal backbone (dlmpipe/blockwise.py), else None
        self.blocks: BlockCausal | None = None
        if n is None:
            sampler.begin(self.prompt_len, gen_len, model.cfg.mask_id, generator, device)
            cache.begin(self.x, self.prompt_len)
        else:
            stops = model.cfg.stop_ids + ([model.cfg.pad_id] if model.cfg.pad_id is not None else [])
            self.blocks = BlockCausal(model, sampler, cache, self.x, self.prompt_len, gen_len,
                                      generator, stops)

    @property
    def done(self) -> bool:
        return self.sampler.done if self.blocks is None else self.blocks.done

    @property
    def response(self) -> Tensor:
        """The current response state ``[G]`` (a view of ``x``)."""
        return self.x[self.prompt_len:self.prompt_len + self.gen_len]

    @property
    def sequence(self) -> Tensor:
        """What the sampler and the cache see: ``x``, or the active block's view of it."""
        return self.x if self.blocks is None else self.blocks.active

    # The sampler's view, for what inspects a decode between updates (the analyses' probes): on
    # a block-causal backbone the sampler's actions, the cache's logits and a full forward are
    # over the active block only (dlmpipe/blockwise.py); elsewhere over the whole response.
    @property
    def active_model(self):
        """The model the cache runs on: the backbone, or the active block's ``BlockModel`` (a
        full forward over ``sequence`` with it attends to the finished prefix's exact K/V)."""
        return self.model if self.blocks is None else self.blocks.block_model

    @property
    def active_prompt_len(self) -> int:
        """Rows of ``sequence`` before the positions the sampler decodes."""
        return self.prompt_len if self.blocks is None else self.blocks.active_prompt

    @property
    def active_response(self) -> Tensor:
        """The positions the sampler decodes now (a view of ``x``): the logits' rows."""
        return self.sequence[self.active_prompt_len:]

    @property
    def active_offset(self) -> int:
        """Where ``active_response`` starts in ``response``."""
        if self.blocks is None:
            return 0
        return self.blocks.state.start + self.blocks.active_prompt - self.prompt_len

    @contextlib.contextmanager
    def uncounted(self):
        """A probe's own forwards inside are not counted among the rows the decode computed
        (``rows_computed`` on a block-causal backbone: the ``BlockModel`` counts its queries)."""
        if self.blocks is None:
            yield
            return
        block_model = self.blocks.block_model
        saved = block_model.query_rows
        try:
            yield
        finally:
            block_model.query_rows = saved

    def step(self, observer: Observer | None = None) -> None:
        """One update: the cache's logits for the current state, then the sampler's step."""
        sampler, cache = self.sampler, self.cache
        cache.note_due_positions(sampler.due_positions())
        cache.note_shadow_block(sampler.shadow_block())
        cache.note_block_start(sampler.block_start)
        seq = self.sequence
        logits = cache.response_logits(seq, sampler.block)
        if observer is not None:
            observer.before_update(self, logits)
        sampler.step(seq, logits)
        self.updates += 1
        if self.blocks is not None:
            self.blocks.after_update(self.x)
        if observer is not None:
            observer.after_update(self)

    def stats(self) -> dict:
        if self.blocks is not None:
            return self.blocks.stats()
        cache = self.cache
        return {**self.sampler.stats(), **cache.stats.as_dict(), **cache.extra_stats()}

    def clone(self) -> "Decoding":
        """An independent copy of this state (sequence, sampler with its generator's state,
        cache with its K/V, anchors and statistics) sharing the model's weights: stepping the
        clone gives exactly what stepping the original would, and neither disturbs the other."""
        return copy.deepcopy(self, memo=shared_model_memo(self.model))


def shared_model_memo(model: Backbone) -> dict:
    """A ``copy.deepcopy`` memo that keeps the model, its parameters and buffers shared."""
    memo: dict = {id(model): model}
    for t in (*model.parameters(), *model.buffers()):
        memo[id(t)] = t
    return memo


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode(model: Backbone, sampler: Sampler, cache: Cache, prompt_ids: Tensor, gen_len: int,
           generator: torch.Generator | None = None, observer: Observer | None = None) -> DecodeResult:
    """Decode one sample: ``prompt_ids [P]`` -> response ``[G]`` (batch size 1)."""
    device = model.device
    _sync(device)
    start = time.perf_counter()
    run = Decoding(model, sampler, cache, prompt_ids, gen_len, generator)
    first_token_at = None
    while not run.done:
        run.step(observer)
        if first_token_at is None and bool((run.response != model.cfg.mask_id).any()):
            _sync(device)  # the read-back above waited for this stream; other streams too
            first_token_at = time.perf_counter()
    _sync(device)
    end = time.perf_counter()
    elapsed = end - start
    ttft = (first_token_at if first_token_at is not None else end) - start
    return DecodeResult(response=run.response.cpu(), time_s=elapsed, ttft_s=ttft, stats=run.stats())
