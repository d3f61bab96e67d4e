"""The matched-state feedback intervention (Archer §6.3, Table 3, App. C.2; docs/ANALYSES.md).

A problem is decoded with the method until the first update that accepts a token with
confidence ``p >= threshold`` (the softmax probability of the accepted token under the logits
of that update) that the token still holds after the update; of several, the most confident
(then the leftmost). The complete decoder state right after that update is cloned twice
(``Decoding.clone``: sequence, sampler and its generator, cache):

- Fresh: the cache rebuilds its prompt K/V before the next update (``force_next(True)``), so the
  accepted token reaches the prompt representation at once;
- Cached: the next update reuses the prompt snapshot from before the acceptance
  (``force_next(False)``), whatever the refresh rule would decide.

After that one update both branches follow the method's own rule to the end. The selected
position is followed for ``follow`` updates (five in the paper): ``revised_at`` is the first
update (1-based, counted from the branch point) after which it no longer holds the token
(re-masked or replaced), None if it still does after ``follow`` updates.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..decode import Decoding, Observer, _sync
from .shadow import Action

BRANCHES = {"fresh": True, "cached": False}  # branch -> force_next(refresh)


@dataclass
class BranchPoint:
    update: int          # updates done when the state was cloned (the accepting update's count)
    position: int        # response position of the selected token (in the whole response)
    token: int
    confidence: float


class AcceptanceWatch(Observer):
    """Finds the branch point: the first update that accepts a token with confidence at least
    ``threshold`` which it still holds afterwards."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.found: BranchPoint | None = None

    def before_update(self, run: Decoding, logits: Tensor) -> None:
        # the sampler's view (the active block on a block-causal backbone): the logits' rows
        self.view, self.offset = run.active_response, run.active_offset
        self.before = self.view.to("cpu", copy=True)
        self.logits = logits

    def after_update(self, run: Decoding) -> None:
        after = self.view.cpu()  # (the block loop may have moved on to the next block)
        action = Action.of(run.sampler, self.before, after, run.model.cfg.mask_id)
        held = after[action.accepted] == action.tokens
        positions, tokens = action.accepted[held], action.tokens[held]
        if positions.numel() == 0:
            return
        rows = self.logits[positions.to(self.logits.device)].to(torch.float64)
        p = torch.softmax(rows, dim=-1).gather(-1, tokens.to(rows.device)[:, None])[:, 0].cpu()
        best = int(torch.argmax(p))  # the first maximum: the leftmost of equally confident ones
        if float(p[best]) >= self.threshold:
            self.found = BranchPoint(run.updates, self.offset + int(positions[best]),
                                     int(tokens[best]), float(p[best]))


@dataclass
class BranchResult:
    response: list[int]
    stats: dict
    time_s: float
    revised_at: int | None


def run_branch(state: Decoding, point: BranchPoint, refresh: bool, follow: int) -> BranchResult:
    """Continue a clone of ``state`` to the end with its next forward forced (``refresh``),
    following the selected token for ``follow`` updates."""
    run = state.clone()
    run.cache.force_next(refresh)
    device = run.model.device
    _sync(device)
    start = time.perf_counter()
    revised_at = None
    while not run.done:
        run.step()
        k = run.updates - point.update
        if revised_at is None and k <= follow and int(run.response[point.position]) != point.token:
            revised_at = k
    _sync(device)
    return BranchResult(run.response.tolist(), run.stats(), time.perf_counter() - start, revised_at)


@torch.inference_mode()
def intervene(model, sampler, cache, prompt_ids: Tensor, gen_len: int,
              generator: torch.Generator | None, threshold: float = 0.9,
              follow: int = 5) -> tuple[BranchPoint | None, dict[str, BranchResult]]:
    """The branch point of one problem and both branches' results (none without a branch point)."""
    run = Decoding(model, sampler, cache, prompt_ids, gen_len, generator)
    watch = AcceptanceWatch(threshold)
    while not run.done and watch.found is None:
        run.step(watch)
    if watch.found is None:
        return None, {}
    return watch.found, {name: run_branch(run, watch.found, refresh, follow)
                         for name, refresh in BRANCHES.items()}
