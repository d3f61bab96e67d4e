"""Layer placement across devices (dlmpipe/placement.py), on the CPU.

Three CPU "devices": the placement is built over three stages that are all the CPU, and a
``StageCheck`` torch-function mode gives every tensor the stage it lives on (parameters their
stage's, a move the stage it moves to, an op's result its inputs' stage, a new tensor the stage
its device argument names: ``x.device`` reads as ``cpu:<x's stage>``) and fails any op whose
tensors sit on different stages: exactly what a CUDA op on tensors of two GPUs does. Under it the
placed model decodes the same tokens as one device, token for token, for several sampler/cache
pairings; each layer's K/V buffer lives on its layer's stage; the hidden rows cross each stage
boundary once per forward."""
from __future__ import annotations

import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dlmpipe.engine.kv import KVBuffer
from dlmpipe.placement import Placement, place, stages

from .models import decode_method, random_prompt, tiny_backbone

STAGES = 3
#: 4 layers over 3 stages: [0, 0, 1, 2], a stage of two layers (no move between them) and
#: layers whose stage is not their index (a layer index read as a stage lands elsewhere)
LAYERS = 4


class Tags:
    """Tensor -> stage, by identity (a freed tensor's id may be reused: its weak reference tells)."""

    def __init__(self):
        self._by_id: dict[int, tuple[weakref.ref, int]] = {}

    def get(self, x, default=None):
        found = self._by_id.get(id(x))
        return found[1] if found is not None and found[0]() is x else default

    def __setitem__(self, x, stage):
        self._by_id[id(x)] = (weakref.ref(x), stage)

    def __contains__(self, x):
        return self.get(x) is not None


class RecordingPlacement(Placement):
    """A placement over CPU stages that tags tensors with their stage and records moves."""

    def __init__(self, n_layers: int, n_stages: int = STAGES):
        super().__init__([torch.device("cpu")] * n_stages, n_layers)
        self.tags = Tags()
        self.moves: list[tuple[int, int, tuple]] = []  # (from, to, shape) of every real move

    def stage_of(self, x):
        return self.tags.get(x)

    def tag(self, x, stage):
        self.tags[x] = stage
        return x

    def to(self, x, stage):
        have = self.tags.get(x)
        if have == stage:
            return x
        with torch._C.DisableTorchFunction():
            moved = x.view_as(x) if x.dim() else x.clone()
        if have is not None:
            self.moves.append((have, stage, tuple(x.shape)))
        return self.tag(moved, stage)

    def empty(self, stage, shape, dtype):
        with torch._C.DisableTorchFunction():
            return self.tag(torch.empty(shape, dtype=dtype), stage)


class StageCheck(TorchFunctionMode):
    """Fails an op over tensors of two stages; gives its results their stage. A tensor's
    ``device`` reads as ``cpu:<its stage>``, so a tensor made on "the device of x" (``device=``,
    ``.to``) is made on x's stage, and one made on the model's device (the embedding's) on the
    first, as on GPUs."""

    def __init__(self, placement: RecordingPlacement):
        super().__init__()
        self.p = placement

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__" and len(args) == 1 and not kwargs:  # reading a property of x
            if func.__self__ is _DEVICE:  # x.device
                stage = self.p.tags.get(args[0])
                return func(*args) if stage is None else torch.device("cpu", stage)
            out = func(*args)  # one tensor: no two stages; a tensor it gives (x.T) on x's stage
            if isinstance(out, torch.Tensor) and out not in self.p.tags:
                self.p.tag(out, self.p.tags.get(args[0], 0))
            return out
        named = None  # a stage named by a device argument
        device = kwargs.get("device")
        if isinstance(device, torch.device) and device.index is not None:
            named, kwargs = device.index, {**kwargs, "device": torch.device("cpu")}
        is_to = name == "to"
        if is_to and len(args) > 1 and isinstance(args[1], torch.device) and args[1].index is not None:
            named, args = args[1].index, (args[0], torch.device("cpu"), *args[2:])
        if is_to and named is not None:  # a move the code makes itself: an alias on that stage
            with torch._C.DisableTorchFunction():
                return self.p.tag(args[0].view_as(args[0]), named)
        by_id, seen = self.p.tags._by_id, set()
        _add_stages(args, by_id, seen)
        if kwargs:
            _add_stages(kwargs.values(), by_id, seen)
        if len(seen) > 1:
            raise AssertionError(f"{getattr(func, '__name__', func)} over tensors of stages {sorted(seen)}")
        out = func(*args, **kwargs)
        # a tensor made from no tensor (arange, zeros, full) is made where its device argument
        # says, else on the first device (the model's and the sampler's)
        stage = seen.pop() if seen else (named if named is not None else 0)
        for r in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(r, torch.Tensor):
                found = by_id.get(id(r))
                if found is None or found[0]() is not r:  # untagged (``Tags``): tag it
                    by_id[id(r)] = (weakref.ref(r), stage)
        return out


_DEVICE = torch.Tensor.device


def _add_stages(items, by_id: dict, seen: set) -> None:
    """The stages of the tagged tensors among ``items`` (in nested lists and tuples too) into
    ``seen``: ``Tags.get`` inlined, as this runs for every op of a placed decode."""
    for a in items:
        if isinstance(a, torch.Tensor):
            found = by_id.get(id(a))
            if found is not None and found[0]() is a:
                seen.add(found[1])
        elif isinstance(a, (list, tuple)):
            _add_stages(a, by_id, seen)


def placed_copy(model, n_stages=STAGES) -> tuple[object, RecordingPlacement]:
    import copy

    placed = copy.deepcopy(model)
    p = RecordingPlacement(model.cfg.n_layers, n_stages)
    place(placed, p.devices, p)
    for i, block in enumerate(placed.blocks):
        for t in block.parameters():
            p.tag(t, p.stage(i))
    p.tag(placed.embed.weight, 0)
    p.tag(placed.final_norm.weight, p.last)
    if not placed.cfg.tie_embeddings:
        p.tag(placed.head.weight, p.last)
    return placed, p


def test_stages_are_contiguous_and_balanced():
    assert stages(5, 3) == [0, 0, 1, 1, 2]
    assert stages(32, 3) == [0] * 11 + [1] * 11 + [2] * 10
    assert stages(2, 1) == [0, 0]


def test_the_check_catches_an_op_across_stages():
    """The stage check is what makes the decode tests below mean something."""
    model = tiny_backbone("llada", n_layers=LAYERS)
    placed, p = placed_copy(model)
    with StageCheck(p), pytest.raises(AssertionError, match="stages"):
        h = placed.embed(random_prompt(6, 0)[None])  # on the first stage
        # a layer of the last stage, its output added to the first stage's rows without a move
        _ = h + placed.blocks[-1].attn_out(torch.zeros(1, 6, 64))


PAIRINGS = [  # (family, sampler, cache): every cache, WINO's shadow rows, the block-causal loop
    ("llada", {"name": "llada_confidence", "steps": 8, "block_length": 8}, {"name": "none"}),
    ("llada", {"name": "llada_confidence", "steps": 8, "block_length": 8}, {"name": "archer", "K": 4}),
    ("dream", {"name": "dream", "steps": 8}, {"name": "archer", "K": 4}),
    ("llada", {"name": "threshold", "block_length": 8}, {"name": "fast_dllm_dual"}),
    ("dream", {"name": "llada_confidence", "steps": 8, "block_length": 8}, {"name": "fast_dllm_prefix"}),
    ("llada", {"name": "llada_confidence", "steps": 16, "block_length": 8}, {"name": "dkv_decode"}),
    ("llada", {"name": "llada_confidence", "steps": 16, "block_length": 8}, {"name": "spa", "rank": 32}),
    ("dream", {"name": "llada_confidence", "steps": 16, "block_length": 8}, {"name": "dllm_cache"}),
    ("llada", {"name": "llada_confidence", "steps": 16, "block_length": 8}, {"name": "d2cache"}),
    ("llada", {"name": "wino", "block_length": 8}, {"name": "archer", "K": 4}),
    ("sdar", {"name": "sdar", "temperature": 0}, {"name": "none"}),
    ("fast_dllm_v2", {"name": "fast_dllm_v2"}, {"name": "fast_dllm_v2"}),
]


def artifacts(model, cache: dict) -> dict | None:
    from dlmpipe.engine.proxies import proxies_from_model

    return {"proxies": proxies_from_model(model)} if cache["name"] == "spa" else None


@pytest.mark.parametrize("family,sampler,cache", PAIRINGS,
                         ids=[f"{f}-{s['name']}-{c['name']}" for f, s, c in PAIRINGS])
def test_placed_decode_equals_one_device(family, sampler, cache):
    model = tiny_backbone(family, n_layers=LAYERS)
    prompt = random_prompt(7, 1)
    extra = artifacts(model, cache)
    want = decode_method(model, sampler, cache, prompt, gen_len=16, artifacts=extra)
    placed, p = placed_copy(model)
    with StageCheck(p):
        got = decode_method(placed, sampler, cache, prompt, gen_len=16, artifacts=extra)
    assert got.response.tolist() == want.response.tolist()
    assert got.stats["nfe"] == want.stats["nfe"]
    # the hidden rows cross each stage boundary (0 -> 1 -> 2) and the final rows' logits come
    # back to the first stage; nothing moves backwards but the logits and row indices
    crossings = {(a, b) for a, b, _ in p.moves}
    assert {(0, 1), (1, 2)} <= crossings, crossings
    assert crossings <= {(0, 1), (1, 2), (2, 0), (0, 2), (1, 0)}, crossings


@pytest.mark.parametrize("cache", [{"name": "archer", "K": 4}, {"name": "fast_dllm_dual"}],
                         ids=lambda c: c["name"])
def test_placed_batched_decode_equals_one_device(cache):
    """Several samples decoded together (dlmpipe/batching.py) over the placed layers: 4
    samples of 4 prompt lengths in 3 slots (one joins a slot another left)."""
    from .test_batching import FEW_SAMPLES, decode_all

    model = tiny_backbone("llada", n_layers=LAYERS)
    sampler = {"name": "llada_confidence", "steps": 16, "block_length": 8}
    want = decode_all(model, sampler, cache, 3, FEW_SAMPLES)
    placed, p = placed_copy(model)
    with StageCheck(p):
        got = decode_all(placed, sampler, cache, 3, FEW_SAMPLES)
    assert all(torch.equal(got[i].response, want[i].response) for i in want)


@pytest.mark.parametrize("family,cache", [("llada_moe", {"name": "none"}),
                                          ("llada_moe", {"name": "dllm_cache"}),
                                          ("llada2", {"name": "none"})])
def test_placed_moe_decode_equals_one_device(tmp_path, family, cache):
    """The mixture-of-experts layers (backbones/moe.py: router, routed and shared experts) run
    on their layer's device too; the tiny checkpoints are in the releases' formats."""
    from dlmpipe.backbones.loading import load_backbone

    from .checkpoints import moe_checkpoint

    model = load_backbone(moe_checkpoint(tmp_path / family, family, n_layers=LAYERS),
                          with_tokenizer=False).model
    sampler = {"name": "llada_confidence", "steps": 16, "block_length": 8}
    prompt = torch.randint(0, 100, (7,), generator=torch.Generator().manual_seed(0))
    want = decode_method(model, sampler, cache, prompt, gen_len=16)
    placed, p = placed_copy(model)
    with StageCheck(p):
        got = decode_method(placed, sampler, cache, prompt, gen_len=16)
    assert got.response.tolist() == want.response.tolist()
    assert {(0, 1), (1, 2)} <= {(a, b) for a, b, _ in p.moves}


def test_each_layers_kv_lives_on_its_layers_stage():
    model = tiny_backbone("dream", n_layers=LAYERS)
    placed, p = placed_copy(model)
    kv = KVBuffer.for_model(placed, 10)
    assert [p.stage_of(k) for k in kv.keys] == p.layer_stage == [p.stage_of(v) for v in kv.values]
    assert p.layer_stage == [0, 0, 1, 2]


def test_a_job_reads_each_stage_onto_its_device(tmp_path, monkeypatch):
    """load_backbone with the job's GPUs (DLMPIPE_GPUS, set by the rule) builds the placement and
    reads every tensor onto its stage's device (here: the recording CPU stages)."""
    from dlmpipe import placement
    from dlmpipe.backbones import loading

    from .checkpoints import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path / "m", "dream", n_layers=LAYERS)
    made = []

    def recording(device, gpus, n_layers):
        made.append(RecordingPlacement(n_layers, gpus))
        return made[-1]

    monkeypatch.setattr(loading, "job_placement", recording)
    monkeypatch.setenv(placement.GPUS_ENV, "3")
    reads = []
    real_read = loading.read_tensors
    monkeypatch.setattr(loading, "read_tensors", lambda plan, dtype, dev: reads.append(sorted(plan))
                        or real_read(plan, dtype, dev))
    model = loading.load_backbone(path, with_tokenizer=False).model
    p = made[0]
    assert model.placement is p and len(p.devices) == 3
    stage_of = {n: placement.parameter_stage(n, p) for n, _ in model.named_parameters()}
    assert reads == [sorted(n for n, s in stage_of.items() if s == k) for k in range(3)]
    assert stage_of["embed.weight"] == 0 and stage_of["head.weight"] == 2
    assert [stage_of[f"blocks.{i}.ff_up.weight"] for i in range(LAYERS)] == [0, 0, 1, 2]
    monkeypatch.setattr(loading, "job_placement", placement.job_placement)
    one = loading.load_backbone(path, with_tokenizer=False).model
    assert one.placement is None  # on the CPU (or one GPU) nothing is placed
    assert placement.job_placement(torch.device("cuda"), 1, LAYERS) is None
    prompt = random_prompt(7, 1)
    for n, t in model.named_parameters():
        p.tag(t, stage_of[n])
    sampler, cache = {"name": "llada_confidence", "steps": 8, "block_length": 8}, {"name": "archer"}
    with StageCheck(p):
        got = decode_method(model, sampler, cache, prompt, gen_len=16)
    assert got.response.tolist() == decode_method(one, sampler, cache, prompt, gen_len=16).response.tolist()
