"""The mechanism probes (docs/ANALYSES.md): the shadow-forward probe changes nothing on the
main trajectory and measures what it claims (Archer's anchor and age, full recompute's next
state, zero disagreement at K = 1); the matched-state intervention branches where the paper
says and forces exactly one forward; the drift profile's instrumented forward is the model's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlmpipe import registry
from dlmpipe.decode import Decoding, Observer, decode
from dlmpipe.engine.base import Cache
from dlmpipe.methods import build_method
from dlmpipe.probes.drift import SERIES, DriftProfile, layer_states
from dlmpipe.probes.intervention import AcceptanceWatch, intervene, run_branch
from dlmpipe.probes.shadow import Action, ShadowProbe, hamming

from .models import MASK_ID, random_prompt, tiny_backbone
from .test_snapshot import PAIRS, cache_spec, sampler_spec

SABER = {"name": "saber", "n": 2, "mu": 2}


class Recorder(Observer):
    """Everything the main trajectory shows at each update: the logits the sampler read, the
    next state, the cache's counters."""

    def __init__(self, *inner: Observer):
        self.inner, self.steps = inner, []

    def before_update(self, run, logits):
        for o in self.inner:
            o.before_update(run, logits)
        self.logits = logits.clone()

    def after_update(self, run):
        for o in self.inner:
            o.after_update(run)
        self.steps.append((self.logits, run.x.clone(), dict(run.cache.stats.as_dict())))


def same(a, b) -> bool:
    """Equal values, tensors compared exactly (NaN equal to NaN); generators by their state;
    other objects (step runners) hold no decoding state of their own."""
    if not isinstance(a, (torch.Tensor, torch.Generator, tuple, list, dict, int, float, str,
                          torch.device, type(None))):
        return True
    if isinstance(a, torch.Tensor):
        return torch.equal(a.nan_to_num(), b.nan_to_num())
    if isinstance(a, torch.Generator):
        return torch.equal(a.get_state(), b.get_state())
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def decode_with(model, sampler: dict, cache: dict, prompt, observer, seed: int = 5, gen_len: int = 16):
    s, c = build_method({"sampler": sampler, "cache": cache}, model)
    generator = torch.Generator().manual_seed(seed)
    result = decode(model, s, c, prompt, gen_len, generator, observer)
    return result, s, generator


# ---- the shadow probe ----------------------------------------------------------------------
FULL_PAIRS = [(s, c) for s, c in PAIRS  # on a full-attention model (block-causal: at the end)
              if not registry.attention_problems({"sampler": {"name": s}, "cache": {"name": c}}, "full")]


@pytest.mark.parametrize("sampler,cache", FULL_PAIRS, ids=[f"{s}/{c}" for s, c in FULL_PAIRS])
def test_the_shadow_probe_leaves_the_main_trajectory_bit_identical(sampler, cache):
    """Tokens, logits (hence confidences), refresh decisions, random state, steps, NFE,
    revisions and every statistic of a probed run equal an unprobed run's, update by update:
    one run probed by two probes, one probing every update and one half the cached ones (each
    probe's own path runs on updates the other skips: the latter's rate and cached-only skips,
    the former's refresh updates), against one unprobed run."""
    model = tiny_backbone("llada", seed=6, n_layers=2)
    prompt = random_prompt(8, 6)
    s_spec, c_spec = sampler_spec(sampler), cache_spec(cache)
    plain = Recorder()
    ref, ref_sampler, ref_gen = decode_with(model, s_spec, c_spec, prompt, plain)
    every = ShadowProbe(rate=1.0, steps="all", seed=1).start("x")
    half = ShadowProbe(rate=0.5, steps="cached", seed=1).start("x")
    probed = Recorder(every, half)
    got, got_sampler, got_gen = decode_with(model, s_spec, c_spec, prompt, probed)
    assert torch.equal(got.response, ref.response) and got.stats == ref.stats
    assert len(probed.steps) == len(plain.steps) == ref.stats["steps"]
    for (la, xa, ca), (lb, xb, cb) in zip(probed.steps, plain.steps):
        assert torch.equal(la.nan_to_num(), lb.nan_to_num()) and torch.equal(xa, xb) and ca == cb
    assert torch.equal(got_gen.get_state(), ref_gen.get_state())
    for key, value in vars(ref_sampler).items():  # e.g. Saber's acceptance confidences
        assert same(value, vars(got_sampler)[key]), key
    assert len(every.records) == ref.stats["steps"]
    assert all(r["cached"] for r in half.records)
    assert len(half.records) <= ref.stats["cached_forwards"]


def test_k1_shows_zero_action_disagreement():
    """Archer K = 1 recomputes whenever the response changed, and Saber changes it at every
    update, so no update is cached; probing every update, the fresh and the cache's logits are
    the same full forward and every action and next state agree."""
    model = tiny_backbone("llada", seed=7, n_layers=3)
    for seed in range(3):
        prompt = random_prompt(10, seed)
        probe = ShadowProbe(steps="all").start(str(seed))
        result, _, _ = decode_with(model, SABER, {"name": "archer", "K": 1}, prompt, probe, seed)
        assert result.stats["cached_forwards"] == 0 and len(probe.records) == result.stats["steps"]
        assert not any(r["action_differs"] or r["cached"] for r in probe.records)
        assert all(r["next_state_distance"] == 0 for r in probe.records)
        assert max(r["logit_drift_max"] for r in probe.records) < 1e-5
        cached_only = ShadowProbe(steps="cached").start(str(seed))
        decode_with(model, SABER, {"name": "archer", "K": 1}, prompt, cached_only, seed)
        assert cached_only.records == []


def test_stale_prompt_keys_make_actions_disagree():
    """The instrument can see disagreement: Archer K = inf over random tiny models."""
    model = tiny_backbone("llada", seed=1, n_layers=3)
    probe = ShadowProbe().start("a")
    decode_with(model, SABER, {"name": "archer", "K": "inf"}, random_prompt(10, 1), probe)
    assert len(probe.records) > 5 and any(r["action_differs"] for r in probe.records)
    assert all(r["logit_drift_max"] > 0 for r in probe.records)


class CheckedProbe(ShadowProbe):
    """Checks each probe's anchor distance and age against Archer's own state."""

    def before_update(self, run, logits):
        super().before_update(run, logits)
        if self.pending is not None and self.pending["cached"]:
            assert self.pending["anchor_distance"] == hamming(run.response, run.cache.anchor)
            assert self.pending["cache_age"] == run.cache.updates_since_refresh
            self.checked += 1


def test_anchor_distance_and_age_are_archers():
    model = tiny_backbone("llada", seed=3, n_layers=2)
    for K in (2, 4, 8):
        probe = CheckedProbe().start("k")
        probe.checked = 0
        result, _, _ = decode_with(model, SABER, {"name": "archer", "K": K}, random_prompt(9, K), probe)
        assert probe.checked == len(probe.records) == result.stats["cached_forwards"] > 0
        assert all(0 <= r["anchor_distance"] < K and r["cache_age"] >= 1 for r in probe.records)


def test_the_fresh_next_state_is_full_recomputes():
    """Archer K = inf and full recompute share update 0 (a full forward) and so the state at
    update 1; the probe's fresh next state there is full recompute's state after update 1."""
    model = tiny_backbone("llada", seed=8, n_layers=3)
    for seed in range(3):
        prompt = random_prompt(11, seed)
        full = Recorder()
        decode_with(model, SABER, {"name": "none"}, prompt, full, seed)
        archer = Recorder(probe := ShadowProbe().start("f"))
        decode_with(model, SABER, {"name": "archer", "K": "inf"}, prompt, archer, seed)
        assert torch.equal(full.steps[0][1], archer.steps[0][1])
        first = probe.records[0]
        assert first["update"] == 1
        assert first["next_state_distance"] == hamming(archer.steps[1][1], full.steps[1][1])


def test_sabers_recorded_action_explains_the_state_change():
    """Saber's (accepted, tokens, re-masked) account for every change of the state; a position
    accepted and re-masked in one update is the only thing a state diff cannot see."""
    model = tiny_backbone("llada", seed=9, n_layers=2)
    s, c = build_method({"sampler": SABER, "cache": {"name": "none"}}, model)
    run = Decoding(model, s, c, random_prompt(6, 9), 16)
    with torch.inference_mode():
        while not run.done:
            before = run.response.clone()
            run.step()
            recorded = Action.of(run.sampler, before, run.response, MASK_ID)
            s.last_action, saved = None, s.last_action
            derived = Action.of(run.sampler, before, run.response, MASK_ID)
            s.last_action = saved
            both = set(recorded.accepted.tolist()) & set(recorded.remasked.tolist())
            assert set(derived.accepted.tolist()) == set(recorded.accepted.tolist()) - both
            assert set(derived.remasked.tolist()) == set(recorded.remasked.tolist()) - both
            assert (run.response[recorded.accepted] == recorded.tokens)[
                ~torch.isin(recorded.accepted, recorded.remasked)].all()


# ---- the matched-state intervention -------------------------------------------------------
def test_every_cache_that_declares_the_intervention_can_force_its_next_forward():
    for name, entry in registry.CACHES.items():
        overrides = entry.load().force_next is not Cache.force_next
        assert overrides == entry.feedback_intervention, name


def _reference_branch_point(model, prompt, threshold, cache=None):
    """The branch point by hand: the first update accepting (and keeping) a token with
    softmax probability >= threshold under that update's logits."""
    rec = Recorder()
    decode_with(model, SABER, cache or {"name": "archer", "K": 4}, prompt, rec, seed=0)
    before = torch.cat([prompt, torch.full((16,), MASK_ID)])
    for update, (logits, after, _) in enumerate(rec.steps, start=1):
        b, a = before[len(prompt):], after[len(prompt):]
        new = ((b == MASK_ID) & (a != MASK_ID)).nonzero()[:, 0]
        p = torch.softmax(logits[new].double(), -1).gather(-1, a[new][:, None])[:, 0]
        if new.numel() and float(p.max()) >= threshold:
            i = int(torch.argmax(p))
            return update, int(new[i]), int(a[new[i]]), float(p[i])
        before = after
    return None


def test_the_branch_point_is_the_first_confident_acceptance():
    model = tiny_backbone("llada", seed=2, n_layers=2, scale=1.5)
    found = 0
    for seed in range(4):
        prompt = random_prompt(8, seed)
        for threshold in (0.2, 0.5, 0.9):
            s, c = build_method({"sampler": SABER, "cache": {"name": "archer", "K": 4}}, model)
            point, branches = intervene(model, s, c, prompt, 16, torch.Generator().manual_seed(0),
                                        threshold)
            expected = _reference_branch_point(model, prompt, threshold)
            if expected is None:
                assert point is None and branches == {}
                continue
            found += 1
            assert (point.update, point.position, point.token) == expected[:3]
            assert point.confidence == pytest.approx(expected[3])
            assert set(branches) == {"fresh", "cached"}
    assert found >= 3


def _branch_state(model, cache: dict, threshold: float = 0.2, seed: int = 0):
    """The decoder state at the branch point and the branch point (None, None: there is none)."""
    s, c = build_method({"sampler": SABER, "cache": cache}, model)
    with torch.inference_mode():
        run = Decoding(model, s, c, random_prompt(8, seed), 16, torch.Generator().manual_seed(0))
        watch = AcceptanceWatch(threshold)
        while not run.done and watch.found is None:
            run.step(watch)
    if watch.found is None or run.done:
        return None, None
    return run, watch.found


def test_fresh_rebuilds_and_cached_reuses_for_exactly_one_update():
    model = tiny_backbone("llada", seed=2, n_layers=2, scale=1.5)
    run, _ = _branch_state(model, {"name": "archer", "K": 1})
    assert run is not None
    with torch.inference_mode():
        for refresh in (True, False):
            branch = run.clone()
            before = dict(branch.cache.stats.as_dict())
            branch.cache.force_next(refresh)
            branch.step()
            after = branch.cache.stats.as_dict()
            assert after["refreshes"] - before["refreshes"] == int(refresh)
            assert after["cached_forwards"] - before["cached_forwards"] == int(not refresh)
            if not branch.done:  # then K = 1's own rule again: the changed response refreshes
                branch.step()
                assert branch.cache.stats.refreshes == after["refreshes"] + 1


def test_at_k1_the_fresh_branch_is_the_unintervened_trajectory():
    """K = 1 refreshes after every change anyway, so forcing a refresh changes nothing: the
    Fresh branch finishes exactly like the method's own decoding."""
    model = tiny_backbone("llada", seed=2, n_layers=2, scale=1.5)
    for seed in range(3):
        run, point = _branch_state(model, {"name": "archer", "K": 1}, seed=seed)
        assert run is not None
        plain = run.clone()
        with torch.inference_mode():
            while not plain.done:
                plain.step()
            fresh = run_branch(run, point, refresh=True, follow=5)
            cached = run_branch(run, point, refresh=False, follow=5)
        assert fresh.response == plain.response.tolist() and fresh.stats == plain.stats()
        assert cached.stats["cached_forwards"] == 1


def test_revised_at_is_the_first_followed_update_without_the_token():
    model = tiny_backbone("llada", seed=2, n_layers=2, scale=3.0)
    seen = set()
    for seed in range(6):
        run, point = _branch_state(model, {"name": "archer", "K": 4}, threshold=0.9, seed=seed)
        if run is None:
            continue
        for refresh, follow in ((True, 5), (False, 5), (False, 1)):
            with torch.inference_mode():
                result = run_branch(run, point, refresh, follow)
                replay = run.clone()
                replay.cache.force_next(refresh)
                held = []
                while not replay.done:
                    replay.step()
                    held.append(int(replay.response[point.position]) == point.token)
            expected = next((k for k, h in enumerate(held[:follow], start=1) if not h), None)
            assert result.revised_at == expected
            seen.add(expected is None)
    assert seen == {True, False}  # both outcomes occur


def test_the_intervention_refuses_a_cache_without_a_prompt_snapshot(tmp_path):
    from dlmpipe.probes.jobs import run_intervention_job

    method = {"name": "saber", "gen_length": 16, "sampler": SABER, "cache": {"name": "none"}}
    with pytest.raises(ValueError, match="prompt snapshot.*archer"):
        run_intervention_job("missing.json", "missing.parquet", method, str(tmp_path / "p.parquet"),
                             str(tmp_path / "f.parquet"), str(tmp_path / "c.parquet"))


# ---- the drift profile ----------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llada", "dream"])
@torch.inference_mode()
def test_the_instrumented_forward_is_the_models(family):
    model = tiny_backbone(family, seed=4, n_layers=3)
    x = torch.cat([random_prompt(6, 4), torch.full((8,), MASK_ID)])
    x[8] = 5
    states = layer_states(model, x, 6)
    h = model.embed(x[None])
    rope = model.rope(torch.arange(x.shape[0]))
    for i in range(model.cfg.n_layers):
        assert torch.equal(states[i]["input"], h[0, 6:])
        _, _, v = model.qkv(i, h, rope)
        assert torch.equal(states[i]["value"], v[0, :, 6:].transpose(0, 1).reshape(8, -1))
        h, _, _ = model.layer(i, h, rope)


@torch.inference_mode()
def test_drift_records_count_what_changed():
    """Layer 0's input is the token embedding: a token drifts there exactly when it changed
    since the previous update. At full rank the singular proxy is as similar as the value
    vectors (no bias: the proxy is an isometry of them, engine/proxies.py)."""
    from dlmpipe.engine.proxies import resolve_proxies

    model = tiny_backbone("llada", seed=5, n_layers=2)
    emb = F.normalize(model.embed.weight, dim=-1)
    off = (emb @ emb.T) - torch.eye(emb.shape[0])
    assert off.max() < 0.95  # distinct tokens never look alike to the threshold
    prox = resolve_proxies(None, model)
    weights = [prox.projection(i, prox.stored_rank) for i in range(model.cfg.n_layers)]
    profile = DriftProfile(weights).start()
    rec = Recorder(profile)
    decode_with(model, {"name": "llada_confidence"}, {"name": "none"}, random_prompt(7, 5), rec)
    states = [torch.cat([random_prompt(7, 5), torch.full((16,), MASK_ID)])] + [x for _, x, _ in rec.steps]
    by = {(r["update"], r["layer"], r["series"]): r for r in profile.records}
    assert {s for _, _, s in by} == set(SERIES)
    for update in range(1, len(rec.steps)):
        changed = int((states[update] != states[update - 1]).sum())
        assert by[(update, 0, "input")]["drifting"] == changed
        for layer in range(model.cfg.n_layers):
            assert by[(update, layer, "proxy")]["mean_similarity"] == pytest.approx(
                by[(update, layer, "value")]["mean_similarity"], abs=1e-5)


# ---- the probes on a block-causal backbone (the sampler's view: the active block) -----------
def _block_model():
    return tiny_backbone("sdar", seed=4, n_layers=2, scale=1.5, stop_ids=[])


@pytest.mark.parametrize("observer", ["shadow", "drift"])
def test_the_probes_leave_a_block_causal_decode_bit_identical(observer):
    """A probed block-causal decode equals the unprobed one: tokens, logits, every statistic
    (``rows_computed`` included: the probes' own full forwards over the active block are not
    the decode's), update by update; the probe records updates of every block."""
    model = _block_model()
    prompt = random_prompt(11, 3)  # ends inside a block: the first block has a prompt part
    plain = Recorder()
    ref, _, ref_gen = decode_with(model, SABER, {"name": "archer", "K": 4}, prompt, plain, gen_len=24)
    probe = ShadowProbe(steps="all").start("b") if observer == "shadow" else DriftProfile()
    probed = Recorder(probe)
    got, _, got_gen = decode_with(model, SABER, {"name": "archer", "K": 4}, prompt, probed, gen_len=24)
    assert torch.equal(got.response, ref.response) and got.stats == ref.stats
    assert ref.stats["block_forwards"] >= 3
    for (la, xa, ca), (lb, xb, cb) in zip(probed.steps, plain.steps, strict=True):
        assert torch.equal(la.nan_to_num(), lb.nan_to_num()) and torch.equal(xa, xb) and ca == cb
    assert torch.equal(got_gen.get_state(), ref_gen.get_state())
    if observer == "shadow":
        assert len(probe.records) == ref.stats["steps"]
        assert max(r["masked"] for r in probe.records) <= model.cfg.block_size
    else:  # compared within a block: never more rows than the block decodes, never across two
        assert probe.records and max(r["tokens"] for r in probe.records) <= model.cfg.block_size


def test_k1_on_a_block_causal_backbone_shows_zero_action_disagreement():
    """The shadow instrument's check on the active block: Archer K = 1 recomputes after every
    change, so the fresh logits (a full forward of the block over the finished prefix's exact
    K/V) are the cache's own and every action and next state agree."""
    model = _block_model()
    for seed in range(2):
        probe = ShadowProbe(steps="all").start(str(seed))
        result, _, _ = decode_with(model, SABER, {"name": "archer", "K": 1}, random_prompt(11, seed),
                                   probe, seed, gen_len=24)
        assert result.stats["cached_forwards"] == 0 and len(probe.records) == result.stats["steps"]
        assert not any(r["action_differs"] for r in probe.records)
        assert all(r["next_state_distance"] == 0 for r in probe.records)
        assert max(r["logit_drift_max"] for r in probe.records) < 1e-5


def test_a_branch_point_in_a_later_block_names_its_position_in_the_whole_response():
    """The acceptance watch reads the active block's logits and actions; the branch point's
    position is the token's place in the response (what the branches follow), not in the block."""
    model = _block_model()
    s, c = build_method({"sampler": SABER, "cache": {"name": "archer", "K": 4}}, model)
    with torch.inference_mode():
        run = Decoding(model, s, c, random_prompt(11, 0), 24, torch.Generator().manual_seed(0))
        while run.active_offset == 0:  # into the second block
            run.step()
        watch = AcceptanceWatch(0.0)
        run.step(watch)
    point = watch.found
    assert point is not None and point.position >= model.cfg.block_size - 11 % model.cfg.block_size
    assert int(run.response[point.position]) == point.token
    s, c = build_method({"sampler": SABER, "cache": {"name": "archer", "K": 4}}, model)
    point, branches = intervene(model, s, c, random_prompt(11, 0), 24, torch.Generator().manual_seed(0), 0.0)
    assert point is not None and set(branches) == {"fresh", "cached"}
