"""Native backbones against transformers' Llama / Qwen2 / Qwen3 run with each release's attention
mask (none for LLaDA and Dream; SDAR's and Fast-dLLM v2's block-causal masks, restated from their
releases), on tiny checkpoints in each family's exact on-disk format; special ids, prompts, dtypes,
sharding. Adding a family adds one row to ``REFERENCES``."""
from __future__ import annotations

import filecmp
import json
import sys

import pytest
import torch
from safetensors import safe_open

from tests.checkpoints import LLADA_CHAT_TEMPLATE, make_tiny_checkpoint
from dlmpipe.backbones import load_backbone
from dlmpipe.backbones.families.qwen import qwen3_template
from dlmpipe.backbones.prompts import (ChatPrompt, chat_text, humaneval_prompt, llada_template,
                                       mbpp_prompt, qwen_template)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {fam: make_tiny_checkpoint(root / fam, fam) for fam in GOLDEN}


def read_all(path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint dir, read with safetensors itself (independent of dlmpipe)."""
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            out |= {k: sf.get_tensor(k).clone() for k in sf.keys()}
    return out


def llama_reference(path):
    """transformers' LlamaModel + a separate lm_head, weights renamed from LLaDA's keys."""
    cfg = json.loads((path / "config.json").read_text())
    hf_cfg = transformers.LlamaConfig(
        hidden_size=cfg["d_model"], intermediate_size=cfg["mlp_hidden_size"],
        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
        num_key_value_heads=cfg["n_kv_heads"], vocab_size=cfg["embedding_size"],
        rope_theta=cfg["rope_theta"], rms_norm_eps=cfg["rms_norm_eps"],
        max_position_embeddings=cfg["max_sequence_length"], attention_bias=False, mlp_bias=False,
        tie_word_embeddings=False, attn_implementation="eager")
    model = transformers.LlamaModel(hf_cfg)
    head = torch.nn.Linear(cfg["d_model"], cfg["embedding_size"], bias=False)
    names = {"attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
             "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj",
             "ff_norm": "post_attention_layernorm", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "ff_out": "mlp.down_proj"}
    state, head_w = {}, None
    for k, v in read_all(path).items():
        k = k.removeprefix("model.transformer.")
        if k == "wte.weight":
            state["embed_tokens.weight"] = v
        elif k == "ln_f.weight":
            state["norm.weight"] = v
        elif k == "ff_out.weight":
            head_w = v
        else:
            _, i, name, p = k.split(".")
            state[f"layers.{i}.{names[name]}.{p}"] = v
    model.load_state_dict(state, strict=True)
    head.weight.data.copy_(head_w)
    return model.eval(), head


def qwen2_reference(path):
    """transformers' Qwen2Model + a separate lm_head, on Dream's (standard Qwen2) key names."""
    cfg = json.loads((path / "config.json").read_text())
    hf_cfg = transformers.Qwen2Config(
        hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], vocab_size=cfg["vocab_size"],
        rope_theta=cfg["rope_theta"], rms_norm_eps=cfg["rms_norm_eps"], use_sliding_window=False,
        tie_word_embeddings=False, attn_implementation="eager")
    model = transformers.Qwen2Model(hf_cfg)
    head = torch.nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
    tensors = read_all(path)
    head.weight.data.copy_(tensors.pop("lm_head.weight"))
    model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items()}, strict=True)
    return model.eval(), head


def qwen3_reference(path):
    """transformers' Qwen3Model (per-head q_norm/k_norm, explicit head_dim) + a separate lm_head, on
    SDAR's (standard Qwen3) key names: SDAR's decoder layer is Qwen3's (its modeling_sdar.py)."""
    cfg = json.loads((path / "config.json").read_text())
    hf_cfg = transformers.Qwen3Config(
        hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        vocab_size=cfg["vocab_size"], rope_theta=cfg["rope_theta"], rms_norm_eps=cfg["rms_norm_eps"],
        attention_bias=False, use_sliding_window=False, tie_word_embeddings=False,
        attn_implementation="eager")
    model = transformers.Qwen3Model(hf_cfg)
    head = torch.nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
    tensors = read_all(path)
    head.weight.data.copy_(tensors.pop("lm_head.weight"))
    model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items()}, strict=True)
    return model.eval(), head


def no_mask(path, n: int) -> torch.Tensor:
    """LLaDA and Dream: every position sees every position."""
    return torch.ones(n, n, dtype=torch.bool)


def sdar_generate_mask(path, n: int) -> torch.Tensor:
    """SDAR's generate.py (block_diffusion_generate): a lower-triangular block matrix, each entry
    repeated over ``block_length`` rows and columns, rows and columns from position 0 (its default
    block_length is the checkpoint's block_size)."""
    bl = json.loads((path / "config.json").read_text())["block_size"]
    blocks = -(-n // bl)
    return torch.tril(torch.ones(blocks, blocks)).repeat_interleave(bl, 0).repeat_interleave(bl, 1)[:n, :n].bool()


def fast_dllm_v2_eval_mask(path, n: int) -> torch.Tensor:
    """Fast-dLLM v2's modeling.py (Fast_dLLM_QwenModel.eval_mask, no cache): query block
    ``q // bd_size`` >= key block ``kv // bd_size``."""
    bs = json.loads((path / "config.json").read_text())["bd_size"]
    q, kv = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return q // bs >= kv // bs


def reference_logits(model, head, ids: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The release's attention as an explicit additive 4D mask (``allowed``: bool ``[N, N]``, True
    = attends; all True by default) replacing the causal one (transformers returns a prepared 4D
    mask as is; eager attention just adds it)."""
    b, n = ids.shape
    allowed = torch.ones(n, n, dtype=torch.bool) if allowed is None else allowed
    mask = torch.zeros(b, 1, n, n, dtype=torch.float32).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return head(h)


#: the golden-logits table: family -> (reference model, the release's attention mask)
REFERENCES = {"llada": (llama_reference, no_mask), "dream": (qwen2_reference, no_mask),
              "diffucoder": (qwen2_reference, no_mask), "sdar": (qwen3_reference, sdar_generate_mask),
              "fast_dllm_v2": (qwen2_reference, fast_dllm_v2_eval_mask)}
GOLDEN = list(REFERENCES)
BLOCK_CAUSAL = ["sdar", "fast_dllm_v2"]


@pytest.mark.parametrize("family", GOLDEN)
def test_native_forward_equals_transformers_non_causal(ckpts, family):
    """The golden logits: the native forward equals the reference run with the release's mask
    (bidirectional for LLaDA/Dream, block-causal for SDAR/Fast-dLLM v2), 23 positions, so the
    block families see several blocks and a partial last one."""
    build, release_mask = REFERENCES[family]
    model, head = build(ckpts[family])
    loaded = load_backbone(ckpts[family], dtype="float32")
    ids = torch.randint(0, loaded.cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(1))
    ids[0, 5] = loaded.mask_id
    ref = reference_logits(model, head, ids, release_mask(ckpts[family], 23))
    with torch.no_grad():
        ours = loaded.forward(ids)
    assert ours.shape == (2, 23, loaded.cfg.vocab_size) and ours.dtype == torch.float32
    assert ref.abs().max() > 1.0  # the comparison is not between two near-zero tensors
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_reference_and_native_are_bidirectional(ckpts, family):
    """Changing the last token must move the first position's logits (no causal mask anywhere)."""
    model, head = REFERENCES[family][0](ckpts[family])
    loaded = load_backbone(ckpts[family])
    ids = torch.arange(3, 19)[None]
    changed = ids.clone()
    changed[0, -1] = loaded.mask_id
    assert (reference_logits(model, head, ids)[0, 0] - reference_logits(model, head, changed)[0, 0]).abs().max() > 1e-3
    with torch.no_grad():
        assert (loaded(ids)[0, 0] - loaded(changed)[0, 0]).abs().max() > 1e-3
    # and with the default (causal) mask transformers would not see the change: the test has teeth
    with torch.no_grad():
        causal = [head(model(input_ids=x).last_hidden_state)[0, 0] for x in (ids, changed)]
    assert torch.equal(causal[0], causal[1])


@pytest.mark.parametrize("family", BLOCK_CAUSAL)
def test_block_causal_rows_see_their_block_and_earlier_ones(ckpts, family):
    """A token changed in block j moves every row of block j (bidirectional inside a block) and no
    row of an earlier block (causal across blocks), in the reference and natively; without the
    release's mask the reference would move the first rows: the golden test has teeth."""
    build, release_mask = REFERENCES[family]
    model, head = build(ckpts[family])
    loaded = load_backbone(ckpts[family])
    n, bs = 23, loaded.cfg.block_size
    j = 2 * bs + 1  # second row of the third block
    ids = torch.arange(3, 3 + n)[None]
    changed = ids.clone()
    changed[0, j] = loaded.mask_id
    allowed = release_mask(ckpts[family], n)
    with torch.no_grad():
        for a, b in ((reference_logits(model, head, ids, allowed), reference_logits(model, head, changed, allowed)),
                     (loaded(ids), loaded(changed))):
            assert torch.equal(a[0, :2 * bs], b[0, :2 * bs])
            assert all((a[0, r] - b[0, r]).abs().max() > 1e-4 for r in range(2 * bs, min(3 * bs, n)))
        full = reference_logits(model, head, ids), reference_logits(model, head, changed)
    assert (full[0][0, 0] - full[1][0, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("family", BLOCK_CAUSAL)
def test_block_by_block_with_finished_blocks_kv_equals_the_full_forward(ckpts, family):
    """The releases prefill the prompt's whole blocks and then decode block after block over the
    finished blocks' cached K/V: composed from the primitives (``attention_mask`` at explicit
    positions), each block computed once over the K/V of the blocks before it gives the full
    forward's logits."""
    loaded = load_backbone(ckpts[family])
    m = loaded.model
    n, bs = 23, m.cfg.block_size
    ids = torch.randint(0, m.cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(3))
    keys, values, rows = [[] for _ in m.blocks], [[] for _ in m.blocks], []
    with torch.no_grad():
        for start in range(0, n, bs):
            pos = torch.arange(start, min(start + bs, n))
            h, rope = m.embed(ids[:, pos]), m.rope(pos)
            mask = m.attention_mask(pos, torch.arange(0, pos[-1] + 1))
            for i in range(m.cfg.n_layers):
                q, k, v = m.qkv(i, h, rope)
                keys[i].append(k)
                values[i].append(v)
                o = m.attend(q, torch.cat(keys[i], 2), torch.cat(values[i], 2), mask)
                h = h + m.attn_output(i, o)
                h = h + m.ffn(i, h)
            rows.append(m.logits(h))
        assert (torch.cat(rows, 1) - loaded(ids)).abs().max() <= 1e-5


def test_bidirectional_families_have_no_attention_mask(ckpts):
    for family in ("llada", "dream"):
        m = load_backbone(ckpts[family]).model
        assert m.cfg.block_size is None and m.attention_mask(torch.arange(4), torch.arange(4)) is None


def test_families_are_registered_once_with_their_attention_pattern(ckpts):
    from dlmpipe.backbones.families import FAMILIES, FAMILY_OF_MODEL_TYPE

    assert set(FAMILIES) == {"llada", "dream", "sdar", "fast_dllm_v2", "llada_moe", "llada2"}
    assert FAMILY_OF_MODEL_TYPE["sdar"] == "sdar" and FAMILY_OF_MODEL_TYPE["fast_dllm_qwen"] == "fast_dllm_v2"
    assert FAMILY_OF_MODEL_TYPE["llada2_moe"] == "llada2" and FAMILY_OF_MODEL_TYPE["lladamoe"] == "llada_moe"
    for family, path in ckpts.items():
        cfg = load_backbone(path, with_tokenizer=False).cfg
        assert (cfg.block_size is not None) == (FAMILIES[cfg.family].attention == "block_causal"), family


def test_block_families_special_ids_and_shift(ckpts):
    """SDAR: mask ``<|MASK|>`` (config.json's mask_token_id), stops <|endoftext|> and <|im_end|>
    (generation_config.json), unshifted logits. Fast-dLLM v2: no mask_token_id in config.json, so
    ``|<MASK>|`` by name from the tokenizer; pad config.json's <|im_end|>; shifted logits."""
    sdar, fdllm = load_backbone(ckpts["sdar"]), load_backbone(ckpts["fast_dllm_v2"])
    t = sdar.tokenizer
    assert sdar.mask_id == t.convert_tokens_to_ids("<|MASK|>") == json.loads(
        (ckpts["sdar"] / "config.json").read_text())["mask_token_id"]
    assert set(sdar.stop_ids) == {t.convert_tokens_to_ids("<|endoftext|>"), t.convert_tokens_to_ids("<|im_end|>")}
    assert sdar.pad_id == t.convert_tokens_to_ids("<|endoftext|>") and not sdar.logit_shift
    assert sdar.cfg.head_dim == 2 * sdar.cfg.d_model // sdar.cfg.n_heads and sdar.cfg.qk_norm
    t = fdllm.tokenizer
    assert "mask_token_id" not in json.loads((ckpts["fast_dllm_v2"] / "config.json").read_text())
    assert fdllm.mask_id == t.convert_tokens_to_ids("|<MASK>|")
    assert t("|<MASK>||<MASK>|", add_special_tokens=False)["input_ids"] == [fdllm.mask_id] * 2
    assert set(fdllm.stop_ids) == {t.convert_tokens_to_ids("<|endoftext|>"), t.convert_tokens_to_ids("<|im_end|>")}
    assert fdllm.pad_id == t.convert_tokens_to_ids("<|im_end|>") and fdllm.logit_shift


@pytest.mark.parametrize("family", BLOCK_CAUSAL)
def test_tied_head_loads_from_a_checkpoint_without_lm_head(tmp_path, family):
    """Qwen2.5-1.5B (Fast-dLLM v2 1.5B's base) ties its head to the embedding: no lm_head.weight
    on disk, the head is the embedding matrix."""
    from tests.checkpoints import block_checkpoint

    path = block_checkpoint(tmp_path / "t", family, tied=True)
    assert "lm_head.weight" not in read_all(path)
    loaded = load_backbone(path)
    assert loaded.model.head.weight.data_ptr() == loaded.model.embed.weight.data_ptr()
    tensors = read_all(path)
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():
        h = loaded.model.final_norm(loaded.model.hidden_states(ids))
        assert torch.allclose(loaded(ids), h @ tensors["model.embed_tokens.weight"].T, atol=1e-5)


@pytest.mark.parametrize("family", ["llada", "dream", *BLOCK_CAUSAL])
def test_sharded_loads_the_same_as_single_file(tmp_path, family):
    sharded = load_backbone(make_tiny_checkpoint(tmp_path / "s", family, sharded=True, n_shards=4))
    single = load_backbone(make_tiny_checkpoint(tmp_path / "u", family, sharded=False))
    assert len(list((tmp_path / "s").glob("model-*-of-00004.safetensors"))) == 4
    assert not (tmp_path / "u" / "model.safetensors.index.json").exists()
    a, b = sharded.model.state_dict(), single.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.arange(1, 12)[None]
    with torch.no_grad():
        assert torch.equal(sharded(ids), single(ids))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_bf16_load_from_fp32_and_bf16_files(tmp_path, family):
    f32 = load_backbone(make_tiny_checkpoint(tmp_path / "f32", family), dtype="float32")
    for path in (tmp_path / "f32", make_tiny_checkpoint(tmp_path / "bf16", family, dtype="bfloat16")):
        bf = load_backbone(path, dtype=torch.bfloat16)
        assert {p.dtype for p in bf.model.parameters()} == {torch.bfloat16}
        assert all(p.device.type == "cpu" and not p.requires_grad for p in bf.model.parameters())
        ids = torch.arange(2, 20)[None]
        with torch.no_grad():
            out, ref = bf(ids), f32(ids)
        assert out.dtype == torch.float32  # logits are always returned in float32
        assert (out - ref).abs().max() < 0.1 * ref.abs().max()
    fp16 = load_backbone(tmp_path / "f32", dtype="float16")
    assert {p.dtype for p in fp16.model.parameters()} == {torch.float16}


def test_loaded_weights_are_private_copies(tmp_path):
    """Weights must not share the file's pages: rewriting the checkpoint leaves them alone."""
    path = make_tiny_checkpoint(tmp_path / "c", "llada", sharded=False)
    loaded = load_backbone(path)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    make_tiny_checkpoint(path, "llada", sharded=False, seed=1)
    assert all(torch.equal(before[k], v) for k, v in loaded.model.state_dict().items())


def test_special_ids_come_from_the_checkpoint(ckpts):
    llada, dream, coder = (load_backbone(ckpts[f]) for f in ("llada", "dream", "diffucoder"))
    t = llada.tokenizer
    assert llada.mask_id == t.convert_tokens_to_ids("<|mdm_mask|>") == json.loads(
        (ckpts["llada"] / "config.json").read_text())["mask_token_id"]
    assert set(llada.stop_ids) == {t.convert_tokens_to_ids("<|endoftext|>"), t.convert_tokens_to_ids("<|eot_id|>")}
    assert llada.pad_id == t.convert_tokens_to_ids("<|endoftext|>") and not llada.logit_shift
    t = dream.tokenizer
    assert dream.mask_id == t.convert_tokens_to_ids("<|mask|>") == t.mask_token_id
    assert set(dream.stop_ids) == {t.convert_tokens_to_ids("<|endoftext|>"), t.convert_tokens_to_ids("<|im_end|>")}
    assert dream.pad_id == t.convert_tokens_to_ids("<|endoftext|>") and dream.logit_shift
    t = coder.tokenizer
    assert coder.pad_id == t.convert_tokens_to_ids("<|dlm_pad|>") in coder.stop_ids
    assert coder.cfg.n_kv_heads < coder.cfg.n_heads  # GQA, like the real 28/4


def test_ids_follow_the_checkpoint_not_constants(tmp_path):
    """A checkpoint whose config moves the mask id is obeyed (no hard-coded ids anywhere)."""
    path = make_tiny_checkpoint(tmp_path / "c", "dream")
    cfg = json.loads((path / "config.json").read_text())
    cfg["mask_token_id"], cfg["eos_token_id"] = 7, [cfg["eos_token_id"], 9]
    (path / "config.json").write_text(json.dumps(cfg))
    loaded = load_backbone(path)
    assert loaded.mask_id == 7 and 9 in loaded.stop_ids


def test_dream_shift_reads_row_j_minus_1(ckpts):
    loaded = load_backbone(ckpts["dream"])
    raw = torch.randn(1, 5, 3)
    shifted = loaded.model.shift(raw)
    assert torch.equal(shifted[:, 1:], raw[:, :-1]) and torch.equal(shifted[:, 0], raw[:, 0])
    assert torch.equal(load_backbone(ckpts["llada"]).model.shift(raw), raw)


def test_no_remote_code_is_executed(tmp_path):
    """Real Dream/LLaDA dirs carry remote-code files named by auto_map; they must never run."""
    for fam in ("llada", "dream", *BLOCK_CAUSAL):
        path = make_tiny_checkpoint(tmp_path / fam, fam)
        for name in ("tokenization_dream.py", "modeling_dream.py", "configuration_dream.py",
                     "modeling_llada.py", "configuration_llada.py", "modeling_sdar.py",
                     "configuration_sdar.py", "tokenization_qwen2.py", "tokenization_qwen2_fast.py",
                     "modeling.py", "configuration.py"):
            (path / name).write_text("raise SystemExit('remote code executed')\n")
        loaded = load_backbone(path)
        assert loaded.chat_prompt("hi")
    assert not [m for m in sys.modules if "transformers_modules" in m or "tokenization_dream" in m]


def test_dream_tokenizer_is_qwen2_bpe_with_added_tokens(ckpts, tmp_path):
    loaded = load_backbone(ckpts["diffucoder"], with_tokenizer=True)
    t = loaded.tokenizer
    assert type(t).__name__.startswith("Qwen2Tokenizer")
    text = "def f(x):\n    return x + 1  # héllo"
    ids = t(text, add_special_tokens=False)["input_ids"]
    assert t.decode(ids) == text
    assert t("<|mask|><|mask|>", add_special_tokens=False)["input_ids"] == [loaded.mask_id] * 2
    # the same tokenizer when the added tokens come from added_tokens.json instead
    path = make_tiny_checkpoint(tmp_path / "c", "diffucoder")
    tc = json.loads((path / "tokenizer_config.json").read_text())
    decoder = tc.pop("added_tokens_decoder")
    (path / "added_tokens.json").write_text(json.dumps({v["content"]: int(k) for k, v in decoder.items()}))
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    other = load_backbone(path).tokenizer
    probe = "<|im_start|>user\nhi<|im_end|><|mask|><|dlm_pad|>"
    assert other(probe, add_special_tokens=False)["input_ids"] == t(probe, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family,template", [("llada", llada_template), ("dream", qwen_template),
                                             ("sdar", qwen3_template), ("fast_dllm_v2", qwen_template)])
def test_chat_template_matches_the_models_md_strings(ckpts, family, template):
    loaded = load_backbone(ckpts[family])
    for p in (ChatPrompt("  Write add(a, b).\n"), ChatPrompt("Hi", system="Be terse."),
              ChatPrompt("Q", response_prefix="```python\n")):
        assert chat_text(loaded.tokenizer, family, p) == template(p) + p.response_prefix
    assert loaded.tokenizer.chat_template  # the template really came from the checkpoint
    text = loaded.tokenizer.decode(loaded.chat_prompt("hello"))
    if family == "llada":
        assert text == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    elif family == "sdar":  # Qwen3: no default system turn
        assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    else:
        assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")


def test_fallback_template_without_chat_template(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "c", "dream")
    tc = json.loads((path / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    loaded = load_backbone(path)
    assert not loaded.tokenizer.chat_template
    assert loaded.tokenizer.decode(loaded.chat_prompt("hello")).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    assert LLADA_CHAT_TEMPLATE  # the tiny LLaDA checkpoint ships the real template


def test_code_task_prompts_open_a_code_block(ckpts):
    he = humaneval_prompt('def add(a, b):\n    """Add."""\n')
    assert he.user.startswith("Write a solution to the following problem and make sure that it passes the tests:\n```python\n")
    assert he.response_prefix == 'Here is the completed function:\n```python\ndef add(a, b):\n    """Add."""\n\n'
    mb = mbpp_prompt(" Write a function to add. ", ["assert add(1, 2) == 3", "assert add(0, 0) == 0"])
    assert mb.user.endswith(">>> Problem:\nWrite a function to add.\n>>> Test Cases:\n"
                            "assert add(1, 2) == 3\nassert add(0, 0) == 0\n")
    assert mb.response_prefix == ">>> Code:\n```python\n"
    loaded = load_backbone(ckpts["dream"])
    text = loaded.tokenizer.decode(loaded.chat_prompt(mb))
    assert text.endswith("<|im_start|>assistant\n>>> Code:\n```python\n")


def test_tiny_checkpoints_are_deterministic(tmp_path):
    for fam in ("llada", "dream", *BLOCK_CAUSAL):
        a = make_tiny_checkpoint(tmp_path / f"{fam}a", fam)
        b = make_tiny_checkpoint(tmp_path / f"{fam}b", fam)
        names = sorted(p.name for p in a.iterdir())
        assert names == sorted(p.name for p in b.iterdir())
        assert all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)
