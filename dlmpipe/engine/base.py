"""The cache side of the sampler/cache seam.

A cache turns the current sequence into the response logits the sampler reads and owns every
reuse and refresh decision; it never decides tokens. ``block`` is the sampler's current block
in response coordinates ``(lo, hi)``; block-wise caches use it, others ignore it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from torch import Tensor

from ..backbones.model import Backbone
from ..graphs import check_mode


@dataclass
class CacheStats:
    nfe: int = 0               # every model evaluation (number of function evaluations)
    cached_forwards: int = 0   # evaluations served by a cached (partial) path
    refreshes: int = 0         # full forwards that rebuilt the cache after the first one

    def as_dict(self) -> dict:
        return {"nfe": self.nfe, "cached_forwards": self.cached_forwards,
                "refreshes": self.refreshes}


class Cache(ABC):
    """Base class: subclasses implement ``response_logits``.

    Which response rows a cache serves fresh logits for is declared in dlmpipe.registry
    (``rows``): ``all_rows`` for most caches; ``block_rows`` / ``masked_rows`` for caches that
    give queries to some rows only (Fast-dLLM, dKV-Cache): only the masked rows of the current
    block that the next update may decode are guaranteed (all of them, or the sampler's
    ``due_positions`` when it announces them); the rows a call does not serve hold NaN. The
    returned tensor may be a buffer the cache reuses (row caches, captured steps), valid until
    its next call.

    Inside ``response_logits`` a cache reads nothing back to the host except what its own
    decision needs (Archer's distance controller: the distance; dKV-Cache: the sizes of the row
    sets); its state stays on the model's device.
    """

    compile_mode = "none"
    #: computes a sampler's shadow rows (``note_shadow_block``; dlmpipe.registry ``shadow_rows``)
    shadow_rows = False
    #: the response block whose shadow rows the next ``response_logits`` appends, or None
    shadow: tuple[int, int] | None = None
    #: the sequence row where the sampler's block begins, its prompt rows included
    #: (``note_block_start``)
    block_start: int | None = None
    #: what the last ``response_logits`` did, for the decode trace (dlmpipe/trace.py): the
    #: absolute rows it gave queries (None: not recorded by this cache) and why it ran a full
    #: forward or a cached one (None: the cache does not say)
    last_rows: Tensor | None = None
    last_decision: str | None = None

    def __init__(self, model: Backbone):
        self.model = model
        self.prompt_len = 0
        self.stats = CacheStats()

    def use_compile(self, mode: str) -> None:
        """How the cache's fixed-shape cached step runs: ``none``, ``cuda_graphs`` or
        ``torch_compile`` (dlmpipe/graphs.py; the campaign key ``compile``). Caches without such
        a step (all but Archer so far) run eagerly whatever the mode."""
        self.compile_mode = check_mode(mode)

    def begin(self, x: Tensor, prompt_len: int) -> None:
        """Start a new sample whose sequence is ``x [N]`` with the prompt in ``x[:prompt_len]``."""
        self.prompt_len = prompt_len
        self.stats = CacheStats()

    def note_due_positions(self, due: Tensor | None) -> None:
        """Called by the decode loop before each ``response_logits`` with the sampler's
        ``due_positions()`` (response positions the next update will decode, or None when the
        logits decide). Caches that recompute only what is due (dKV-Cache greedy) keep it;
        the default ignores it."""

    def note_block_start(self, row: int) -> None:
        """Called by the decode loop before each ``response_logits`` with the sampler's
        ``block_start``: the row where its block begins, prompt rows included (Fast-dLLM v2's
        sub-blocks start in the prompt; its cache tests that row, engine/fast_dllm.py)."""
        self.block_start = row

    def note_shadow_block(self, block: tuple[int, int] | None) -> None:
        """Called by the decode loop before each ``response_logits`` with the sampler's
        ``shadow_block()``: response positions ``[lo, hi)`` whose leave-one-out verification
        logits (WINO's shadow block, ``engine/shadow.py``) the next ``response_logits`` appends
        after the ``G`` response rows (``[G + hi - lo, V]``), or None (the default: ``[G, V]``).
        Caches that compute them set ``shadow_rows``; the registry refuses the others at config
        time, and this refuses them here too."""
        if block is not None and not self.shadow_rows:
            raise NotImplementedError(f"{type(self).__name__} does not compute shadow rows")
        self.shadow = block

    @abstractmethod
    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        """Logits ``[G, V]`` for the response positions, as the sampler reads them (shifted),
        followed by the noted shadow block's verification logits when there is one."""

    def force_next(self, refresh: bool) -> None:
        """The matched-state intervention (docs/ANALYSES.md): make the next forward rebuild the
        cached state (``refresh``) or reuse the current snapshot (not ``refresh``), whatever the
        refresh rule would decide; later forwards follow the rule again. Caches that support
        it say so in dlmpipe.registry (``feedback_intervention``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot force its next forward "
                                  "(no prompt snapshot to keep or rebuild)")

    def extra_stats(self) -> dict:
        """Method-specific statistics recorded with each sample (e.g. distances at refresh)."""
        return {}
