"""d2Cache (docs/METHODS.md §2.7): step-level parity with a plain re-statement of the released
algorithm on tiny checkpoints of both families, the cached step on an unchanged sequence, the
attention rollout against a direct computation, and the certainty density against the
release's FFT form.

``Released`` below is written from the release's logic (its cache hooks, the vanilla generation
step and the low-confidence sampler), batch of one: eager attention with explicit
probabilities and repeated K/V heads, the full ``T x T`` rollout, zero logits for rows without a
query, the selection made at the end of each step from the frame before and after it. It shares
no code with dlmpipe's cache (only the model's weights, norms and RoPE).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dlmpipe.decode import decode
from dlmpipe.engine.d2cache import certainty_density, density_weights, inflate, nucleus
from dlmpipe.engine.full import full_response_logits
from dlmpipe.methods import build_cache, build_sampler

from .models import FAMILIES, MASK_ID, random_prompt, tiny_backbone


# ---- the release, restated -------------------------------------------------------------------
def fft_density(decoded: torch.Tensor, sigma: float) -> torch.Tensor:
    """The release's certainty density ([G] bool -> [G]) by FFT, as it computes it."""
    length = decoded.shape[0]
    padded = F.pad(decoded.float()[None], (length, length), value=1.0)
    if not decoded[-1]:
        padded[:, 2 * length:] = 0.0
    ext = 3 * length
    dist = torch.cat([torch.arange(ext), torch.arange(-ext, 0)]).float()
    kernel = torch.fft.fft(torch.exp(-dist ** 2 / (2 * sigma ** 2)), n=2 * ext)
    num = torch.fft.ifft(torch.fft.fft(F.pad(padded, (0, ext)), n=2 * ext) * kernel, n=2 * ext).real
    den = torch.fft.ifft(torch.fft.fft(torch.ones(1, 2 * ext), n=2 * ext) * kernel, n=2 * ext).real
    return (num[0, length:2 * length] / den[0, length:2 * length].clamp_min(1e-8))


class Released:
    """The released d2Cache + vanilla low-confidence decoding (one token per step)."""

    def __init__(self, model, prompt_len: int, gen_len: int, *, rollout_p, current_k, sigma,
                 inflate_w, rule: str):
        self.m, self.P, self.G = model, prompt_len, gen_len
        self.rollout_p, self.current_k, self.sigma, self.inflate_w = rollout_p, current_k, sigma, inflate_w
        self.paper = rule == "paper"  # the paper's reading: the confidence update lands, the last
        # prompt row is added (Dream) and the block is whole; else the release as it runs
        self.keys: list = []
        self.values: list = []
        self.q_mask = None     # rows with queries at the next forward
        self.active = None     # rows with queries at the last forward
        self.conf_cache = None
        self.shifted = model.cfg.logit_shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Response logits [G, V] (zero rows where no query), like the release's model call."""
        m, cfg = self.m, self.m.cfg
        T = x.shape[0]
        self.active = self.q_mask
        rows = torch.arange(T) if self.active is None else torch.where(self.active)[0]
        cos, sin = m.rope(rows)
        h = m.embed(x[rows])[None]
        rollout = torch.eye(T)
        group = cfg.n_heads // cfg.n_kv_heads
        for i, blk in enumerate(m.blocks):
            normed = blk.attn_norm(h)
            q = m.apply_rope(blk.q_proj(normed).view(1, -1, cfg.n_heads, cfg.head_dim).transpose(1, 2), cos, sin)
            k = m.apply_rope(blk.k_proj(normed).view(1, -1, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2), cos, sin)
            v = blk.v_proj(normed).view(1, -1, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
            if len(self.keys) <= i:
                self.keys.append(k.clone())
                self.values.append(v.clone())
            else:
                self.keys[i][:, :, rows] = k
                self.values[i][:, :, rows] = v
            kf = self.keys[i].repeat_interleave(group, dim=1)
            vf = self.values[i].repeat_interleave(group, dim=1)
            att = torch.softmax((q @ kf.transpose(-1, -2)) / math.sqrt(cfg.head_dim), dim=-1)
            o = (att @ vf).transpose(1, 2).reshape(1, rows.numel(), -1)
            h = h + blk.attn_out(o)
            h = h + blk.ffn(h)
            effective = torch.eye(T)
            effective[rows] = att[0].mean(0)
            residual = effective + torch.eye(T)
            residual = residual / residual.sum(-1, keepdim=True)
            rollout = residual @ rollout
        self.rollout = rollout
        logits = torch.zeros(T, cfg.vocab_size)
        logits[rows] = m.logits(h)[0]
        if self.shifted:
            logits = torch.cat([logits[:1], logits[:-1]])
        return logits[self.P:]

    def step_end(self, frame: torch.Tensor, new: torch.Tensor, block: tuple[int, int],
                 confidence: torch.Tensor) -> None:
        P, G, T = self.P, self.G, self.P + self.G
        if self.conf_cache is None:
            self.conf_cache = confidence.clone()
        elif self.paper:  # the paper: recomputed (logit row had a query), masked before
            logit_rows = self.active[P - 1:T - 1] if self.shifted else self.active[P:]
            valid = logit_rows & (frame[P:] == MASK_ID)
            self.conf_cache[valid] = confidence[valid]
        remaining = new[P:] == MASK_ID
        block_mask = torch.zeros(G, dtype=torch.bool)
        block_mask[block[0]:block[1]] = True
        if not self.paper:  # the release's generation step narrows it in place to its masks
            block_mask &= frame[P:] == MASK_ID
        block_size = int(block_mask.sum())
        meets = torch.cumsum(remaining.int(), 0) >= self.current_k
        min_end = int(torch.argmax(meets.int())) if meets.any() else G - 1
        search_end = (min_end // block_size + 1) * block_size - 1
        col = torch.arange(G)
        search = (col >= int(block_mask.int().argmax())) & (col <= search_end)
        scores = self.conf_cache * fft_density(~remaining, self.sigma)
        scores[block_mask] += scores.max()
        idx = torch.topk(torch.where(search & remaining, scores, -torch.inf), min(self.current_k, G)).indices
        selected = torch.zeros(G, dtype=torch.bool)
        selected[idx] = True
        selected &= remaining
        response = F.pad(selected[1:], (0, 1), value=False) if self.shifted else selected.clone()
        response[(frame[P:] == MASK_ID) & (new[P:] != MASK_ID)] = True  # just decoded
        q = F.pad(response, (P, 0), value=False)
        importance = self.rollout.sum(0)
        # nucleus selection (min_k 1) of the rest by rollout importance
        s = torch.where(~q, importance, 0.0)
        probs = s / (s.sum() + 1e-9)
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) <= self.rollout_p
        keep[0] = True
        keep &= (~q)[si]
        q |= torch.zeros(T, dtype=torch.bool).scatter(0, si, keep)
        if self.shifted:  # an assignment in the release; the paper's reading adds the row
            if self.paper:
                q[P - 1] |= selected[0]
            else:
                q[P - 1] = selected[0]
        if self.inflate_w > 0:
            t = torch.arange(T)
            nxt = torch.flip(torch.cummin(torch.flip(torch.where(q, t, T), [0]), 0).values, [0])
            prv = torch.cummax(torch.where(q, t, -1), 0).values
            q |= ((nxt - t) + (t - prv) <= self.inflate_w) & (prv >= 0) & (nxt < T)
        self.q_mask = q


def released_decode(model, prompt, gen_len, block_length, guarantee=False, **params):
    """Low-confidence decoding, one token per step within blocks, over ``Released``;
    ``guarantee``: with dlmpipe's addition (docs/METHODS.md §2.7), the logit rows of the current
    block's masked positions get queries too."""
    P = prompt.shape[0]
    x = torch.cat([prompt, torch.full((gen_len,), MASK_ID)])
    cache = Released(model, P, gen_len, **params)
    trace = []
    for lo in range(0, gen_len, block_length):
        block = (lo, lo + block_length)
        for step in range(block_length + 1):  # one position a step: a block's masks in as many steps
            if not (x[P + lo:P + lo + block_length] == MASK_ID).any():
                break
            if step == block_length:  # an argmax MASK: the restatement would not end
                pytest.fail(f"the restated release left block {block} masked after {block_length} steps")
            if guarantee and cache.q_mask is not None:
                due = torch.zeros_like(cache.q_mask)
                due[P + lo:P + lo + block_length] = x[P + lo:P + lo + block_length] == MASK_ID
                cache.q_mask |= torch.roll(due, -1) if model.cfg.logit_shift else due
            q = cache.q_mask
            logits = cache.forward(x)
            probs = torch.softmax(logits, -1)
            conf, x0 = probs.max(-1)
            masked = x[P:] == MASK_ID
            confidence = torch.where(masked, conf, -torch.inf)
            in_block = torch.full_like(confidence, -torch.inf)
            in_block[lo:lo + block_length] = confidence[lo:lo + block_length]
            j = int(in_block.argmax())
            new = x.clone()
            new[P + j] = x0[j]
            trace.append((x.clone(), None if q is None else q.clone(), logits))
            cache.step_end(x, new, block, confidence)
            x = new
    return x[P:], trace


def dlmpipe_trace(model, prompt, gen_len, block_length, **params):
    sampler = build_sampler({"name": "llada_confidence", "block_length": block_length, "steps": gen_len})
    cache = build_cache({"name": "d2cache", **params}, model)
    trace = []
    select, serve = cache.select, cache.response_logits

    def recorded_select(*a):
        q = select(*a)
        trace[-1][1] = q.clone()
        return q

    def recorded(x, block):
        trace.append([x.clone(), None, None, block])
        trace[-1][2] = serve(x, block).clone()
        return trace[-1][2]

    cache.select, cache.response_logits = recorded_select, recorded
    out = decode(model, sampler, cache, prompt, gen_len, torch.Generator().manual_seed(0))
    return out.response, trace


CASES = {  # current_k a multiple of blocks: dlmpipe's guarantee (step 5) adds nothing
    "defaults-one-block": dict(block_length=16, rollout_p=0.1, current_k=32, sigma=10.0, inflate_w=0),
    "semi-ar-inflate": dict(block_length=8, rollout_p=0.1, current_k=8, sigma=10.0, inflate_w=4),
    "k-two-blocks": dict(block_length=4, rollout_p=0.3, current_k=8, sigma=3.0, inflate_w=2),
    # the window reaches past the block and a flat density lets confidence rank: the block bias
    # matters, and at block starts the guarantee adds rows (restated with it)
    "k-past-block": dict(block_length=4, rollout_p=0.1, current_k=6, sigma=40.0, inflate_w=0,
                         guarantee=True),
    # a density flat to 1e-4 lets the first forward's confidence rank past the block, so where
    # the window ends decides: rule released sizes it by the masks the block had (the release)
    "window-from-masks": dict(block_length=4, rollout_p=0.1, current_k=6, sigma=1000.0,
                              inflate_w=0, guarantee=True),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rule", ["paper", "released"])
@pytest.mark.parametrize("case", list(CASES))
@torch.inference_mode()
def test_step_parity_with_the_released_algorithm(family, rule, case):
    params = dict(CASES[case])
    block_length = params.pop("block_length")
    guarantee = params.pop("guarantee", False)
    for seed in (0, 1):
        model = tiny_backbone(family, seed=seed, n_layers=3)
        prompt = random_prompt(7 + 4 * seed, seed)
        gen_len = 16
        ref_out, ref = released_decode(model, prompt, gen_len, block_length, guarantee,
                                       rule=rule, **params)
        got_out, got = dlmpipe_trace(model, prompt, gen_len, block_length, rule=rule, **params)
        assert len(got) == len(ref) == gen_len
        partial = 0
        for t, ((x, q, logits, block), (rx, rq, rlogits)) in enumerate(zip(got, ref)):
            assert torch.equal(x, rx), (seed, t)
            assert (q is None) == (rq is None), t
            if q is not None:
                assert torch.equal(q, rq), (seed, t, q.int(), rq.int())
                partial += int(not q.all())
            served = torch.isfinite(logits).all(-1)
            # every masked row of the block has fresh logits, and they are the release's
            masked = (x[prompt.shape[0]:] == MASK_ID)[block[0]:block[1]]
            assert served[block[0]:block[1]][masked].all(), t
            assert torch.allclose(logits[served], rlogits[served], atol=1e-4, rtol=1e-4), (seed, t)
        assert torch.equal(got_out, ref_out)
        assert partial >= gen_len // 2  # the cached path really ran


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_the_cached_confidence_follows_the_rule(family):
    """paper: after each forward, every masked position whose logits were recomputed holds their
    top-1 probability (and so changes); released: the first forward's values stay."""
    model = tiny_backbone(family, seed=7, n_layers=3)
    prompt = random_prompt(9, 7)
    for rule in ("paper", "released"):
        sampler = build_sampler({"name": "llada_confidence", "block_length": 4, "steps": 16})
        cache = build_cache({"name": "d2cache", "current_k": 6, "rule": rule}, model)
        serve, seen = cache.response_logits, []

        def recorded(x, block):
            logits = serve(x, block)
            seen.append((x.clone(), logits.clone(), cache.conf.clone()))
            return logits

        cache.response_logits = recorded
        decode(model, sampler, cache, prompt, 16, torch.Generator().manual_seed(0))
        first = seen[0][2]
        changed = False
        for x, logits, conf in seen[1:]:
            fresh = torch.isfinite(logits).all(-1) & (x[9:] == MASK_ID)
            if rule == "released":
                assert torch.equal(conf, first)
            else:
                assert torch.allclose(conf[fresh], torch.softmax(logits[fresh], -1).amax(-1))
                changed |= not torch.equal(conf[fresh], first[fresh])
        assert changed or rule == "released"


# ---- the cached step on an unchanged sequence --------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_a_cached_step_on_an_unchanged_sequence_returns_the_full_forward_logits(family):
    model = tiny_backbone(family, seed=5, n_layers=3)
    prompt = random_prompt(11, 5)
    G = 16
    x = torch.cat([prompt, torch.full((G,), MASK_ID)])
    x[11 + 3] = 7  # some decoded tokens too
    x[11 + 9] = 12
    cache = build_cache({"name": "d2cache", "current_k": 3}, model)
    cache.begin(x, 11)
    full = full_response_logits(model, x, 11)
    first = cache.response_logits(x, (0, 8))
    assert torch.allclose(first, full, atol=1e-5)
    for _ in range(2):
        cached = cache.response_logits(x, (0, 8))
        served = torch.isfinite(cached).all(-1)
        assert 0 < served.sum() < G and cache.stats.cached_forwards > 0
        assert torch.allclose(cached[served], full[served], atol=1e-5)


# ---- rollout and attention maps ----------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_rollout_equals_the_product_of_full_attention_matrices(family):
    """After a full forward the cache's rollout importance equals the column sums of
    prod_l normalise(mean_h A_l + I), with A_l taken from explicit full attention matrices."""
    model = tiny_backbone(family, seed=6, n_layers=3)
    cfg = model.cfg
    prompt = random_prompt(10, 6)
    x = torch.cat([prompt, torch.full((8,), MASK_ID)])
    cache = build_cache({"name": "d2cache"}, model)
    cache.begin(x, 10)
    cache.response_logits(x, (0, 8))
    T = x.shape[0]
    cos, sin = model.rope(torch.arange(T))
    h = model.embed(x[None])
    product = torch.eye(T, dtype=torch.float64)
    for blk in model.blocks:
        normed = blk.attn_norm(h)
        q = model.apply_rope(blk.q_proj(normed).view(1, T, cfg.n_heads, -1).transpose(1, 2), cos, sin)
        k = model.apply_rope(blk.k_proj(normed).view(1, T, cfg.n_kv_heads, -1).transpose(1, 2), cos, sin)
        v = blk.v_proj(normed).view(1, T, cfg.n_kv_heads, -1).transpose(1, 2)
        k = k.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=1)
        v = v.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim), -1)
        assert torch.allclose(model.attention_probs(q, k[:, ::cfg.n_heads // cfg.n_kv_heads]),
                              a.mean(1), atol=1e-6)
        h = h + blk.attn_out((a @ v).transpose(1, 2).reshape(1, T, -1))
        h = h + blk.ffn(h)
        r = a[0].mean(0).double() + torch.eye(T, dtype=torch.float64)
        product = (r / r.sum(-1, keepdim=True)) @ product
    assert torch.allclose(cache.importance.double(), product.sum(0), atol=1e-5)


def test_the_certainty_density_equals_the_release_fft_form():
    g = torch.Generator().manual_seed(0)
    for length in (1, 5, 16, 40):
        w = density_weights(length, 4.0, "cpu")
        for _ in range(4):
            decoded = torch.rand(length, generator=g) < 0.4
            for last in (True, False):
                decoded[-1] = last
                assert torch.allclose(certainty_density(decoded, w), fft_density(decoded, 4.0), atol=1e-5)


def test_nucleus_and_inflation_edge_rules():
    scores = torch.tensor([0.5, 3.0, 1.0, 0.0, 4.0, 2.0])
    every = torch.ones(6, dtype=torch.bool)
    # mass 0.1 reaches no element: the best candidate alone (min_k 1), never a non-candidate
    assert nucleus(scores, 0.1, every).tolist() == [False, False, False, False, True, False]
    no_best = every.clone()
    no_best[4] = False
    assert nucleus(scores, 0.1, no_best).nonzero().flatten().tolist() == [1]
    # cumulative mass <= p: 4/10.5 + 3/10.5 = 0.667 <= 0.7 < 0.857
    assert nucleus(scores, 0.7, every).nonzero().flatten().tolist() == [1, 4]
    # p = 1: every candidate, zero scores included, nothing else
    assert torch.equal(nucleus(scores, 1.0, no_best), no_best)
    q = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0, 1, 0], dtype=torch.bool)
    # gaps: 1-2 (span 3 <= 3) filled; 4-7 (span 5) not; nothing before the first or after the last
    assert inflate(q, 3).int().tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 1, 0]
    assert inflate(q, 5).int().tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]
