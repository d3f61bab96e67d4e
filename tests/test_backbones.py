"""Native backbones against transformers' Llama / Qwen2 run without a causal mask, on tiny
checkpoints in each family's exact on-disk format; special ids, prompts, dtypes, sharding."""
from __future__ import annotations

import filecmp
import json
import sys

import pytest
import torch
from safetensors import safe_open

from tests.checkpoints import LLADA_CHAT_TEMPLATE, make_tiny_checkpoint
from dlmpipe.backbones import load_backbone
from dlmpipe.backbones.prompts import (ChatPrompt, chat_text, humaneval_prompt, llada_template,
                                       mbpp_prompt, qwen_template)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {fam: make_tiny_checkpoint(root / fam, fam) for fam in ("llada", "dream", "diffucoder")}


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


def reference_logits(model, head, ids: torch.Tensor) -> torch.Tensor:
    """Bidirectional reference: an explicit all-zeros additive 4D mask replaces the causal one
    (transformers returns a prepared 4D mask as is; eager attention just adds it)."""
    b, n = ids.shape
    mask = torch.zeros(b, 1, n, n, dtype=torch.float32)
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return head(h)


REFERENCES = {"llada": llama_reference, "dream": qwen2_reference, "diffucoder": qwen2_reference}


@pytest.mark.parametrize("family", ["llada", "dream", "diffucoder"])
def test_native_forward_equals_transformers_non_causal(ckpts, family):
    model, head = REFERENCES[family](ckpts[family])
    loaded = load_backbone(ckpts[family], dtype="float32")
    ids = torch.randint(0, loaded.cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(1))
    ids[0, 5] = loaded.mask_id
    ref = reference_logits(model, head, ids)
    with torch.no_grad():
        ours = loaded.forward(ids)
    assert ours.shape == (2, 23, loaded.cfg.vocab_size) and ours.dtype == torch.float32
    assert ref.abs().max() > 1.0  # the comparison is not between two near-zero tensors
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_reference_and_native_are_bidirectional(ckpts, family):
    """Changing the last token must move the first position's logits (no causal mask anywhere)."""
    model, head = REFERENCES[family](ckpts[family])
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


@pytest.mark.parametrize("family", ["llada", "dream"])
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
    for fam in ("llada", "dream"):
        path = make_tiny_checkpoint(tmp_path / fam, fam)
        for name in ("tokenization_dream.py", "modeling_dream.py", "configuration_dream.py",
                     "modeling_llada.py", "configuration_llada.py"):
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


@pytest.mark.parametrize("family,template", [("llada", llada_template), ("dream", qwen_template)])
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
    for fam in ("llada", "dream"):
        a = make_tiny_checkpoint(tmp_path / f"{fam}a", fam)
        b = make_tiny_checkpoint(tmp_path / f"{fam}b", fam)
        names = sorted(p.name for p in a.iterdir())
        assert names == sorted(p.name for p in b.iterdir())
        assert all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)
