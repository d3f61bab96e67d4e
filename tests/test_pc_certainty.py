"""LLaDA confidence's confidence variants, certainty-prior decoding and PC-Sampler
(docs/METHODS.md §1.1, §1.6, §1.7).

Parity: each released algorithm is re-stated here step by step, from the released code's logic
and without dlmpipe's sampler classes (LLaDA's ``generate``; d2Cache's ``vanilla_generate`` with
its ``sample_tokens`` alg and its FFT ``certainty_density``; PC-Sampler's
``generate_with_pc_sampler`` with its ``load_baseline``), in dlmpipe's float64 and with
dlmpipe's per-step noise draw (§3). The samplers must leave the same response after every step,
on tiny models of both families. Rule tests pin the edge cases on hand-built logits.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from dlmpipe import graphs
from dlmpipe.decode import Decoding, decode
from dlmpipe.engine.full import full_response_logits
from dlmpipe.methods import build_method, build_sampler
from dlmpipe.samplers.certainty_prior import CertaintyPrior, certainty_density
from dlmpipe.samplers.llada_confidence import token_confidence
from dlmpipe.samplers.pc_sampler import frequency_prior, load_reference_corpus, reference_corpus

from .host_sync import replay_capture
from .models import (FAMILIES, HAND_MASK, HAND_PROMPT, HAND_VOCAB, MASK_ID, VOCAB, logits_for,
                     random_prompt, start, tiny_backbone)

GEN = 16
NONE = {"name": "none"}


def model_for(family: str, seed: int):
    """The tests' tiny models: two layers. The model is the rules' source of logits, nothing per
    layer is under test (issue 46: three quarters of 3 layers' cost); the new scores and the
    calibration still change decisions on them (test_the_new_scores_change_decisions)."""
    return tiny_backbone(family, seed=seed, n_layers=2)


def dlmpipe_states(model, sampler: dict, prompt, seed: int = 0) -> list[torch.Tensor]:
    """The response after every step of dlmpipe's sampler (full recompute)."""
    s, c = build_method({"sampler": sampler, "cache": NONE}, model)
    run = Decoding(model, s, c, prompt, GEN, torch.Generator().manual_seed(seed))
    states = []
    while not run.done:
        run.step()
        states.append(run.response.clone())
    return states


def assert_same_states(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want), (len(got), len(want))  # steps (= NFE under full recompute)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, a.tolist(), b.tolist())


# ---- re-statements of the released code --------------------------------------------------
def num_transfer_tokens(masks: int, steps: int) -> list[int]:
    """LLaDA's get_num_transfer_tokens."""
    base, rem = masks // steps, masks % steps
    return [base + 1 if i < rem else base for i in range(steps)]


def llada_generate(model, prompt, steps, block_length, temperature, seed, score=None):
    """LLaDA's released generate (low_confidence remasking, float64 softmax), with an optional
    ``score(p_x0, x0, offsets)`` over the block (PC-Sampler's pc_sampler_function)."""
    g = torch.Generator().manual_seed(seed)
    P = prompt.shape[0]
    x = torch.cat([prompt, torch.full((GEN,), MASK_ID)])
    states = []
    per_block = steps // (GEN // block_length)
    for b in range(GEN // block_length):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        schedule = num_transfer_tokens(int((x[lo:hi] == MASK_ID).sum()), per_block)
        for i in range(per_block):
            mask_index = x == MASK_ID
            logits = torch.full((P + GEN, VOCAB), 0.0)
            logits[P:] = full_response_logits(model, x, P)
            if temperature:
                u = torch.rand((GEN, VOCAB), dtype=torch.float64, generator=g)
                noisy = logits[P:].to(torch.float64).exp() / (-torch.log(u)) ** temperature
                x0 = torch.cat([x[:P], noisy.argmax(-1)])
            else:
                x0 = logits.argmax(-1)
            p = torch.softmax(logits.to(torch.float64), dim=-1)
            x0_p = torch.gather(p, -1, x0[:, None])[:, 0]
            x0_p[hi:] = -math.inf
            x0 = torch.where(mask_index, x0, x)
            if score is None:
                confidence = torch.where(mask_index, x0_p, -math.inf)
                confidence[:lo] = -math.inf  # visible anyway (prompt, earlier blocks)
                chosen = torch.topk(confidence, schedule[i]).indices
            else:
                block_score = score(x0_p[lo:hi], x0[lo:hi], torch.arange(hi - lo))
                confidence = torch.where(mask_index[lo:hi], block_score, -math.inf)
                chosen = torch.topk(confidence, schedule[i]).indices + lo
            x[chosen] = x0[chosen]
            states.append(x[P:].clone())
    return states


def fft_certainty_density(decoded: torch.Tensor, sigma: float) -> torch.Tensor:
    """d2Cache's certainty_density: float32 FFT convolution over [left pad | mask | right pad]."""
    L = decoded.shape[-1]
    padded = torch.nn.functional.pad(decoded.float()[None], (L, L), "constant", 1.0)
    if not bool(decoded[-1]):
        padded[:, 2 * L:] = 0.0
    ext = 3 * L
    dist = torch.cat([torch.arange(ext), torch.arange(-ext, 0)])
    kernel_fft = torch.fft.fft(torch.exp(-(dist ** 2) / (2 * sigma ** 2)), n=2 * ext)
    weighted = torch.fft.ifft(torch.fft.fft(torch.nn.functional.pad(padded, (0, ext)), n=2 * ext)
                              * kernel_fft, n=2 * ext).real
    total = torch.fft.ifft(torch.fft.fft(torch.ones(1, 2 * ext), n=2 * ext) * kernel_fft,
                           n=2 * ext).real
    return (weighted[..., L:2 * L] / total[..., L:2 * L].clamp_min(1e-8))[0]


def d2cache_vanilla(model, prompt, block_length, k, alg, sigma):
    """d2Cache's vanilla_generate at temperature 0: per block, until it has no masks, the
    sample_tokens confidence of alg (times the certainty density when sigma is set), the k best
    eligible positions of the block (fewer when fewer are left)."""
    P = prompt.shape[0]
    x = torch.cat([prompt, torch.full((GEN,), MASK_ID)])
    states = []
    for b in range(GEN // block_length):
        block = torch.zeros(GEN, dtype=torch.bool)
        block[b * block_length:(b + 1) * block_length] = True
        while bool(((x[P:] == MASK_ID) & block).any()):
            remaining = x[P:] == MASK_ID
            probs = torch.softmax(full_response_logits(model, x, P).to(torch.float64), dim=-1)
            confidence, x0 = probs.max(dim=-1)
            if alg == "topk_margin":
                top = torch.sort(probs, dim=-1, descending=True).values
                confidence = top[:, 0] - top[:, 1]
            elif alg == "entropy":
                confidence = (probs * torch.log(probs + 1e-10)).sum(-1)
            scores = confidence = torch.where(remaining, confidence, -math.inf)
            if sigma is not None:
                scores = confidence * fft_certainty_density(~remaining, sigma)
            eligible = remaining & block
            scores = torch.where(eligible, scores, -math.inf)
            chosen = torch.topk(scores, min(k, int(eligible.sum()))).indices
            x[P + chosen] = x0[chosen]
            states.append(x[P:].clone())
    return states


def released_pc_score(corpus_path, lambd, alpha):
    """PC-Sampler's load_baseline and pc_sampler_function (float64)."""
    data = json.loads(open(corpus_path).read())
    num_token = data["num_token"]
    freqs = {int(t): c / num_token for t, c in data["p_baseline_dict"].items()}
    base_line = torch.full((VOCAB,), 1 / num_token, dtype=torch.float64)
    base_line.scatter_(0, torch.tensor(list(freqs)), torch.tensor(list(freqs.values()),
                                                                   dtype=torch.float64))

    def score(p, tokens, offsets):
        cross_entropy = torch.clamp(-p * torch.log(base_line[tokens] + 1e-9), max=alpha)
        return torch.exp(-lambd * offsets.to(torch.float64)) * cross_entropy
    return score


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """A reference corpus the test makes: Zipf-like documents over the tiny vocabulary (some
    tokens frequent, most rare, a few never seen), in the released JSON format."""
    g = torch.Generator().manual_seed(7)
    weights = 1 / torch.arange(1, VOCAB - 8, dtype=torch.float64)
    docs = [torch.multinomial(weights, 50, replacement=True, generator=g).tolist()
            for _ in range(40)]
    path = tmp_path_factory.mktemp("corpus") / "reference_corpus.json"
    path.write_text(json.dumps(reference_corpus(docs)))
    return path


# ---- parity with the released code ----------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_default_llada_confidence_is_llada_generate(family):
    """The default (confidence: probability) is LLaDA's released rule, unchanged."""
    for seed, (block, steps, temp) in enumerate([(16, 16, 0.0), (8, 8, 0.0), (8, 16, 0.8)]):
        model = model_for(family, seed)
        prompt = random_prompt(6 + seed, seed)
        want = llada_generate(model, prompt, steps, block, temp, seed)
        for spec in ({}, {"confidence": "probability"}):
            got = dlmpipe_states(model, {"name": "llada_confidence", "block_length": block,
                                         "steps": steps, "temperature": temp, **spec}, prompt, seed)
            assert_same_states(got, want)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_confidence_variants_are_d2cache_sample_tokens(family, alg):
    for seed, (block, k) in enumerate([(16, 1), (8, 2)]):
        model = model_for(family, seed + 3)
        prompt = random_prompt(7, seed)
        want = d2cache_vanilla(model, prompt, block, k, alg, sigma=None)
        got = dlmpipe_states(model, {"name": "llada_confidence", "block_length": block,
                                     "steps": GEN // k, "confidence": alg}, prompt)
        assert_same_states(got, want)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sigma,alg", [(10.0, "maskgit_plus"), (2.0, "maskgit_plus"),
                                       (0.7, "maskgit_plus"), (3.0, "topk_margin"),
                                       (3.0, "entropy")])
def test_certainty_prior_is_d2cache_decoding_with_sigma(family, sigma, alg):
    for seed, (block, k) in enumerate([(16, 1), (16, 2), (8, 1)]):
        model = model_for(family, seed + 5)
        prompt = random_prompt(5 + 2 * seed, seed)
        want = d2cache_vanilla(model, prompt, block, k, alg, sigma)
        got = dlmpipe_states(model, {"name": "certainty_prior", "block_length": block,
                                     "steps": GEN // k, "sigma": sigma, "confidence": alg},
                             prompt)
        assert_same_states(got, want)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lambd,alpha", [(0.25, 10), (1.0, 10), (0.0, 10), (0.25, 0.3)])
def test_pc_sampler_is_generate_with_pc_sampler(family, corpus_file, lambd, alpha):
    score = released_pc_score(corpus_file, lambd, alpha)
    for seed, (block, steps, temp) in enumerate([(16, 16, 0.0), (8, 8, 0.0), (8, 16, 0.8)]):
        model = model_for(family, seed + 9)
        prompt = random_prompt(6, seed)
        want = llada_generate(model, prompt, steps, block, temp, seed, score=score)
        got = dlmpipe_states(model, {"name": "pc_sampler", "block_length": block, "steps": steps,
                                     "temperature": temp, "lambd": lambd, "alpha": alpha,
                                     "baseline_name": str(corpus_file)}, prompt, seed)
        assert_same_states(got, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_new_scores_change_decisions(family):
    """The parity and generalisation tests could pass on a no-op: the prior, the position weight
    and the margin each change some decoding of these tiny models."""
    variants = {"sigma": {"name": "certainty_prior", "sigma": 1.0},
                "lambd": {"name": "pc_sampler", "lambd": 1.0},
                "margin": {"name": "llada_confidence", "confidence": "topk_margin"}}
    differs = dict.fromkeys(variants, False)
    for seed in range(4):
        if all(differs.values()):
            break  # (each change already seen: the verdict is the same)
        model = model_for(family, seed)
        prompt = random_prompt(6, seed)
        base = dlmpipe_states(model, {"name": "llada_confidence"}, prompt)
        for key, spec in variants.items():
            if not differs[key]:
                states = dlmpipe_states(model, spec, prompt)
                differs[key] = any(not torch.equal(a, b) for a, b in zip(states, base))
    assert all(differs.values()), differs


@pytest.mark.parametrize("family", FAMILIES)
def test_the_calibration_changes_decisions(family, corpus_file):
    changed = False
    for seed in range(4):
        if changed:
            break  # (seen: the verdict is the same)
        model = model_for(family, seed)
        prompt = random_prompt(6, seed)
        plain = dlmpipe_states(model, {"name": "pc_sampler", "lambd": 0}, prompt)
        calibrated = dlmpipe_states(model, {"name": "pc_sampler", "lambd": 0,
                                            "baseline_name": str(corpus_file)}, prompt)
        changed |= any(not torch.equal(a, b) for a, b in zip(plain, calibrated))
    assert changed


# ---- rules on hand-built logits -----------------------------------------------------------
def test_token_confidence_kinds():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 0.0, 3.0, 2.9]])
    tokens = logits.argmax(-1)
    p = torch.softmax(logits.double(), -1)
    p_half = torch.softmax(logits.double() / 0.5, -1)
    prob = token_confidence(logits, tokens, "probability", 0.5)
    assert torch.equal(prob, p.gather(-1, tokens[:, None])[:, 0])  # untempered, LLaDA's
    assert torch.equal(token_confidence(logits, tokens, "maskgit_plus", 0), prob)
    assert torch.allclose(token_confidence(logits, tokens, "maskgit_plus", 0.5),
                          p_half.gather(-1, tokens[:, None])[:, 0])  # tempered, Dream's
    top = p.sort(-1, descending=True).values
    assert torch.allclose(token_confidence(logits, tokens, "topk_margin", 0), top[:, 0] - top[:, 1])
    assert torch.allclose(token_confidence(logits, tokens, "entropy", 0),
                          (p * torch.log(p + 1e-10)).sum(-1))
    assert (token_confidence(logits, tokens, "entropy", 0) < 0).all()
    with pytest.raises(ValueError, match="unknown confidence"):
        token_confidence(logits, tokens, "margin", 0)
    with pytest.raises(ValueError, match="confidence must be one of probability, maskgit_plus"):
        build_sampler({"name": "llada_confidence", "confidence": "margin"})


def _rows(tops: list[tuple[int, float, float]]) -> torch.Tensor:
    """Rows giving token t probability p1, token t+1 probability p2, the rest spread evenly."""
    rows = []
    for t, p1, p2 in tops:
        rest = (1 - p1 - p2) / (HAND_VOCAB - 2)
        row = torch.full((HAND_VOCAB,), math.log(rest), dtype=torch.float64)
        row[t], row[t + 1] = math.log(p1), math.log(p2)
        rows.append(row)
    return torch.stack(rows).float()


def test_topk_margin_and_entropy_rank_otherwise_than_probability():
    # position 0: 0.50 / 0.45 (confident but split), position 1: 0.40 / 0.06 (a clear winner)
    logits = _rows([(1, 0.50, 0.45), (3, 0.40, 0.06)])
    chosen = {}
    for kind in ("probability", "maskgit_plus", "topk_margin", "entropy"):
        s = build_sampler({"name": "llada_confidence", "steps": 2, "confidence": kind})
        x = start(s, 2)
        s.step(x, logits)
        chosen[kind] = (x[HAND_PROMPT:] != HAND_MASK).nonzero()[:, 0].tolist()
    assert chosen == {"probability": [0], "maskgit_plus": [0], "topk_margin": [1], "entropy": [0]}


@pytest.mark.parametrize("G", [1, 2, 5, 16, 33])
@pytest.mark.parametrize("sigma", [0.5, 3.0, 10.0, 100.0])
def test_certainty_density_is_the_released_fft_one(G, sigma):
    g = torch.Generator().manual_seed(G)
    for _ in range(4):
        decoded = torch.rand(G, generator=g) < 0.4
        for last in (False, True):
            decoded[-1] = last
            got = certainty_density(decoded, sigma)
            assert got.dtype == torch.float64 and got.shape == (G,)
            assert torch.allclose(got, fft_certainty_density(decoded, sigma).double(),
                                  rtol=1e-5, atol=1e-6)


def test_certainty_density_sides_and_constant_limit():
    G = 12
    none = certainty_density(torch.zeros(G, dtype=torch.bool), 2.0)
    assert (none[1:] < none[:-1]).all()  # only the prompt side is decoded: decreasing
    last = torch.zeros(G, dtype=torch.bool)
    last[-1] = True
    with_last = certainty_density(last, 2.0)
    assert with_last[-1] > with_last[-2] > none[-2]  # right side: once the last is decoded
    batch = torch.stack([torch.zeros(G, dtype=torch.bool), last])
    assert torch.equal(certainty_density(batch, 2.0), torch.stack([none, with_last]))
    for decoded in (torch.zeros(G, dtype=torch.bool), last, torch.rand(G) < 0.5):
        flat = certainty_density(decoded, "inf")
        assert (flat == flat[0]).all()  # exactly constant: sigma = inf is plain confidence
        m = decoded.double()
        assert flat[0] == (G + m.sum() + G * m[-1]) / (6 * G)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        CertaintyPrior(4, 0.0)


def test_certainty_prior_prefers_a_less_confident_neighbour_of_decoded_tokens():
    # positions 0-2 decoded; position 3 (next to them) p = 0.5, position 7 (far) p = 0.9
    logits = logits_for([4] * 8, [0.3, 0.3, 0.3, 0.5, 0.2, 0.2, 0.2, 0.9])
    picks = {}
    for sigma in (1.0, 10.0, "inf"):
        s = build_sampler({"name": "certainty_prior", "sigma": sigma, "steps": 8})
        x = start(s, 8)
        x[HAND_PROMPT:HAND_PROMPT + 3] = 5
        s.block_step = 3  # the block's first three steps are done
        s.schedule = [1] * 8
        s.step(x, logits)
        picks[sigma] = (x[HAND_PROMPT:] == 4).nonzero()[:, 0].tolist()
    assert picks == {1.0: [3], 10.0: [7], "inf": [7]}


def test_pc_sampler_position_weight_and_clip():
    logits = logits_for([4] * 4, [0.5, 0.6, 0.7, 0.8])
    picks = {}
    for lambd, alpha in ((0.0, 10), (0.1, 10), (1.0, 10), (1e-3, 0.55)):
        s = build_sampler({"name": "pc_sampler", "lambd": lambd, "alpha": alpha, "steps": 2})
        x = start(s, 4)
        s.step(x, logits)
        picks[(lambd, alpha)] = (x[HAND_PROMPT:] == 4).nonzero()[:, 0].tolist()
    assert picks[(0.0, 10)] == [2, 3]      # plain confidence
    assert picks[(0.1, 10)] == [2, 3]      # 0.8 e^-0.3 > 0.7 e^-0.2 > 0.6 e^-0.1 > 0.5
    assert picks[(1.0, 10)] == [0, 1]      # 0.5 > 0.6 / e > 0.7 / e^2 > 0.8 / e^3
    assert picks[(1e-3, 0.55)] == [1, 2]   # clipped to 0.55: the position weight breaks the tie


def test_pc_sampler_calibration_demotes_frequent_tokens(tmp_path):
    """Token 4 is a tenth of the corpus, token 5 appears once, token 6 is not listed
    (background 1 / num_token): without a position weight the most probable token, 4, is decoded
    last; every score is exp(-lambd * offset) * min(p * -log(f + 1e-9), alpha)."""
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps({"num_token": 1000, "p_baseline_dict": {"4": 100, "5": 1}}))
    logits = logits_for([4, 5, 6], [0.7, 0.6, 0.55])
    p = torch.softmax(logits.double(), -1)[torch.arange(3), torch.tensor([4, 5, 6])]
    f = torch.tensor([0.1, 0.001, 0.001], dtype=torch.float64)
    orders = {}
    for lambd in (0.0, 0.5):
        s = build_sampler({"name": "pc_sampler", "lambd": lambd, "baseline_name": str(path),
                           "alpha": 4.0, "steps": 3})
        x = start(s, 3)
        want = torch.exp(-lambd * torch.arange(3.0, dtype=torch.float64)) * torch.clamp_max(
            -p * torch.log(f + 1e-9), 4.0)
        orders[lambd] = []
        for _ in range(3):
            before = x.clone()
            s.step(x, logits)
            orders[lambd] += (x != before).nonzero()[:, 0].sub(HAND_PROMPT).tolist()
        assert orders[lambd] == torch.argsort(want, descending=True).tolist()
        _, got = s._score(logits, torch.full((3,), HAND_MASK))
        assert torch.allclose(got, want, rtol=1e-12)
    assert orders == {0.0: [1, 2, 0], 0.5: [1, 0, 2]}


def test_reference_corpus_loading(tmp_path):
    built = reference_corpus([[1, 2, 2], [2, 7]])
    assert built == {"num_token": 5, "p_baseline_dict": {"1": 1, "2": 3, "7": 1}}
    released = tmp_path / "released.json"
    released.write_text(json.dumps(built))
    assert load_reference_corpus(released) == (5, {1: 1, 2: 3, 7: 1})
    counted = tmp_path / "counted.json"  # the released counting script's key
    counted.write_text(json.dumps({"num_token": 5, "token_frequency_dict": {"2": 3},
                                   "metadata": {}}))
    assert load_reference_corpus(counted) == (5, {2: 3})
    prior = frequency_prior(5, {1: 1, 2: 3, 7: 1}, 9)
    assert torch.equal(prior, torch.tensor([0.2, 0.2, 0.6, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2],
                                           dtype=torch.float64))
    with pytest.raises(ValueError, match="beyond the model's vocabulary of 5"):
        frequency_prior(5, {7: 1}, 5)
    with pytest.raises(FileNotFoundError, match="reference corpus .* not found"):
        build_sampler({"name": "pc_sampler", "baseline_name": str(tmp_path / "missing.json")})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"counts": {}}))
    with pytest.raises(ValueError, match="is not a reference corpus"):
        load_reference_corpus(bad)
    # a corpus of a larger vocabulary fails at the first step, naming the problem
    s = build_sampler({"name": "pc_sampler", "baseline_name": str(released), "steps": 2})
    x = start(s, 2)
    with pytest.raises(ValueError, match="up to 7, beyond the model's vocabulary of 5"):
        s.step(x, torch.zeros(2, 5))


# ---- capturable scoring steps ---------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_captured_scoring_decodes_the_eager_tokens(monkeypatch, family, corpus_file):
    """The scoring steps stay capturable (dlmpipe/graphs.py): replayed on the CPU stand-in they
    give the eager tokens, captured once per sampler and shape (the prior and the weights are
    allocated before the capture and kept across samples)."""
    monkeypatch.setitem(graphs.CAPTURE, "cpu", replay_capture)
    model = model_for(family, 3)  # (the capture is the sampler's, not the model's)
    specs = [{"name": "llada_confidence", "confidence": c, "temperature": t}
             for c in ("probability", "maskgit_plus", "topk_margin", "entropy") for t in (0, 0.7)]
    specs += [{"name": "certainty_prior", "sigma": 2.0, "block_length": 8},
              {"name": "certainty_prior", "sigma": 5.0, "confidence": "topk_margin",
               "temperature": 0.7},
              {"name": "pc_sampler", "block_length": 8, "baseline_name": str(corpus_file)},
              {"name": "pc_sampler", "lambd": 1.0, "temperature": 0.7}]
    for spec in specs:
        method = {"sampler": spec, "cache": NONE}
        s, c = build_method(method, model, compile="cuda_graphs")
        for i in range(2):
            prompt = random_prompt(7, i)
            got = decode(model, s, c, prompt, GEN, torch.Generator().manual_seed(i))
            e_s, e_c = build_method(method, model)
            want = decode(model, e_s, e_c, prompt, GEN, torch.Generator().manual_seed(i))
            assert torch.equal(got.response, want.response), spec
        assert s.scoring.captures == 1, spec


@pytest.fixture(scope="module")
def small_toy(tmp_path_factory):
    """A toy checkpoint (its tokenizer, LLaDA's format) after one training step: seconds."""
    from dlmpipe.backbones.toy import train_toy

    out = tmp_path_factory.mktemp("toy")
    train_toy(out, steps=1, batch_size=2, d_model=32, n_layers=1, n_heads=2, mlp_hidden=64,
              threads=1, log=lambda *_: None)
    return out


def test_a_reference_corpus_from_texts_calibrates_the_toy(tmp_path, small_toy):
    """``dlmpipe reference-corpus`` counts JSON-lines texts with a backbone's tokenizer into the
    released format (the released counting script's rule: the keys' strings, each followed by a
    space, no special tokens); PC-Sampler decodes the toy with it."""
    from dlmpipe.backbones import load_backbone
    from dlmpipe.backbones.tokenizer import load_tokenizer
    from dlmpipe.cli import main

    toy_checkpoint = small_toy
    toy = load_backbone(small_toy).model

    lines = [{"question": "1+2=", "answer": "3"}, {"question": "def f(x): return x"},
             {"other": "not counted"}, {"question": 7, "answer": "12 + 30 = 42"}]
    data = tmp_path / "texts.jsonl"
    data.write_text("\n".join(json.dumps(obj) for obj in lines) + "\n\n")
    out = tmp_path / "corpus.json"
    assert main(["reference-corpus", "--checkpoint", str(toy_checkpoint), "--input", str(data),
                 "--keys", "question,answer", "--out", str(out)]) == 0
    tok = load_tokenizer(toy_checkpoint)
    texts = ["1+2= 3 ", "def f(x): return x ", "12 + 30 = 42 "]
    want = reference_corpus(tok.encode(t, add_special_tokens=False) for t in texts)
    num_token, counts = load_reference_corpus(out)
    assert (num_token, counts) == (want["num_token"],
                                   {int(t): c for t, c in want["p_baseline_dict"].items()})
    assert json.loads(out.read_text())["metadata"]["keys"] == ["question", "answer"]
    prompt = torch.tensor(tok.encode("1+2=", add_special_tokens=False))
    spec = {"name": "pc_sampler", "baseline_name": str(out), "block_length": 8, "steps": 16}
    result = decode(toy, *build_method({"sampler": spec, "cache": NONE}, toy), prompt, GEN)
    assert (result.response != toy.cfg.mask_id).all() and result.stats["steps"] == 16
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["reference-corpus", "--checkpoint", str(toy_checkpoint), "--input", str(bad),
                 "--keys", "question", "--out", str(tmp_path / "x.json")]) == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_no_step_reads_back_with_a_corpus_or_a_prior(monkeypatch, family, corpus_file):
    """The host-read budget (tests/test_host_sync.py) with the data loaded: the corpus table and
    the density weights are built outside the steps, so no step reads anything back."""
    from .host_sync import host_reads, per_step_reads

    model = model_for(family, 4)
    prompt = random_prompt(9, 4)
    for spec in ({"name": "pc_sampler", "baseline_name": str(corpus_file), "block_length": 8},
                 {"name": "certainty_prior", "sigma": 3.0, "temperature": 0.7}):
        s, c = build_method({"sampler": spec, "cache": NONE}, model)
        with host_reads(monkeypatch) as counter:
            _, steps = per_step_reads(counter, model, s, c, prompt)
        assert steps == [0] * GEN, (spec, counter.where)
