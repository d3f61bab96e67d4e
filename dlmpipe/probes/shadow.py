"""The shadow-forward probe (Archer §6.4, Table 4; docs/ANALYSES.md).

At a probed update the cache has just computed its (possibly cached) logits for the state
``x_t``. The probe also computes the fresh logits of one full forward over the identical state
(the backbone directly: the cache's K/V, anchor, refresh state and statistics are untouched),
steps a deep copy of the sampler (its generator included, so the same random draws) on them,
and after the main update compares the two actions and next states:

- anchor distance ``D_t``: Hamming distance between the response and the anchor, the response
  at the last update whose forward was not cached (Archer: the cache's own anchor);
- cache age ``A_t``: updates since that anchor (Archer: ``updates_since_refresh``);
- action: the accepted positions with their tokens and the re-masked positions (Saber records
  them; other samplers' actions are read off the states before and after the update);
- next-state distance: Hamming distance between the two next response states;
- logit drift: ``max |z_fresh - z_cached|`` (the ``||.||_inf`` of Archer's bound, eq. 11) and
  the mean absolute difference, over the response rows the cache served (finite rows).

The main trajectory is not changed: no token, confidence, refresh decision, random draw, step
or NFE (tests/test_probes.py compares a probed run with an unprobed one).
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import pyarrow as pa
import torch
from torch import Tensor

from ..decode import Decoding, Observer, shared_model_memo
from ..engine.full import full_response_logits
from ..samplers.base import Sampler

PROBE_STEPS = ("cached", "all")

PROBE_SCHEMA = pa.schema([
    ("sample_index", pa.int64()), ("task_id", pa.string()), ("update", pa.int64()),
    ("cached", pa.bool_()), ("anchor_distance", pa.int64()), ("cache_age", pa.int64()),
    ("masked", pa.int64()),
    ("accepted_cached", pa.int64()), ("accepted_fresh", pa.int64()),
    ("remasked_cached", pa.int64()), ("remasked_fresh", pa.int64()),
    ("accepted_differs", pa.bool_()), ("tokens_differ", pa.bool_()),
    ("remasked_differs", pa.bool_()), ("action_differs", pa.bool_()),
    ("next_state_distance", pa.int64()),
    ("logit_drift_max", pa.float64()), ("logit_drift_mean", pa.float64()),
])


@dataclass
class Action:
    """One update's decision: accepted positions (ascending) with their tokens, re-masked
    positions (ascending); response coordinates."""
    accepted: Tensor
    tokens: Tensor
    remasked: Tensor

    @classmethod
    def of(cls, sampler: Sampler, before: Tensor, after: Tensor, mask_id: int) -> "Action":
        if sampler.last_action is not None:
            mask, written, remasked = sampler.last_action
            accepted = mask.cpu().nonzero()[:, 0]
            tokens = written.cpu()[accepted]
            remasked = accepted[:0] if remasked is None else remasked.cpu()
        else:  # samplers that only unmask: what changed to a token, what became a mask
            changed = before != after
            accepted = (changed & (after != mask_id)).nonzero()[:, 0]
            tokens = after[accepted]
            remasked = (changed & (after == mask_id)).nonzero()[:, 0]
        order = accepted.argsort()
        return cls(accepted[order], tokens[order], remasked.sort().values)


def hamming(a: Tensor, b: Tensor) -> int:
    return int((a != b).sum())


class ShadowProbe(Observer):
    """Probes cached updates (``steps="cached"``, the paper's) or every update (``"all"``: at
    refresh updates the fresh and the cache's logits come from the same full forward, a check
    of the instrument), each with probability ``rate`` drawn from a private generator seeded by
    ``seed`` and the sample (never the sampler's)."""

    def __init__(self, rate: float = 1.0, steps: str = "cached", seed: int = 0):
        if not 0 < rate <= 1:
            raise ValueError(f"shadow probe rate must be in (0, 1] (got {rate!r})")
        if steps not in PROBE_STEPS:
            raise ValueError(f"shadow probe steps must be one of {', '.join(PROBE_STEPS)} (got {steps!r})")
        self.rate, self.steps, self.seed = rate, steps, seed
        self.start("")

    def start(self, sample_key: str) -> "ShadowProbe":
        """Reset for a new sample; the probed updates depend on ``seed`` and ``sample_key``."""
        self.rng = random.Random(f"{self.seed}:{sample_key}")
        self.records: list[dict] = []
        self.anchor: Tensor | None = None
        self.anchor_update = 0
        self.cached_seen = 0
        self.view_offset = 0
        self.pending: dict | None = None
        return self

    def before_update(self, run: Decoding, logits: Tensor) -> None:
        # the sampler's view: the active block on a block-causal backbone, whose cache starts
        # afresh (statistics, anchor) with each block
        t, response = run.updates, run.active_response
        if run.active_offset != self.view_offset:
            self.view_offset, self.cached_seen, self.anchor = run.active_offset, 0, None
        served = run.cache.stats.cached_forwards
        cached, self.cached_seen = served > self.cached_seen, served
        distance = 0 if self.anchor is None else hamming(response, self.anchor)
        age = t - self.anchor_update
        if not cached:  # a full forward: the state it saw is the new anchor
            self.anchor, self.anchor_update = response.clone(), t
        self.pending = None
        if not (cached or self.steps == "all") or self.rng.random() >= self.rate:
            return
        model, seq, p_len = run.active_model, run.sequence, run.active_prompt_len
        with run.uncounted():
            fresh = full_response_logits(model, seq, p_len, run.sampler.shadow_block())
        shadow = copy.deepcopy(run.sampler, shared_model_memo(run.model))
        x_fresh = seq.clone()
        shadow.step(x_fresh, fresh)
        before = response.to("cpu", copy=True)  # the main update changes response in place
        fresh_next = x_fresh[p_len:].cpu()
        served_rows = torch.isfinite(logits).all(-1)
        diff = (fresh[served_rows].float() - logits[served_rows].float()).abs()
        self.pending = {
            "view": response,  # the positions this update decodes (a view of the sequence)
            "update": t, "cached": cached, "anchor_distance": distance, "cache_age": age,
            "masked": int((before == run.model.cfg.mask_id).sum()),
            "before": before, "fresh_next": fresh_next,
            "fresh": Action.of(shadow, before, fresh_next, run.model.cfg.mask_id),
            "logit_drift_max": float(diff.max()) if diff.numel() else 0.0,
            "logit_drift_mean": float(diff.mean()) if diff.numel() else 0.0,
        }

    def after_update(self, run: Decoding) -> None:
        p, self.pending = self.pending, None
        if p is None:
            return
        main_next = p.pop("view").cpu()  # (the block loop may have moved on to the next block)
        main = Action.of(run.sampler, p.pop("before"), main_next, run.model.cfg.mask_id)
        fresh: Action = p.pop("fresh")
        accepted_differs = not torch.equal(main.accepted, fresh.accepted)
        tokens_differ = not accepted_differs and not torch.equal(main.tokens, fresh.tokens)
        remasked_differs = not torch.equal(main.remasked, fresh.remasked)
        self.records.append({
            **{k: p[k] for k in ("update", "cached", "anchor_distance", "cache_age", "masked")},
            "accepted_cached": main.accepted.numel(), "accepted_fresh": fresh.accepted.numel(),
            "remasked_cached": main.remasked.numel(), "remasked_fresh": fresh.remasked.numel(),
            "accepted_differs": accepted_differs, "tokens_differ": tokens_differ,
            "remasked_differs": remasked_differs,
            "action_differs": accepted_differs or tokens_differ or remasked_differs,
            "next_state_distance": hamming(main_next, p.pop("fresh_next")),
            "logit_drift_max": p["logit_drift_max"], "logit_drift_mean": p["logit_drift_mean"],
        })


def probes_table(rows: list[dict]) -> pa.Table:
    """The probes of finished generation rows (each with ``probes``), one row per probe."""
    flat = [{"sample_index": r["sample_index"], "task_id": r["task_id"], **probe}
            for r in rows for probe in r.get("probes", [])]
    return pa.Table.from_pylist(flat, schema=PROBE_SCHEMA)
