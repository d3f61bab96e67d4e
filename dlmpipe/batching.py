"""Batched decoding: many samples of a job decoded together, each exactly as it decodes alone.

The sampler/cache seam stays per sample: a job at batch size B keeps B *slots*, each with its
own sampler and cache, so every per-row state (steps, blocks, rollbacks, refresh decisions,
selected rows, finished rows) is per sample by construction. Each slot's caches are built over
a ``SlotModel``, a stand-in of the shared ``Backbone`` whose leaf compute primitives (embedding,
attention input norm, query/key/value projections with RoPE, attention, attention maps,
attention output, FFN, head) do not compute: they hand their request to the ``BatchScheduler``
and wait (each slot's decode runs in a greenlet). ``qkv`` and ``project_qkv`` are batched
whole too (one request instead of four: the scheduler's per-request cost is what a CPU pays).
Composite methods (``layer``, ``hidden_states``, ``hidden_states_storing_kv``, ...) are
Backbone's own code run on the stand-in, so they reach the leaves through it. Once every live
slot waits, the scheduler runs the furthest-behind step of the forward pass (``_LAYER_ORDER``:
embedding, then per layer norm and projections, attention, output, FFN, then the head), so slots that drifted apart fall back into step, as one call per
(primitive, layer) over the slots' rows concatenated along the row axis: every slot keeps its
own rows at its own positions, so prompts of different lengths need no padding.

Row-wise primitives (norms, projections, FFN, head, embedding) are bitwise row-invariant on the
CPU at any thread count by construction: the Backbone runs them in calls of one fixed shape
(dlmpipe/backbones/rowwise.py). Attention is not row-wise: slots whose queries and keys have the
same shapes are stacked along the batch axis (SDPA's CPU kernel computes each batch entry and
head as its own task, over query chunks of one fixed size: rowwise.attend); other shapes run as
their own calls. Padding keys with a key mask is
not bitwise-safe (measured on the CPU: the masked kernel changes the last bits), so it is only
used on CUDA in bf16/fp16 (``pad_attention``), where one call beats many launches and batch
invariance is not bitwise anyway (the device check reports the fraction of identical samples);
float32 on CUDA keeps the exact per-shape calls.

Continuous batching: when a slot's sample finishes, the slot begins the job's next sample, so
the batch stays full until the job runs out of samples. A sample's ``time_s`` is its own
latency inside the batch (from its slot's begin to its last update; docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from greenlet import getcurrent, greenlet
from torch import Tensor

from .backbones.model import Backbone
from .decode import DecodeResult, Decoding, Observer, _sync

#: devices where attention over different key lengths is batched with padded keys and a mask
#: (half precision only: see the module docstring)
PAD_ATTENTION_DEVICES = ("cuda",)

#: per-layer order of the leaf primitives (the scheduler runs the smallest rank first)
_LAYER_ORDER = {"qkv": 0, "attn_input": 0, "project_qkv": 1, "queries": 1, "keys": 2, "values": 3,
                "attend": 4, "attention_probs": 5, "attn_output": 6, "ffn": 7}


def default_batch_size(device: torch.device | str) -> int:
    """``batch_size: auto``: 16 on CUDA (a cached step of a few rows leaves the device idle at
    batch 1; 16 slots of an 8B model's K/V at 2k tokens are ~16 GB, beside its 16 GB of bf16
    weights on an 80 GB card; set it lower on smaller cards or longer sequences), 8
    on the CPU (the per-call cost a small model pays at batch 1 is mostly shared by then; a CPU
    core's matrix products are near compute-bound already, so more slots add little:
    docs/ARCHITECTURE.md, performance shape). The numbers: batch_size.AUTO."""
    from .batch_size import default_batch_size as auto

    return auto(torch.device(device))


@dataclass(slots=True)
class _Request:
    prim: str
    layer: int
    args: tuple
    rank: tuple


class BatchScheduler:
    """Runs the slots' greenlets and their leaf requests, grouped into batched calls."""

    def __init__(self, model: Backbone, pad_attention: bool | None = None):
        self.model = model
        self.pad_attention = (model.device.type in PAD_ATTENTION_DEVICES
                              and model.embed.weight.dtype != torch.float32
                              if pad_attention is None else pad_attention)
        self.calls = 0      # batched calls run (statistics, tests)
        self.requests = 0   # leaf requests served

    # ---- from a slot --------------------------------------------------------------------
    def request(self, prim: str, layer: int, *args):
        """Called from a slot's greenlet: wait until the scheduler has run ``prim`` on it."""
        if prim == "embed":
            rank = (-1, 0)
        elif prim == "logits":
            rank = (self.model.cfg.n_layers, 0)
        else:
            rank = (layer, _LAYER_ORDER[prim])
        return getcurrent().parent.switch(_Request(prim, layer, args, rank))

    # ---- the loop -----------------------------------------------------------------------
    def run(self, bodies: list[Callable[[], None]]) -> None:
        """Run each body (a slot's work) in its own greenlet until all return (an exception in
        one propagates here and ends the run)."""
        pending: dict[greenlet, _Request] = {}
        for body in bodies:
            g = greenlet(body)
            self._advance(g, g.switch(), pending)
        while pending:
            lowest = min(r.rank for r in pending.values())
            group = [(g, r) for g, r in pending.items() if r.rank == lowest]
            by_prim: dict[str, list] = {}
            for g, r in group:
                by_prim.setdefault(r.prim, []).append((g, r))
            for prim, items in by_prim.items():
                results = self._run(prim, [r for _, r in items])
                for (g, _), res in zip(items, results):
                    del pending[g]
                    self._advance(g, g.switch(res), pending)

    @staticmethod
    def _advance(g, req, pending: dict) -> None:
        if not g.dead:
            pending[g] = req

    # ---- batched calls --------------------------------------------------------------------
    def _run(self, prim: str, reqs: list[_Request]) -> list:
        self.requests += len(reqs)
        m = self.model
        if prim in ("attend", "attention_probs"):
            return self._attention(prim, reqs)
        self.calls += 1
        layer = reqs[0].layer
        if len(reqs) == 1:
            return [_leaf(m, prim, layer, reqs[0].args)]
        if prim == "embed":  # ids [1, T] -> [1, T, d]
            ids = [r.args[0] for r in reqs]
            out = m.embed(torch.cat([i.reshape(1, -1) for i in ids], dim=1))
            return [o.reshape(*i.shape, o.shape[-1])
                    for o, i in zip(out.split([i.numel() for i in ids], dim=1), ids)]
        xs = [r.args[0] for r in reqs]
        counts = [x.numel() // x.shape[-1] for x in xs]
        flat = torch.cat([x.reshape(1, -1, x.shape[-1]) for x in xs], dim=1)
        if prim in ("queries", "keys", "qkv", "project_qkv"):
            ropes = [r.args[1] for r in reqs]
            rope = (torch.cat([c for c, _ in ropes]), torch.cat([s for _, s in ropes]))
            out = getattr(m, prim)(layer, flat, rope)  # heads [1, H, sum T, hd] (or q, k, v)
            if prim in ("queries", "keys"):
                return list(out.split(counts, dim=2))
            return list(zip(*(t.split(counts, dim=2) for t in out)))
        if prim == "values":
            return list(m.values(layer, flat).split(counts, dim=2))
        out = _leaf(m, prim, layer, (flat,))
        return [o.reshape(*x.shape[:-1], o.shape[-1]) for o, x in zip(out.split(counts, dim=1), xs)]

    def _attention(self, prim: str, reqs: list[_Request]) -> list:
        """Stack same-shaped calls along the batch axis (bitwise-safe); on CUDA also pad keys."""
        m = self.model
        out: list = [None] * len(reqs)
        groups: dict[tuple, list[int]] = {}
        if self.pad_attention and prim == "attend":  # one call, padded where shapes differ
            groups[()] = list(range(len(reqs)))
        else:
            for i, r in enumerate(reqs):
                groups.setdefault((r.args[0].shape, r.args[1].shape), []).append(i)
        for idx in groups.values():
            self.calls += 1
            args = [reqs[i].args for i in idx]
            if len(idx) == 1:
                res = [getattr(m, prim)(*args[0])]
            elif len({a[1].shape for a in args}) == 1 and len({a[0].shape for a in args}) == 1:
                stacked = [torch.cat([a[j] for a in args]) for j in range(len(args[0]))]
                res = list(getattr(m, prim)(*stacked).split(1))
            else:
                res = _padded_attend(m, args)
            for i, r in zip(idx, res):
                out[i] = r
        return out


def _leaf(m: Backbone, prim: str, layer: int, args: tuple):
    if prim == "embed":
        return m.embed(*args)
    if prim == "logits":
        return m.logits(*args)
    return getattr(m, prim)(layer, *args)


def _padded_attend(m: Backbone, args: list[tuple]) -> list[Tensor]:
    """Attention of calls with different query/key lengths in one SDPA call: queries and keys
    padded to the longest, padded keys masked out, padded query rows dropped (CUDA only)."""
    import torch.nn.functional as F

    tq = max(a[0].shape[2] for a in args)
    tk = max(a[1].shape[2] for a in args)

    def pad(t: Tensor, n: int) -> Tensor:
        return F.pad(t, (0, 0, 0, n - t.shape[2]))

    q = torch.cat([pad(a[0], tq) for a in args])
    k = torch.cat([pad(a[1], tk) for a in args])
    v = torch.cat([pad(a[2], tk) for a in args])
    lengths = torch.tensor([a[1].shape[2] for a in args], device=q.device)
    mask = (torch.arange(tk, device=q.device)[None, :] < lengths[:, None])[:, None, None, :]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                       enable_gqa=m.cfg.n_heads != m.cfg.n_kv_heads)
    b, h, t, hd = o.shape
    o = o.transpose(1, 2).reshape(b, t, h * hd)
    return [o[i:i + 1, :a[0].shape[2]] for i, a in enumerate(args)]


class _Embed:
    """The stand-in's ``embed``: callable like the module, with its ``weight``."""

    def __init__(self, scheduler: BatchScheduler, module):
        self.scheduler, self.module = scheduler, module

    @property
    def weight(self) -> Tensor:
        return self.module.weight

    def __call__(self, ids: Tensor) -> Tensor:
        return self.scheduler.request("embed", -1, ids)


class SlotModel:
    """One slot's stand-in for the shared ``Backbone`` (module docstring): the leaves wait for
    the scheduler's batched call, everything else is Backbone's own code or data."""

    # Backbone's composite methods, run on the stand-in so that they reach its leaves (qkv and
    # project_qkv are composites too, but batched whole: one request instead of three or four)
    layer = Backbone.layer
    hidden_states = Backbone.hidden_states
    hidden_states_storing_kv = Backbone.hidden_states_storing_kv
    response_logits_from_rows = Backbone.response_logits_from_rows
    first_logit_row = Backbone.first_logit_row
    shift = Backbone.shift
    split_heads = Backbone.split_heads
    apply_rope = staticmethod(Backbone.apply_rope)

    def __init__(self, model: Backbone, scheduler: BatchScheduler):
        self.backbone, self.scheduler = model, scheduler
        self.cfg = model.cfg
        self.embed = _Embed(scheduler, model.embed)
        self.blocks = model.blocks  # read directly by some identifiers (unbatched, per slot)
        self.final_norm, self.head = model.final_norm, model.head
        self._layer = -1  # the layer of this slot's last layered request (attention's rank)

    @property
    def device(self) -> torch.device:
        return self.backbone.device

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.backbone.rope(positions)

    def parameters(self):
        return self.backbone.parameters()

    def buffers(self):
        return self.backbone.buffers()

    def __getattr__(self, name: str):
        """Anything else of the Backbone (a primitive added later, a helper): the backbone's own,
        run unbatched on this slot's rows, which is what batch 1 computes."""
        if name.startswith("__") or name == "backbone":  # copying/pickling an unset instance
            raise AttributeError(name)
        return getattr(self.backbone, name)

    def __call__(self, input_ids: Tensor) -> Tensor:
        return self.forward(input_ids)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.logits(self.hidden_states(input_ids))

    def _ask(self, prim: str, layer: int, *args):
        self._layer = layer
        return self.scheduler.request(prim, layer, *args)

    def qkv(self, layer: int, h: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        return self._ask("qkv", layer, h, rope)

    def project_qkv(self, layer: int, normed: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        return self._ask("project_qkv", layer, normed, rope)

    def attn_input(self, layer: int, h: Tensor) -> Tensor:
        return self._ask("attn_input", layer, h)

    def queries(self, layer: int, normed: Tensor, rope) -> Tensor:
        return self._ask("queries", layer, normed, rope)

    def keys(self, layer: int, normed: Tensor, rope) -> Tensor:
        return self._ask("keys", layer, normed, rope)

    def values(self, layer: int, normed: Tensor) -> Tensor:
        return self._ask("values", layer, normed)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is not None:  # a masked call (no cache makes one): this slot's own, unbatched
            return self.backbone.attend(q, k, v, mask)
        return self.scheduler.request("attend", self._layer, q, k, v)

    def attention_probs(self, q: Tensor, k: Tensor) -> Tensor:
        return self.scheduler.request("attention_probs", self._layer, q, k)

    def attn_output(self, layer: int, o: Tensor) -> Tensor:
        return self._ask("attn_output", layer, o)

    def ffn(self, layer: int, h: Tensor) -> Tensor:
        return self._ask("ffn", layer, h)

    def logits(self, h: Tensor) -> Tensor:
        return self.scheduler.request("logits", self.cfg.n_layers, h)


@dataclass
class Sample:
    """One sample to decode: a key the caller knows it by, the prompt, the generator."""
    key: object
    prompt_ids: Tensor
    gen_len: int
    generator: torch.Generator | None = None


@torch.inference_mode()
def decode_batched(model: Backbone, methods: list[tuple], samples: Iterable[Sample],
                   on_done: Callable[[Sample, DecodeResult], None],
                   pad_attention: bool | None = None,
                   observer: Callable[[Sample], Observer | None] | None = None) -> BatchScheduler:
    """Decode ``samples`` with ``len(methods)`` slots, each slot's ``(sampler, cache)`` built
    over its ``SlotModel`` (``slot_models``); ``on_done`` gets every finished sample as soon as
    it finishes (finish order, not sample order). Each result equals ``decode`` of the sample
    alone (tests/test_batching.py) except ``time_s``/``ttft_s``: its latency inside the batch.
    ``observer(sample)``: the ``Observer`` of that sample's updates, as ``decode``'s."""
    scheduler = methods[0][1].model.scheduler if methods else BatchScheduler(model, pad_attention)
    queue: Iterator[Sample] = iter(samples)
    device = model.device
    mask_id = model.cfg.mask_id

    def slot(sampler, cache) -> Callable[[], None]:
        def body() -> None:
            for sample in queue:
                _sync(device)
                start = time.perf_counter()
                run = Decoding(cache.model, sampler, cache, sample.prompt_ids, sample.gen_len,
                               sample.generator)
                first = None
                watch = observer(sample) if observer is not None else None
                while not run.done:
                    run.step(watch)
                    if first is None and bool((run.response != mask_id).any()):
                        _sync(device)
                        first = time.perf_counter()
                _sync(device)
                end = time.perf_counter()
                on_done(sample, DecodeResult(response=run.response.cpu(), time_s=end - start,
                                             ttft_s=(first if first is not None else end) - start,
                                             stats=run.stats()))
        return body

    scheduler.run([slot(s, c) for s, c in methods])
    return scheduler


def slot_models(model: Backbone, batch_size: int, pad_attention: bool | None = None) -> list[SlotModel]:
    """``batch_size`` stand-ins sharing one scheduler: build one sampler and cache over each."""
    scheduler = BatchScheduler(model, pad_attention)
    return [SlotModel(model, scheduler) for _ in range(batch_size)]
