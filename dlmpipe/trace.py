"""The decode trace: every forward of a decode as one JSON-lines record (docs/METHODS.md,
"The decode trace"), to read a decode step by step and to compare it with a release's run.

``DecodeTrace`` is an ``Observer`` (dlmpipe/decode.py): pass it to ``decode(..., observer=)``
(``python -m dlmpipe decode ... --trace FILE`` does). It never changes the decode: it reads the
sequence before and after each update, the logits the sampler received, and what the sampler
and the cache record of their last call (``Sampler.last_confidence``, ``Cache.last_rows``,
``Cache.last_decision``); on a block-causal backbone also the prefill and commit forwards of the
block loop (``BlockState.log``). One record per forward, in order:

- ``forward``: its index in the decode (0, 1, ...); ``sample``: the caller's label, if any;
- ``kind``: ``prefill`` (the prompt's whole blocks), ``step`` (a denoising step: the cache's
  forward and the sampler's update) or ``commit`` (a finished block's K/V with its final tokens);
- ``block``: absolute rows ``[start, stop)`` of the active block (full attention: the sequence);
- ``sub_block`` (steps): absolute rows of the sampler's block, from ``Sampler.block_start``
  (prompt rows included where the sampler counts them: Fast-dLLM v2) to its last response row;
- ``rows``: the absolute rows the forward computed, as ``[start, stop)`` runs, or null where
  the cache does not record them; ``n_rows`` their number (block-causal: queries counted at
  layer 0, exact for every cache);
- ``full``: whether the step's forward was a full one (no cached path), null when unknown;
  ``why``: the cache's reason for its choice where it gives one (Fast-dLLM caches: "block
  start", "refresh_interval", "cached", Fast-dLLM v2's "sub-block's first position masked", ...);
- ``committed``: the positions the step changed, ascending, each ``{"pos", "token", "p",
  "confidence"}``: absolute position, its new token, the token's plain softmax probability under
  the logits the sampler read (float64), and the sampler's own confidence where it records one
  (SDAR's and Fast-dLLM v2's loops; their top-k/top-p or evaluation rule), else null. A commit
  forward of a shifted family lists the next block's first token (its greedy next token; ``p``
  null).
"""
from __future__ import annotations

import json
from typing import IO

import torch
from torch import Tensor

from .decode import Decoding, Observer


def runs(rows) -> list[list[int]]:
    """Ascending rows as ``[start, stop)`` runs."""
    out: list[list[int]] = []
    for r in sorted(int(v) for v in rows):
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        elif not out or out[-1][1] < r:
            out.append([r, r + 1])
    return out


class DecodeTrace(Observer):
    """Collects the records of one or more decodes (``records``), and writes each as a JSON line
    to ``sink`` when given (a path or a text file). ``sample`` labels the next records."""

    def __init__(self, sink: str | IO | None = None, sample=None):
        self.records: list[dict] = []
        self.sample = sample
        self._own = isinstance(sink, str)
        self._sink = open(sink, "w") if isinstance(sink, str) else sink
        self._run: Decoding | None = None

    def close(self) -> None:
        if self._own and self._sink is not None:
            self._sink.close()
            self._sink = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- records ----------------------------------------------------------------------------
    def _emit(self, record: dict) -> None:
        record = {"forward": self._forward, **({"sample": self.sample} if self.sample is not None
                                               else {}), **record}
        self._forward += 1
        self.records.append(record)
        if self._sink is not None:
            self._sink.write(json.dumps(record) + "\n")

    def _drain_blocks(self, run: Decoding) -> None:
        """The block loop's prefill and commit forwards since the last record."""
        if run.blocks is None:
            return
        state, n = run.blocks.state, run.blocks.state.n
        for kind, lo, stop, next_row in state.log:
            committed = []
            if next_row is not None:
                committed.append({"pos": next_row, "token": int(run.x[next_row]), "p": None,
                                  "confidence": None})
            self._emit({"kind": kind, "block": [lo // n * n, stop], "rows": [[lo, stop]],
                        "n_rows": stop - lo, "full": True, "why": None, "committed": committed})
        state.log.clear()

    def before_update(self, run: Decoding, logits: Tensor) -> None:
        if run is not self._run:  # a new decode
            self._run, self._forward = run, 0
            self._stats_seen = (None, 0)
        self._drain_blocks(run)
        sampler, cache = run.sampler, run.cache
        start = run.blocks.state.start if run.blocks is not None else 0
        seq = run.sequence
        p = run.active_prompt_len
        self._before = run.x.clone()
        self._logits = logits
        self._first = start + p  # absolute row of logits row 0
        lo, hi = sampler.block
        self._step = {
            "kind": "step", "block": [start, start + seq.shape[0]],
            "sub_block": [start + int(sampler.block_start), start + p + int(hi)]}
        stats = cache.stats
        before = self._stats_seen[1] if self._stats_seen[0] is stats else 0
        cached = stats.cached_forwards - before
        rows = cache.last_rows
        if rows is not None:
            rows = runs((rows + start).tolist())
        elif cached == 0 and cache.last_decision is None:
            rows = [[start, start + seq.shape[0]]]  # a full forward over the (active) sequence
        if run.blocks is not None:
            n_rows = run.blocks.block_model.query_rows
        else:
            n_rows = sum(b - a for a, b in rows) if rows is not None else None
        self._step.update({"rows": rows, "n_rows": n_rows, "full": cached == 0,
                           "why": cache.last_decision})
        self._stats_seen = (stats, stats.cached_forwards)
        sampler.last_confidence = None

    def after_update(self, run: Decoding) -> None:
        a, b = self._step["block"]  # (a commit's next token belongs to the commit's record)
        changed = [pos for pos in (run.x != self._before).nonzero()[:, 0].tolist() if a <= pos < b]
        conf = run.sampler.last_confidence
        committed = []
        for pos in changed:
            i = pos - self._first  # its logits row
            token = int(run.x[pos])
            entry = {"pos": pos, "token": token, "p": None, "confidence": None}
            if 0 <= i < self._logits.shape[0]:
                row = self._logits[i].to(torch.float64)
                entry["p"] = float(torch.softmax(row, -1)[token])
            if conf is not None and 0 <= i - conf[0] < conf[1].shape[0]:
                entry["confidence"] = float(conf[1][i - conf[0]])
            committed.append(entry)
        self._emit({**self._step, "committed": committed})
        run.cache.last_rows = None
        run.cache.last_decision = None
        self._logits = None
        if run.done:
            self._drain_blocks(run)  # (the last block is not committed: nothing left)
