"""Batch invariance: a sample decoded in a batch (dlmpipe/batching.py) gets the tokens and the
decoding statistics it gets alone, for every sampler x cache the registry allows (on one family
of each attention pattern; ``pairings_for``), with prompts of different lengths and more samples than slots (continuous batching).

The reference is the plain batch-1 ``decode``; the batched runs use B = 2 slots over 3 samples
on the full-attention families and B = 3 over 4 on the block-causal ones, with G = 16 and 8
(every pairing; ``small_run``), and B = 8 slots over 10 (every cache, on one family of each
attention pattern).
The models have ``LAYERS`` = 2 layers (below: why two show what more would).
Every step's logits are compared bit for bit, not only the final tokens and statistics: a
rounding difference is caught at the step where it starts, not only when it flips a token.
Float32 on the CPU: any row whose result depended on how many rows share a call would show up
as a different logit somewhere in this matrix (it did, as tokens, before the Backbone ran its
row-wise primitives in calls of one fixed shape, dlmpipe/backbones/rowwise.py: tests below pin
those primitives too).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlmpipe import registry
from dlmpipe.backbones import rowwise
from dlmpipe.backbones.rowwise import linear
from dlmpipe.batching import BatchScheduler, Sample, SlotModel, decode_batched, slot_models
from dlmpipe.decode import Observer, decode
from dlmpipe.methods import build_method

from .models import (BLOCK_FAMILIES, FAMILIES, MASK_ID, MOE_FAMILIES, decode_method, random_prompt,
                     tiny_backbone)
from .test_exactness import BLOCK_ROWS, DEGENERATE, _needs_blocks

GEN = 16
#: layers of the tiny models and checkpoints decoded here. Two run every per-layer path there is:
#: layer 0 and the later ones (selective caches recompute rows from layer 1 on, blockwise.py's
#: layer-0 path, LLaDA2.0's dense first layer before its MoE ones), and every primitive of every
#: layer is a call the slots share, so a row whose bits depended on its call would differ at
#: layer 0 already. Measured: with the fixed-shape calls removed (rowwise.exact_path False) the
#: same pairings fail at 2 layers as at 3 (LLaDA/Dream/SDAR under LLaDA confidence: 4/10, 3/10,
#: 11/11, at B = 3 over 4, G = 16), at two thirds of the cost
LAYERS = 2
#: samples of the B = 8 runs; every pairing's small run (``small_run``) decodes the first 3 or
#: FEW_SAMPLES of them
N_SAMPLES = 10
FEW_SAMPLES = 4
STATS = ("steps", "nfe", "refreshes", "cached_forwards", "revisions")


def sampler_at_defaults(name: str) -> dict:
    """A sampler at its registry defaults, in blocks of 8 where it has blocks (GEN = 16)."""
    params = registry.SAMPLERS[name].params
    return {"name": name, **({"block_length": 8} if "block_length" in params else {})}


def cache_at_defaults(name: str, attention: str = "full") -> dict:
    # (no SPA-Cache profile is known for the block-causal families: name one)
    spa = {"rank": 8, **({"profile": "llada-8b-instruct"} if attention != "full" else {})}
    return {"name": name, **(spa if name == "spa" else {})}


def allowed_pairings(attention: str = "full") -> list[tuple[dict, dict]]:
    return [(sampler_at_defaults(s), cache_at_defaults(c, attention))
            for s in registry.SAMPLERS for c in registry.CACHES
            if not registry.pairing_problem(s, c) and not registry.attention_problems(
                {"sampler": {"name": s}, "cache": {"name": c}}, attention)]


def attention(family: str) -> str:
    return "block_causal" if family in BLOCK_FAMILIES else "full"


#: (family, sampler) pairs the registry allows (the releases' block loops: block-causal only)
FAMILY_SAMPLERS = [(f, s) for f in FAMILIES + BLOCK_FAMILIES for s in registry.SAMPLERS
                   if not registry.attention_refusal("sampler", s, attention(f))]

#: one family per attention pattern decodes every sampler x cache the registry allows; the
#: others (Dream's GQA and shifted logits, Fast-dLLM v2's Qwen2.5 layout) every cache under LLaDA
#: confidence and every sampler under its plainest cache (and its release's own): each family with each sampler and with
#: each cache, at about a third of the full matrix's CPU time
FULL_MATRIX_FAMILIES = ("llada", "sdar")


def pairings_for(family: str, sampler: str) -> list[tuple[dict, dict]]:
    """The (sampler, cache) pairings ``test_every_allowed_pairing_is_batch_invariant`` decodes."""
    pairs = [(s, c) for s, c in allowed_pairings(attention(family)) if s["name"] == sampler]
    if family in FULL_MATRIX_FAMILIES or sampler == "llada_confidence":
        return pairs
    # the plainest cache, and a release's own (fast_dllm_v2's block + sub-block cache)
    return [p for p in pairs if p[1]["name"] in ("none", sampler)] or pairs[:1]


_MODELS: dict = {}


def batch_model(family: str, seed: int):
    """``tiny_backbone(family, seed=seed, n_layers=LAYERS)``, built once per process and shared
    by the tests that decode it (no decode changes a model)."""
    if (family, seed) not in _MODELS:
        _MODELS[family, seed] = tiny_backbone(family, seed=seed, n_layers=LAYERS)
    return _MODELS[family, seed]


def prompts(n: int = N_SAMPLES) -> list[torch.Tensor]:
    """``n`` prompts of 5 lengths, 4..16 (the first 4: every offset in a tiny SDAR block of 4)."""
    return [random_prompt(4 + 3 * (i % 5), i) for i in range(n)]


def decode_all(model, sampler: dict, cache: dict, batch_size: int, n_samples: int = N_SAMPLES) -> dict:
    method = {"sampler": sampler, "cache": cache}
    slots = slot_models(model, batch_size)
    methods = [build_method(method, slot) for slot in slots]
    samples = [Sample(i, p, GEN, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts(n_samples))]
    out: dict = {}

    def done(sample, res):
        assert sample.key not in out  # every sample once
        out[sample.key] = res

    decode_batched(model, methods, samples, done)
    assert sorted(out) == list(range(n_samples))
    return out


def check_invariant(model, sampler: dict, cache: dict, sizes=(3,), n_samples: int = FEW_SAMPLES) -> dict:
    """``n_samples`` prompts (4 or 5 lengths) decoded at each batch size in ``sizes``: every step's
    logits (bit for bit), the tokens and the statistics equal each sample's decode alone. Returns
    the batched results (``check_bitwise_invariant``)."""
    return check_bitwise_invariant(model, {"sampler": sampler, "cache": cache}, prompts(n_samples), GEN, sizes)


def small_run(model) -> tuple[int, int, int]:
    """(slots, samples, response length) of a pairing's small batched run. Full attention: 2
    slots over 3 samples of 3 prompt lengths, enough for every shared call to hold ragged rows of
    two samples and for a sample to join the slot another left, G = GEN. Block-causal: 3 over
    FEW_SAMPLES, whose 4 prompt lengths end the prompt at every offset of a tiny SDAR block of 4,
    and G = 8: each active block is a response of its own (dlmpipe/blockwise.py), and 8 positions
    give every sample 2 or 3 of them (SDAR's blocks of 4; Fast-dLLM v2's of 8: 2), so slots cross
    block boundaries at different steps. Measured: with the fixed-shape calls removed
    (rowwise.exact_path False) LLaDA's and Dream's matrices fail in the same pairings at 2 over 3
    as at 3 over 4 (52 of 118, 3 of 22), at three quarters of the cost; SDAR's, in all 148
    pairings at G = 8 as at 16, at half the cost."""
    return (3, FEW_SAMPLES, 8) if model.cfg.block_size else (2, 3, GEN)


def check_small(model, sampler: dict, cache: dict, wide: bool = False) -> None:
    """``check_invariant`` at ``small_run``'s size, and with ``wide`` at B = 8 over N_SAMPLES too
    (the small run over the first of them)."""
    b, n, gen = small_run(model)
    check_bitwise_invariant(model, {"sampler": sampler, "cache": cache}, prompts(N_SAMPLES if wide else n),
                            gen, (b, 8) if wide else (b,), {b: n})


@pytest.mark.parametrize("family,sampler", FAMILY_SAMPLERS)
def test_every_allowed_pairing_is_batch_invariant(family, sampler):
    """Each sampler at its defaults with every cache it may pair with (``pairings_for``), each
    cache at its defaults: every step's logits, the tokens and the statistics at B = 2 or 3
    (``small_run``: 3 or 4 prompt lengths, one joining a slot another left) equal B = 1 for every sample
    (on the block-causal families each slot decodes its own active blocks,
    dlmpipe/blockwise.py). B = 8 (10 samples) on one family
    of each attention pattern under LLaDA confidence, every cache: what decides which rows share
    a call is the cache (its forwards' rows) and the slot count, not which tokens the sampler
    picks, so the larger calls are decoded once per cache, not once per sampler (its small run
    decodes the first samples, as every other sampler's does)."""
    model = batch_model(family, 3)
    pairs = pairings_for(family, sampler)
    assert pairs
    wide = family in FULL_MATRIX_FAMILIES and sampler == "llada_confidence"
    b, n, _ = small_run(model)
    assert n > b and N_SAMPLES > 8  # samples join the slots others leave (continuous batching)
    for s, c in pairs:
        check_small(model, s, c, wide)


@pytest.mark.parametrize("family,name", [(f, n) for f in FAMILIES for n in DEGENERATE
                                         if not _needs_blocks(n)]
                         + [(f, n) for f in BLOCK_FAMILIES for n in BLOCK_ROWS])
def test_degenerate_rows_are_batch_invariant(family, name):
    """The exactness table's rows (caches at their degenerate settings, the papers' samplers)."""
    sampler, cache, _ = (DEGENERATE if family in FAMILIES else BLOCK_ROWS)[name]
    check_small(batch_model(family, 1), sampler, cache)


def test_the_scheduler_batches_rows_of_several_slots():
    """With 4 slots most leaf requests share a call: far fewer calls than requests."""
    model = tiny_backbone("llada", seed=0)
    slots = slot_models(model, 4)
    methods = [build_method({"sampler": {"name": "llada_confidence", "block_length": 8},
                             "cache": {"name": "archer", "K": 4}}, s) for s in slots]
    samples = [Sample(i, random_prompt(6, 0), GEN) for i in range(8)]
    sched = decode_batched(model, methods, samples, lambda s, r: None)
    assert sched.requests > 2.5 * sched.calls, (sched.requests, sched.calls)


def test_slot_model_is_the_backbone_on_one_slot():
    """A full forward through one slot's stand-in equals the backbone's own."""
    model = tiny_backbone("dream", seed=2)
    slot = SlotModel(model, BatchScheduler(model))
    ids = random_prompt(12, 0)[None]
    out = {}

    def body():
        out["logits"] = slot(ids)

    slot.scheduler.run([body])
    assert torch.equal(out["logits"], model(ids))


def test_cpu_projection_of_few_rows_equals_the_same_rows_in_a_large_call():
    """The primitive batch invariance rests on: a row's projection does not depend on how many
    rows share the call, nor where in it the row sits. MKL picks its sgemm algorithm by the row
    count (1-3 rows, each thread's share, the rows of a tile's remainder); ``linear`` runs every
    call as chunks of one fixed row count (rowwise.py). Row counts 1-70 cross several chunks;
    fails if the chunking is removed."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(128, 96).requires_grad_(False)  # inference: training takes autograd's ops
    for n_threads in (1, CK_THREADS):
        torch.set_num_threads(n_threads)
        for rows in range(1, 71):
            x = torch.randn(rows, 128)
            alone = linear(proj, x[None])[0]
            shared = linear(proj, torch.cat([torch.randn(5, 128), x, torch.randn(20, 128)])[None])[0, 5:5 + rows]
            assert torch.equal(alone, shared), (n_threads, rows)
    torch.set_num_threads(1)
    # the bias-free projections and 2-d inputs too, and the chunk is what the kernel computes
    head = torch.nn.Linear(128, 64, bias=False).requires_grad_(False)
    x = torch.randn(2, 128)
    assert torch.equal(linear(head, x), linear(head, torch.cat([x, torch.randn(9, 128)]))[:2])
    r = next(n for (kind, key, t), n in rowwise.chunk_sizes().items()
             if kind == "linear" and key[:3] == (128, 64, False) and t == 1)
    assert torch.equal(linear(head, x), (torch.cat([x, x.new_zeros(r - 2, 128)]) @ head.weight.t())[:2])


def test_finished_rows_leave_and_new_samples_join():
    """Continuous batching: with samples of very different lengths of work, slots that finish
    take the next sample; all samples decode once, each as alone."""
    model = tiny_backbone("llada", seed=4, n_layers=LAYERS)
    sampler, cache = {"name": "threshold", "tau": 0.9, "block_length": 8}, {"name": "fast_dllm_dual"}
    batched = check_invariant(model, sampler, cache, sizes=(2, 16), n_samples=N_SAMPLES)  # 16 slots > 10 samples: some idle
    assert (batched[2][0].response != MASK_ID).all()  # the B = 2 run decoded whole responses


def test_padded_attention_matches_each_call_closely():
    """The CUDA half-precision path (keys padded and masked, queries padded and dropped) on the
    CPU: the same attention up to rounding, each call's own shape; not bitwise, hence off in
    float32 (module docstring of dlmpipe/batching.py)."""
    from dlmpipe.batching import _padded_attend

    model = tiny_backbone("dream", seed=0)  # GQA: 4 query heads over 2 K/V heads
    g = torch.Generator().manual_seed(0)
    args = [(torch.randn(1, 4, tq, 16, generator=g), torch.randn(1, 2, tk, 16, generator=g),
             torch.randn(1, 2, tk, 16, generator=g)) for tq, tk in ((3, 10), (8, 24), (1, 17))]
    for (q, k, v), got in zip(args, _padded_attend(model, args)):
        want = model.attend(q, k, v)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    slots = slot_models(model, 3, pad_attention=True)
    methods = [build_method({"sampler": {"name": "llada_confidence", "block_length": 8},
                             "cache": {"name": "fast_dllm_dual"}}, s) for s in slots]
    out = {}
    decode_batched(model, methods, [Sample(i, random_prompt(4 + 5 * i, i), GEN) for i in range(5)],
                   lambda s, r: out.__setitem__(s.key, r))
    assert sorted(out) == list(range(5)) and all((r.response != MASK_ID).all() for r in out.values())


def test_a_backbone_attribute_the_stand_in_does_not_batch_is_the_backbone_s_own():
    model = tiny_backbone("llada", seed=0)
    slot = SlotModel(model, BatchScheduler(model))
    assert slot.cfg is model.cfg and slot.embed.weight is model.embed.weight
    assert slot.first_logit_row(5) == 5 and slot.head is model.head
    assert slot.named_parameters is not None  # delegated (unbatched, per slot)


# ---- checkpoints unlike the test models, more threads (issue 30) ------------------------------
# An independent check on checkpoints other than tiny_backbone's found tokens that changed with
# the batch on the Dream family. Causes (each a kernel whose rounding of a row depends on how
# many rows share its call, so Dream's extra logit row, which makes its row counts odd, exposed
# them): ATen's SiLU computes a call's last numel % 16 elements (and with several threads the
# tail of each thread's share) with the scalar exp instead of the vector one; MKL's sgemm with
# more than one thread gives the last thread's chunk of 1-3 rows its small-M kernel (2 threads:
# calls of 5-7 and 9-11 rows); SDPA with more than one thread rounds 1 or 3 query rows
# differently when stacked. The tests below use checkpoints in the real on-disk formats (bf16
# weights run in float32), an FFN width that is not a multiple of 16, and 2 threads, and compare
# every step's logits bit for bit, not only the final tokens (a rounding difference flips a token
# only now and then: it has to be caught where it starts).
CK_MLP = 172          # FFN width, not a multiple of 16 (a row's SiLU tail shows)
CK_THREADS = 2        # MKL splits a call's rows among threads (CI has 2 cores; more threads
#                       than free cores make OpenMP crawl, so few tests use them)
CK_PEAK = 4.0         # head weights x4 (exact in bf16): peaked outputs, as trained models have


def checkpoint_model(root, family: str):
    """A random checkpoint written in ``family``'s format with bf16 weights, loaded in float32:
    hidden 64, ``LAYERS`` layers, 4 query heads (Dream: over 2 K/V heads, q/k/v biases), vocab 512."""
    from dlmpipe.backbones.loading import load_backbone

    from .checkpoints import make_tiny_checkpoint

    path = make_tiny_checkpoint(root / family, family, sharded=False, d_model=64, n_layers=LAYERS,
                                n_heads=4, n_kv_heads=2 if family == "dream" else 4,
                                mlp_hidden=CK_MLP, vocab_size=512, seed=11, dtype="bfloat16")
    model = load_backbone(path, "float32", with_tokenizer=False).model
    model.head.weight.mul_(CK_PEAK)
    return model


@pytest.fixture(scope="module")
def checkpoint_models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("batch-invariance")
    return {family: checkpoint_model(root, family) for family in FAMILIES}


@pytest.fixture
def threads():
    """``threads(n)``: torch runs on n threads for the rest of the test (conftest restores)."""
    return torch.set_num_threads


def checkpoint_prompts(lengths) -> list[torch.Tensor]:
    """Prompts of the given lengths over ordinary (byte) tokens."""
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, 256, (n,), generator=g) for n in lengths]


def method_at_registry_defaults(sampler: str, cache: str, gen: int) -> dict:
    """Sampler and cache at their registry defaults; a default block longer than ``gen`` is
    ``gen`` (one block), SPA's default rank 128 is 8 (at most n_kv_heads x head_dim here)."""
    block = registry.SAMPLERS[sampler].params.get("block_length", {}).get("default")
    return {"sampler": {"name": sampler, **({"block_length": gen} if block and block > gen else {})},
            "cache": {"name": cache, **({"rank": 8} if cache == "spa" else {})}}


class StepLogits(Observer):
    """Every update's logits, as the sampler saw them."""

    def __init__(self):
        self.logits: list[torch.Tensor] = []

    def before_update(self, run, logits):
        self.logits.append(logits.clone())


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN (``assert_close`` at rtol = atol = 0, equal_nan)."""
    if torch.equal(x, y):
        return True
    nan = x.isnan()
    return torch.equal(nan, y.isnan()) and torch.equal(x.masked_fill(nan, 0), y.masked_fill(nan, 0))


def check_bitwise_invariant(model, method: dict, prompts: list[torch.Tensor], gen: int,
                            batch_sizes=(8,), first: dict[int, int] | None = None) -> dict:
    """Each sample decoded in a batch of each of ``batch_sizes`` slots (size ``b``: the first
    ``first[b]`` prompts where given, else all): every step's logits (bit for bit, NaN rows
    included), the tokens and the statistics equal the sample's decode alone (decoded once).
    Returns batch size -> sample index -> its batched ``DecodeResult``."""
    batched: dict = {}
    alone = []
    for i, p in enumerate(prompts):
        steps = StepLogits()
        s, c = build_method(method, model)
        alone.append((decode(model, s, c, p, gen, torch.Generator().manual_seed(i), steps), steps))
    for b in batch_sizes:
        n = (first or {}).get(b, len(prompts))
        observed = {i: StepLogits() for i in range(n)}
        got: dict = {}

        def done(sample, res):
            assert sample.key not in got  # every sample once
            got[sample.key] = res

        decode_batched(model, [build_method(method, slot) for slot in slot_models(model, b)],
                       [Sample(i, p, gen, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts[:n])],
                       done, observer=lambda sample: observed[sample.key])
        assert sorted(got) == list(range(n))
        batched[b] = got
        for i, (ref, steps) in enumerate(alone[:n]):
            label = (method["sampler"]["name"], method["cache"]["name"], f"B = {b}", f"prompt {len(prompts[i])}")
            assert len(observed[i].logits) == len(steps.logits), label
            for n, (x, y) in enumerate(zip(observed[i].logits, steps.logits)):
                if not same_bits(x, y):  # (assert_close, 20x slower a call, only to word the difference)
                    torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True,
                                               msg=lambda m: f"{label}, step {n}: {m}")
                    raise AssertionError(f"{label}, step {n}: logits differ")
            assert torch.equal(got[i].response, ref.response), label
            assert {k: got[i].stats[k] for k in STATS} == {k: ref.stats[k] for k in STATS}, label
            assert got[i].time_s > 0 and got[i].ttft_s <= got[i].time_s, label
    return batched


@pytest.mark.parametrize("family", FAMILIES)
def test_every_allowed_pairing_is_batch_invariant_on_checkpoints(family, checkpoint_models):
    """Every allowed sampler x cache at registry defaults on a real-format checkpoint: prompts
    of 5 and 30 tokens decoded together at B = 8 get every step's logits, the tokens and the
    statistics they get alone (G = 8, to keep the 89 pairings per family to ~4 CPU s)."""
    model, prompts = checkpoint_models[family], checkpoint_prompts([5, 30])
    for s in registry.SAMPLERS:
        for c in registry.CACHES:
            if not registry.pairing_problem(s, c) and not registry.attention_problems(
                    {"sampler": {"name": s}, "cache": {"name": c}}, "full"):  # these are full-attention
                check_bitwise_invariant(model, method_at_registry_defaults(s, c, 8), prompts, 8)


@pytest.mark.parametrize("family, n_threads", [("llada", 1), ("dream", 1), ("dream", CK_THREADS)])
@pytest.mark.parametrize("sampler, cache", [("dream", "dllm_cache"), ("eb_sampler", "fast_dllm_dual")])
def test_the_pairings_the_check_found_hold_at_its_shapes(family, n_threads, sampler, cache,
                                                         checkpoint_models, threads):
    """The two pairings the independent check saw change tokens on the Dream family (Dream +
    dLLM-Cache on a 6-token prompt, EB-Sampler + Fast-dLLM dual on a 30-token one), at its
    shapes (G = 32, prompts of 5-30 tokens, B = 8), also at 2 threads (on Dream: its logit row
    makes dLLM-Cache recompute 9 rows, a count MKL splits 8 + 1 among 2 threads)."""
    threads(n_threads)
    check_bitwise_invariant(checkpoint_models[family], method_at_registry_defaults(sampler, cache, 32),
                            checkpoint_prompts([6, 30, 17, 9]), 32)


def test_each_row_wise_primitive_gives_a_row_what_it_gives_it_in_any_call(checkpoint_models, threads):
    """Projections (RoPE'd), attention output, FFN and head of 1-12 rows alone equal the same
    rows inside a call of 40, at 1 and 2 threads, on Dream's checkpoint (biases, FFN width 172:
    a call's SiLU tail is 172 x rows mod 16 elements)."""
    model = checkpoint_models["dream"]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, 40, 64, generator=g)
    o = torch.randn(1, 40, 64, generator=g)
    rope = model.rope(torch.arange(40))
    for n_threads in (1, CK_THREADS):
        threads(n_threads)
        prims = {"queries": lambda x, r: model.queries(1, x, r), "keys": lambda x, r: model.keys(1, x, r),
                 "values": lambda x, r: model.values(1, x), "attn_output": lambda x, r: model.attn_output(1, x),
                 "ffn": lambda x, r: model.ffn(1, x), "logits": lambda x, r: model.logits(x)}
        for name, prim in prims.items():
            x = o if name == "attn_output" else h
            full = prim(x, rope)
            for rows in range(1, 13):
                part = prim(x[:, 7:7 + rows], (rope[0][7:7 + rows], rope[1][7:7 + rows]))
                want = full[:, :, 7:7 + rows] if full.dim() == 4 else full[:, 7:7 + rows]
                assert torch.equal(part, want), (name, n_threads, rows)


def test_silu_of_an_element_is_the_same_in_any_call(threads):
    """The FFN's SiLU: every element as in a large call, for calls of any length, also at 3
    threads (ATen splits a call of over 32768 elements among threads at arbitrary offsets)."""
    from dlmpipe.backbones.rowwise import silu

    x = torch.randn(300 * 172, generator=torch.Generator().manual_seed(1)) * 4
    ref = silu(x)
    assert torch.equal(ref[:4096], F.silu(x[:4096]))  # the vector path's values: batch 1 unchanged
    for n_threads in (1, 3):
        threads(n_threads)
        for n in (1, 15, 17, 172, 172 * 9, 172 * 33, 172 * 250):
            assert torch.equal(silu(x[:n]), ref[:n]), (n_threads, n)
            assert torch.equal(silu(x[5:5 + n]), ref[5:5 + n]), (n_threads, n)


def test_stacked_attention_equals_each_call_alone_at_2_threads(checkpoint_models, threads):
    """The scheduler stacks same-shaped attention calls: each entry's result must not depend on
    the others, for any number of query rows (SDPA at 2 threads rounds 1 or 3 query rows
    differently in a stack; ``attend`` runs query chunks of one fixed size: rowwise.py)."""
    model = checkpoint_models["dream"]  # GQA: 4 query heads over 2 K/V heads
    g = torch.Generator().manual_seed(2)
    threads(CK_THREADS)
    for tq in range(1, 10):
        for tk in (tq, 40):
            q = torch.randn(4, 4, tq, 16, generator=g)
            k, v = torch.randn(2, 4, 2, tk, 16, generator=g)
            stacked = model.attend(q, k, v)
            for i in range(4):
                assert torch.equal(model.attend(q[i:i + 1], k[i:i + 1], v[i:i + 1]), stacked[i:i + 1]), (tq, tk, i)


#: the MoE rows (issue 33): full recompute and the caches whose FFN reuse the registry states for
#: an MoE FFN (docs/METHODS.md, "MoE backbones")
MOE_PAIRINGS = [("llada_confidence", "none"), ("llada_confidence", "spa"), ("threshold", "dllm_cache"),
                ("llada_confidence", "d2cache")]


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("sampler, cache", MOE_PAIRINGS)
def test_moe_backbones_are_batch_invariant(family, sampler, cache):
    """LLaDA-MoE- and LLaDA2.0-shaped models: decoded at ``small_run``'s size (B = 2 over 3 samples
    on LLaDA-MoE, 3 over 4 on the block-causal LLaDA2.0: rows of several samples routed to the
    experts in one call, each expert receiving a count that depends on the batch), every sample
    gets every step's logits, the tokens and the statistics it gets alone (moe.py's row
    invariance). Measured: with the experts' fixed-shape calls removed (plain F.linear) all 8
    rows fail, and with LLaDA2.0's router's removed the same 2 (SPA-Cache, dLLM-Cache), as at
    B = 5 over 10, at under a third of the cost."""
    model = batch_model(family, 3)  # LLaDA2.0: a dense layer, then an MoE one
    att = "block_causal" if model.cfg.block_size else "full"
    pairs = [(s, {**c, **({"profile": "llada-8b-instruct"} if c["name"] == "spa" else {})})
             for s, c in allowed_pairings(att) if (s["name"], c["name"]) == (sampler, cache)]
    assert len(pairs) == 1, (sampler, cache, att)
    check_small(model, *pairs[0])
