"""The mixture-of-experts backbones (LLaDA-MoE, LLaDA2.0) and the routed expert layer.

Golden logits against an independent restatement of each release's modeling code
(modeling_lladamoe.py, modeling_llada2_moe.py: the files and commits docs/MODELS.md names),
written here from those files without dlmpipe: its RMSNorm, rotary tables, routing and expert
loops, on tiny checkpoints in the release formats (tests/checkpoints.py); the routed layer against
a naive every-expert sum and counted for doing only routed work; row invariance of the layer."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from dlmpipe.backbones import load_backbone
from dlmpipe.backbones.moe import naive_moe
from tests.checkpoints import make_tiny_checkpoint, moe_checkpoint
from tests.test_backbones import read_all

MOE = ["llada_moe", "llada2"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {fam: make_tiny_checkpoint(root / fam, fam) for fam in MOE}


# ---- the releases, restated ------------------------------------------------------------------
def rms(x, w, eps):  # LLaDAMoERMSNorm / LLaDA2MoeRMSNorm
    x32 = x.to(torch.float32)
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotary(cfg, head_dim, n):
    """transformers' default rope init: dim = int(head_dim * partial_rotary_factor)."""
    dim = int(head_dim * (cfg.get("partial_rotary_factor") or 1.0))
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = torch.arange(n).float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)


def apply_rotary(q, k, cos, sin):  # apply_rotary_pos_emb with a partial rotary_dim
    cos, sin = cos[None, None], sin[None, None]
    r = cos.shape[-1]
    rot = lambda x: torch.cat(((x[..., :r] * cos) + (rotate_half(x[..., :r]) * sin), x[..., r:]), dim=-1)
    return rot(q), rot(k)


def mlp(x, t, p):
    return F.linear(F.silu(F.linear(x, t[p + "gate_proj.weight"])) * F.linear(x, t[p + "up_proj.weight"]),
                    t[p + "down_proj.weight"])


def attention(q, k, v, mask):
    """eager: q k^T / sqrt(hd) + additive mask, float32 softmax, GQA by repeat_kv."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    w = q @ k.transpose(2, 3) / math.sqrt(q.shape[-1])
    if mask is not None:
        w = w + mask
    return F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def lladamoe_reference(path, ids):
    """modeling_lladamoe.py: LLaDAMoEModelLM, no attention mask (diffusion LM)."""
    cfg = json.loads((path / "config.json").read_text())
    t = read_all(path)
    b, n = ids.shape
    d, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = d // nh, cfg["rms_norm_eps"]
    cos, sin = rotary(cfg, hd, n)
    h = t["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, t[p + "input_layernorm.weight"], eps)
        q, k, v = (F.linear(x, t[p + f"self_attn.{s}_proj.weight"]) for s in "qkv")
        if cfg["qk_layernorm"]:
            q = rms(q.reshape(-1, hd), t[p + "self_attn.q_norm.weight"], eps).reshape(b, n, -1)
            k = rms(k.reshape(-1, hd), t[p + "self_attn.k_norm.weight"], eps).reshape(b, n, -1)
        q, k, v = (z.view(b, n, -1, hd).transpose(1, 2) for z in (q, k, v))
        q, k = apply_rotary(q, k, cos, sin)
        o = attention(q, k, v, None).transpose(1, 2).reshape(b, n, d)
        h = h + F.linear(o, t[p + "self_attn.o_proj.weight"])
        x = rms(h, t[p + "post_attention_layernorm.weight"], eps)
        if cfg["moe_layer_freq"][i] == 0:
            h = h + mlp(x, t, p + "mlp.")
            continue
        flat = x.view(-1, d)
        weights = F.softmax(F.linear(flat, t[p + "mlp.gate.weight"]), dim=1, dtype=torch.float)
        if cfg["moe_router_enable_expert_bias"]:
            weights += t[p + "mlp.expert_bias"]
        weights, chosen = torch.topk(weights, cfg["num_experts_per_tok"], dim=-1)
        weights = weights.to(flat.dtype)  # norm_topk_prob is False in the release
        out = torch.zeros_like(flat)
        onehot = F.one_hot(chosen, num_classes=cfg["num_experts"]).permute(2, 1, 0)
        for e in range(cfg["num_experts"]):
            slot, rows = torch.where(onehot[e])
            y = mlp(flat[rows], t, f"{p}mlp.experts.{e}.") * weights[rows, slot, None]
            out.index_add_(0, rows, y)
        y = out.view(b, n, d)
        if cfg["shared_expert_intermediate_size"] is not None:
            y = y + mlp(x, t, p + "shared_expert.")
        h = h + y
    return F.linear(rms(h, t["model.norm.weight"], eps), t["lm_head.weight"])


def llada2_generate_mask(n, block_length=32):
    """LLaDA2MoeModelLM.generate: tril over blocks, repeat_interleave(block_length), additive."""
    blocks = -(-n // block_length)
    allowed = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(block_length, 0) \
        .repeat_interleave(block_length, 1)[:n, :n].bool()
    return torch.where(allowed, 0.0, float("-inf"))[None, None]


def llada2_reference(path, ids, block_length=32):
    """modeling_llada2_moe.py: LLaDA2MoeModelLM with generate()'s block-diffusion mask."""
    cfg = json.loads((path / "config.json").read_text())
    t = read_all(path)
    b, n = ids.shape
    d, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = cfg["head_dim"] or d // nh, cfg["rms_norm_eps"]
    cos, sin = rotary(cfg, hd, n)
    mask = llada2_generate_mask(n, block_length)
    h = t["model.word_embeddings.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, t[p + "input_layernorm.weight"], eps)
        qkv = F.linear(x, t[p + "attention.query_key_value.weight"],
                       t.get(p + "attention.query_key_value.bias")).view(b, n, nh + 2 * nkv, hd)
        q, k, v = (z.transpose(1, 2) for z in qkv.split([nh, nkv, nkv], dim=-2))
        q, k = rms(q, t[p + "attention.query_layernorm.weight"], eps), rms(k, t[p + "attention.key_layernorm.weight"], eps)
        q, k = apply_rotary(q, k, cos, sin)
        o = attention(q, k, v, mask).transpose(1, 2).reshape(b, n, -1)
        h = h + F.linear(o, t[p + "attention.dense.weight"])
        x = rms(h, t[p + "post_attention_layernorm.weight"], eps)
        if i < cfg["first_k_dense_replace"]:
            h = h + mlp(x, t, p + "mlp.")
            continue
        flat = x.view(-1, d)
        logits = F.linear(flat.float(), t[p + "mlp.gate.weight"].float())
        scores = torch.sigmoid(logits)
        ranked = scores + t[p + "mlp.gate.expert_bias"]
        ng, e_all, k_top = cfg["n_group"], cfg["num_experts"], cfg["num_experts_per_tok"]
        gs = ranked.view(-1, ng, e_all // ng).topk(2, dim=-1)[0].sum(dim=-1)
        gi = torch.topk(gs, k=cfg["topk_group"], dim=-1, sorted=False)[1]
        gm = torch.zeros_like(gs).scatter_(1, gi, 1)
        sm = gm.unsqueeze(-1).expand(-1, ng, e_all // ng).reshape(flat.shape[0], -1)
        chosen = torch.topk(ranked.masked_fill(~sm.bool(), float("-inf")), k=k_top, dim=-1)[1]
        w = torch.gather(scores, 1, chosen)
        w = (w / (w.sum(dim=-1, keepdim=True) + 1e-20) if k_top > 1 else w) * cfg["routed_scaling_factor"]
        # moe_infer: tokens sorted by expert, one call per expert with tokens, weighted sum
        order = chosen.view(-1).argsort()
        sorted_rows = flat[order // k_top]
        counts = torch.bincount(chosen.view(-1), minlength=e_all).tolist()
        outs, start = [], 0
        for e, c in enumerate(counts):
            if c:
                outs.append(mlp(sorted_rows[start:start + c], t, f"{p}mlp.experts.{e}."))
            start += c
        cat = torch.cat(outs)
        new = torch.empty_like(cat)
        new[order] = cat
        y = (new.view(*chosen.shape, -1).float() * w.unsqueeze(-1)).sum(dim=1).to(flat.dtype).view(b, n, d)
        if cfg["num_shared_experts"]:
            y = y + mlp(x, t, p + "mlp.shared_experts.")
        h = h + y
    return F.linear(rms(h, t["model.norm.weight"], eps), t["lm_head.weight"]).float()


REFERENCES = {"llada_moe": lladamoe_reference, "llada2": llada2_reference}


# ---- golden logits --------------------------------------------------------------------------
@pytest.mark.parametrize("family", MOE)
def test_native_forward_equals_the_release(ckpts, family):
    """70 positions: LLaDA2.0's block-causal mask covers two whole blocks of 32 and a partial one."""
    loaded = load_backbone(ckpts[family], dtype="float32")
    ids = torch.randint(0, loaded.cfg.vocab_size, (2, 70), generator=torch.Generator().manual_seed(1))
    ids[0, 5] = loaded.mask_id
    with torch.no_grad():
        ref = REFERENCES[family](ckpts[family], ids)
        ours = loaded.forward(ids)
    assert ours.shape == ref.shape == (2, 70, loaded.cfg.vocab_size)
    assert ref.abs().max() > 1.0
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", MOE)
def test_the_golden_test_has_teeth(ckpts, family):
    """The comparison sees the routing and the mask: without the expert bias (LLaDA-MoE) or the
    grouped routing's scaling (LLaDA2.0) the reference differs; LLaDA2.0 is block-causal (a
    change in block 2 leaves blocks 0-1 as they were), LLaDA-MoE bidirectional."""
    loaded = load_backbone(ckpts[family])
    ids = torch.randint(0, loaded.cfg.vocab_size, (1, 70), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[0, 65] = loaded.mask_id
    with torch.no_grad():
        a, b = loaded(ids), loaded(changed)
        ra, rb = (REFERENCES[family](ckpts[family], x) for x in (ids, changed))
    if family == "llada2":
        # ours bit for bit (rowwise.py); the plain-kernel reference groups other rows with each
        # expert in the changed call, so its rows 0-63 round differently: within float rounding
        assert torch.equal(a[0, :64], b[0, :64]) and (ra[0, :64] - rb[0, :64]).abs().max() <= 1e-5
        assert (a[0, 64] - b[0, 64]).abs().max() > 1e-4
    else:
        assert (a[0, 0] - b[0, 0]).abs().max() > 1e-4 and (ra[0, 0] - rb[0, 0]).abs().max() > 1e-4
    moe = next(blk.moe for blk in loaded.model.blocks if hasattr(blk, "moe"))
    x = torch.randn(40, loaded.cfg.d_model, generator=torch.Generator().manual_seed(0))
    idx, w = moe.route(x)
    if family == "llada_moe":
        bias = moe.expert_bias.clone()
        moe.expert_bias.zero_()
        idx0, _ = moe.route(x)
        moe.expert_bias.copy_(bias)
        assert not torch.equal(idx, idx0)  # the random expert bias changes the routing
    else:
        assert torch.allclose(w.sum(-1), torch.full((40,), loaded.cfg.routed_scaling))


@pytest.mark.parametrize("family", MOE)
def test_sharded_loads_the_same_as_single_file(tmp_path, family):
    sharded = load_backbone(make_tiny_checkpoint(tmp_path / "s", family, sharded=True, n_shards=4))
    single = load_backbone(make_tiny_checkpoint(tmp_path / "u", family, sharded=False))
    assert len(list((tmp_path / "s").glob("model-*-of-00004.safetensors"))) == 4
    a, b = sharded.model.state_dict(), single.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.arange(1, 40)[None]
    with torch.no_grad():
        assert torch.equal(sharded(ids), single(ids))


def test_llada2_fused_qkv_is_split_into_q_k_v_rows(ckpts):
    loaded = load_backbone(ckpts["llada2"])
    fused = read_all(ckpts["llada2"])["model.layers.1.attention.query_key_value.weight"]
    blk, cfg = loaded.model.blocks[1], loaded.cfg
    nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    assert torch.equal(torch.cat([blk.q_proj.weight, blk.k_proj.weight, blk.v_proj.weight]), fused)
    assert blk.k_proj.weight.shape == (nkv, cfg.d_model) and blk.q_proj.weight.shape == (nq, cfg.d_model)
    assert cfg.rope_dim == cfg.head_dim // 2 and cfg.block_size == 32 and cfg.dense_layers == [0]
    assert not hasattr(loaded.model.blocks[0], "moe") and hasattr(loaded.model.blocks[1], "moe")
    # SPA-Cache's SVD job reads only the value projections: the fused tensor's last row block
    from dlmpipe.engine.proxies import read_value_weights
    assert torch.equal(read_value_weights(ckpts["llada2"])[1], fused[nq + nkv:])


def test_special_ids_and_chat_prompt(ckpts):
    """LLaDA-MoE's release says model_type "llada" (as LLaDA-8B's does): its MoE fields claim it."""
    assert json.loads((ckpts["llada_moe"] / "config.json").read_text())["model_type"] == "llada"
    assert load_backbone(ckpts["llada_moe"], with_tokenizer=False).cfg.family == "llada_moe"
    for family in MOE:
        loaded = load_backbone(ckpts[family])
        t = loaded.tokenizer
        assert loaded.mask_id == t.convert_tokens_to_ids("<|mask|>")
        assert set(loaded.stop_ids) == {t.convert_tokens_to_ids("<|endoftext|>"), t.convert_tokens_to_ids("<|role_end|>")}
        assert not loaded.logit_shift
        text = t.decode(loaded.chat_prompt("Hi"))
        assert text == "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>"
    from dlmpipe.backbones.families.llada_moe import ling_template
    from dlmpipe.backbones.chat import ChatPrompt
    assert ling_template(ChatPrompt(user="Hi")) == text


# ---- the routed layer -----------------------------------------------------------------------
@pytest.mark.parametrize("family", MOE)
def test_routed_layer_equals_every_expert_on_every_row(ckpts, family):
    loaded = load_backbone(ckpts[family])
    moe = next(blk.moe for blk in loaded.model.blocks if hasattr(blk, "moe"))
    x = torch.randn(3, 37, loaded.cfg.d_model, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (moe(x) - naive_moe(moe, x)).abs().max() <= 1e-5


@pytest.mark.parametrize("family", MOE)
def test_only_active_experts_are_called_on_their_rows(ckpts, family):
    """One call per expert that received rows, each on exactly its rows: the calls' row counts sum
    to rows x top-k (never every expert on every row); an expert no row chose is not called."""
    loaded = load_backbone(ckpts[family])
    moe = next(blk.moe for blk in loaded.model.blocks if hasattr(blk, "moe"))
    cfg = loaded.cfg
    x = torch.randn(5, cfg.d_model, generator=torch.Generator().manual_seed(5))
    idx, _ = moe.route(x)
    calls_to = {e: 0 for e in range(cfg.n_experts)}
    rows_to = {e: 0 for e in range(cfg.n_experts)}
    originals = [ex.forward for ex in moe.experts]

    def counting(e):
        def fwd(z):
            calls_to[e] += 1
            rows_to[e] += z.shape[0]
            return originals[e](z)
        return fwd

    for e, ex in enumerate(moe.experts):
        ex.forward = counting(e)
    try:
        with torch.no_grad():
            moe(x)
    finally:
        for ex in moe.experts:
            del ex.forward
    chosen = torch.bincount(idx.reshape(-1), minlength=cfg.n_experts).tolist()
    assert [rows_to[e] for e in range(cfg.n_experts)] == chosen
    assert all(calls_to[e] == (1 if chosen[e] else 0) for e in calls_to)
    assert sum(rows_to.values()) == 5 * cfg.experts_per_token and 0 in chosen  # 5 rows x 2 of 8 experts
    with torch.no_grad():  # no rows (a batch slot with nothing to recompute): no expert call
        assert moe(x[:0]).shape == (0, cfg.d_model) and moe.calls is None


@pytest.mark.parametrize("family", MOE)
def test_routed_layer_rows_do_not_depend_on_their_batch(ckpts, family):
    """A row's output is the same bits alone, among 3 rows, 44 or 2000 (experts then receive 1-3 or
    hundreds of rows: model.linear's row rules hold per expert call, index_add_ adds in index order
    at any size), at 1 and 2 threads."""
    loaded = load_backbone(ckpts[family])
    moe = next(blk.moe for blk in loaded.model.blocks if hasattr(blk, "moe"))
    x = torch.randn(2000, loaded.cfg.d_model, generator=torch.Generator().manual_seed(6))
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.no_grad():
                full = moe(x)
                for lo, hi in ((0, 1), (5, 8), (10, 11), (20, 64), (3, 1500)):
                    assert torch.equal(moe(x[lo:hi]), full[lo:hi]), (n, lo, hi)
    finally:
        torch.set_num_threads(threads)


def test_cuda_graphs_are_refused_on_an_moe_backbone():
    """A captured graph cannot hold the layer's host read and routing-dependent expert calls."""
    from dlmpipe.methods import build_method
    from tests.models import tiny_backbone

    model = tiny_backbone("llada_moe")
    method = {"sampler": {"name": "llada_confidence"}, "cache": {"name": "archer"}}
    with pytest.raises(ValueError, match="MoE backbone"):
        build_method(method, model, compile="cuda_graphs")
    build_method(method, model)  # eager is fine


# ---- the GPU's grouped experts, checked on the CPU (issue 48) --------------------------------
@pytest.mark.parametrize("family", MOE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grouped", [True, False])
def test_grouped_experts_equal_the_routed_loop(ckpts, family, dtype, grouped):
    """``grouped_experts`` (two ``torch._grouped_mm`` over the rows sorted by expert; with
    ``grouped=False`` its fallback, one SwiGLU per expert) against the CPU's per-expert loop, to
    rounding: the GPU's layer computes the same sum in another order. Stacking the experts'
    weights changes none of the CPU path's bits."""
    loaded = load_backbone(ckpts[family])
    moe = next(blk.moe for blk in loaded.model.blocks if hasattr(blk, "moe")).to(dtype)
    x = torch.randn(37, loaded.cfg.d_model, generator=torch.Generator().manual_seed(4)).to(dtype)
    with torch.no_grad():
        idx, w = moe.route(x)
        before = moe._cpu_experts(x, idx, w)
        got = moe.grouped_experts(x, idx, w, grouped=grouped)
        assert moe.experts[1].up.weight.data_ptr() == moe.stacked_experts()[0][1, moe.cfg.expert_hidden:].data_ptr()
        assert torch.equal(moe._cpu_experts(x, idx, w), before)  # the views hold the same values
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert got.dtype == torch.float32 and (got - before).abs().max() <= tol * before.abs().max()


@pytest.mark.parametrize("family", MOE)
def test_grouped_experts_read_nothing_back_and_launch_alike_for_any_routing(ckpts, monkeypatch, family):
    """No host read (the layer can sit inside a captured step) and the same launches for 3 rows
    as for 300, whatever experts they chose (tests/host_sync.py's counters); replayed by the CPU
    stand-in of a CUDA graph on new rows, the same outputs as eager."""
    from dlmpipe import graphs
    from dlmpipe.backbones import rowwise
    from tests.host_sync import Launches, counted, host_reads, replay_capture

    loaded = load_backbone(ckpts[family])
    moe = next(blk.moe for blk in loaded.model.blocks if hasattr(blk, "moe"))
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(n, loaded.cfg.d_model, generator=gen) for n in (3, 300)]

    def layer(x):
        return moe.grouped_experts(x, *moe.route(x), grouped=True)

    with torch.no_grad():
        layer(xs[0])  # (stacks the weights: once, not part of a step)
        launches = []
        for x in xs:  # (the GPU's plain ops: the CPU's chunked products launch by row count)
            with rowwise.plain_ops(), Launches() as count:
                layer(x)
            launches.append(count.count)
        assert launches[0] == launches[1]
        with host_reads(monkeypatch) as reads:
            counted(reads, layer)(xs[1])
        assert reads.count == 0, reads.where
        monkeypatch.setitem(graphs.CAPTURE, "cpu", replay_capture)
        step = graphs.StepRunner(layer, "cuda_graphs")
        first, second = xs[1][:40], xs[1][40:80]
        step(first)
        assert torch.equal(step(second), layer(second)) and step.captures == 1
