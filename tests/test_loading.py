"""Bad checkpoints: one CheckpointError naming the problem and the file, before any weight is read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dlmpipe.backbones import CheckpointError, load_backbone
from dlmpipe.backbones import loading
from dlmpipe.backbones.loading import check_checkpoint
from dlmpipe.backbones.weights import read_safetensors_header
from tests.checkpoints import make_tiny_checkpoint


def edit_json(file: Path, **changes) -> None:
    raw = json.loads(file.read_text())
    for k, v in changes.items():
        if v is ...:
            raw.pop(k, None)
        else:
            raw[k] = v
    file.write_text(json.dumps(raw))


def shard_of(path: Path, key: str) -> Path:
    return path / json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][key]


def rewrite_shard(path: Path, key: str, fn) -> Path:
    """Apply ``fn`` to the tensors of ``key``'s shard (dict -> dict) and keep the index in sync."""
    shard = shard_of(path, key)
    tensors = fn(load_file(str(shard)))
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: f for k, f in index["weight_map"].items() if f != shard.name or k in tensors}
    index["weight_map"] |= {k: shard.name for k in tensors}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return shard


LLADA_Q = "model.transformer.blocks.1.q_proj.weight"
DREAM_KB = "model.layers.0.self_attn.k_proj.bias"


def missing_shard(p):
    f = shard_of(p, LLADA_Q)
    f.unlink()
    return f.name, "missing"


def missing_key(p):
    f = rewrite_shard(p, LLADA_Q, lambda t: {k: v for k, v in t.items() if k != LLADA_Q})
    return LLADA_Q, "missing key"


def missing_bias_dream(p):
    rewrite_shard(p, DREAM_KB, lambda t: {k: v for k, v in t.items() if k != DREAM_KB})
    return DREAM_KB, "missing key"


def unexpected_key(p):
    f = rewrite_shard(p, LLADA_Q, lambda t: t | {"model.transformer.blocks.1.q_proj.bias": torch.zeros(64)})
    return f.name, "unexpected key"


def shape_mismatch(p):
    f = rewrite_shard(p, LLADA_Q, lambda t: t | {LLADA_Q: torch.zeros(32, 64)})
    return f.name, "shape mismatch"


def shape_mismatch_config(p):
    edit_json(p / "config.json", mlp_hidden_size=128)
    return "config.json implies", "shape mismatch"


def key_not_in_shard(p):
    index = json.loads((p / "model.safetensors.index.json").read_text())
    other = next(f for f in sorted(set(index["weight_map"].values())) if f != index["weight_map"][LLADA_Q])
    index["weight_map"][LLADA_Q] = other
    (p / "model.safetensors.index.json").write_text(json.dumps(index))
    return other, "not in this shard"


def truncated_shard(p):
    f = shard_of(p, LLADA_Q)
    data = f.read_bytes()
    f.write_bytes(data[:len(data) - 100])
    return f.name, "truncated"


def garbage_shard(p):
    f = shard_of(p, LLADA_Q)
    f.write_bytes(b"\x00" * 4)
    return f.name, "not a safetensors file"


def malformed_index(p):
    (p / "model.safetensors.index.json").write_text("{not json")
    return "model.safetensors.index.json", "not valid JSON"


def index_without_weight_map(p):
    (p / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    return "model.safetensors.index.json", "weight_map"


def no_weights(p):
    (p / "model.safetensors.index.json").unlink()
    return str(p), "no weights"


def unknown_model_type(p):
    edit_json(p / "config.json", model_type="mistral")
    return "config.json", "unknown model_type 'mistral'"


def missing_model_type(p):
    edit_json(p / "config.json", model_type=...)
    return "config.json", "unknown model_type None"


def malformed_config(p):
    (p / "config.json").write_text('{"model_type": "llada", ')
    return "config.json", "not valid JSON"


def config_not_object(p):
    (p / "config.json").write_text("[1, 2]")
    return "config.json", "JSON object"


def config_missing_field(p):
    edit_json(p / "config.json", n_layers=...)
    return "config.json", "missing field 'n_layers'"


def config_wrong_type(p):
    edit_json(p / "config.json", d_model="64")
    return "config.json", "'d_model' must be a positive integer"


def config_unsupported(p):
    edit_json(p / "config.json", weight_tying=True)
    return "config.json", "weight_tying=True is not supported"


def missing_config(p):
    (p / "config.json").unlink()
    return "config.json", "config.json missing"


def mask_outside_vocab(p):
    edit_json(p / "config.json", mask_token_id=10_000)
    return "config.json", "outside the vocabulary"


def tokenizer_missing_llada(p):
    (p / "tokenizer.json").unlink()
    return str(p), "tokenizer missing"


def tokenizer_missing_dream(p):
    (p / "merges.txt").unlink()
    return str(p), "tokenizer missing"


def tokenizer_corrupt(p):
    (p / "tokenizer.json").write_text("{")
    return "tokenizer.json", "cannot load tokenizer"


def added_token_id_moved(p):
    tc = json.loads((p / "tokenizer_config.json").read_text())
    dec = tc["added_tokens_decoder"]
    mask = next(i for i, e in dec.items() if e["content"] == "<|mask|>")
    dec[str(int(mask) + 50)] = dec.pop(mask)
    (p / "tokenizer_config.json").write_text(json.dumps(tc))
    return str(p), "'<|mask|>' is declared with id"


SDAR_QN = "model.layers.1.self_attn.q_norm.weight"


def sdar_missing_q_norm(p):
    rewrite_shard(p, SDAR_QN, lambda t: {k: v for k, v in t.items() if k != SDAR_QN})
    return SDAR_QN, "missing key"


def sdar_head_dim_mismatch(p):
    edit_json(p / "config.json", head_dim=16)  # the weights were written with 32
    return "config.json implies", "shape mismatch"


def sdar_attention_bias(p):
    edit_json(p / "config.json", attention_bias=True)
    return "config.json", "attention_bias=True is not supported"


def sdar_bad_block_size(p):
    edit_json(p / "config.json", block_size=0)
    return "config.json", "'block_size' must be a positive integer"


def sdar_tokenizer_missing(p):
    for name in ("tokenizer.json", "merges.txt"):
        (p / name).unlink()
    return str(p), "tokenizer missing"


def fast_dllm_sliding_layers(p):
    edit_json(p / "config.json", layer_types=["sliding_attention", "full_attention"])
    return "config.json", "layer_types=['sliding_attention', 'full_attention'] is not supported"


def fast_dllm_bad_bd_size(p):
    edit_json(p / "config.json", bd_size="32")
    return "config.json", "'bd_size' must be a positive integer"


def fast_dllm_no_mask_token(p):
    tc = json.loads((p / "tokenizer_config.json").read_text())
    dec = tc["added_tokens_decoder"]
    mask = next(i for i, e in dec.items() if e["content"] == "|<MASK>|")
    dec[mask]["content"] = "<|unused|>"
    tc["additional_special_tokens"] = []
    (p / "tokenizer_config.json").write_text(json.dumps(tc))
    edit_json(p / "special_tokens_map.json", additional_special_tokens=[])
    edit_json(p / "added_tokens.json", **{"|<MASK>|": ...})
    return "config.json", "no mask token id"


def fast_dllm_tied_but_lm_head_present(p):
    edit_json(p / "config.json", tie_word_embeddings=True)
    return "lm_head.weight", "unexpected key"


def fast_dllm_bias_missing(p):
    key = "model.layers.0.self_attn.q_proj.bias"
    rewrite_shard(p, key, lambda t: {k: v for k, v in t.items() if k != key})
    return key, "missing key"


MOE_EXPERT = "model.layers.1.mlp.experts.3.up_proj.weight"  # in both MoE families' layer 1


def moe_missing_expert(p):
    rewrite_shard(p, MOE_EXPERT, lambda t: {k: v for k, v in t.items() if k != MOE_EXPERT})
    return MOE_EXPERT, "missing key"


def lladamoe_layer_freq_short(p):
    edit_json(p / "config.json", moe_layer_freq=[1])
    return "config.json", "'moe_layer_freq' must list 0 (dense) or 1 (MoE) for each of the 2 layers"


def lladamoe_bias_disabled_but_stored(p):
    edit_json(p / "config.json", moe_router_enable_expert_bias=False)
    return "model.layers.0.mlp.expert_bias", "unexpected key"


def lladamoe_top_k_too_large(p):
    edit_json(p / "config.json", num_experts_per_tok=9)
    return "config.json", "num_experts_per_tok=9 exceeds num_experts=8"


def lladamoe_expert_width(p):
    edit_json(p / "config.json", expert_intermediate_size=48)
    return "config.json implies", "shape mismatch"


def lladamoe_clip_qkv(p):
    edit_json(p / "config.json", clip_qkv=8)
    return "config.json", "clip_qkv=8 is not supported"


def llada2_fused_qkv_width(p):
    edit_json(p / "config.json", num_key_value_heads=4)  # written with 2: q/k/v rows no longer add up
    return "query_key_value.weight", "shape mismatch"


def llada2_missing_expert_bias(p):
    key = "model.layers.1.mlp.gate.expert_bias"
    rewrite_shard(p, key, lambda t: {k: v for k, v in t.items() if k != key})
    return key, "missing key"


def llada2_bad_groups(p):
    edit_json(p / "config.json", n_group=3)
    return "config.json", "grouped routing n_group=3, topk_group=2 does not fit"


def llada2_softmax_router(p):
    edit_json(p / "config.json", score_function="softmax")
    return "config.json", "score_function='softmax' is not supported"


def llada2_no_dense_layer(p):
    edit_json(p / "config.json", first_k_dense_replace=0)  # layer 0's router and experts missing
    return "model.layers.0.mlp.gate.weight", "missing key"


def llada2_odd_partial_rotary(p):
    edit_json(p / "config.json", partial_rotary_factor=0.1)
    return "config.json", "partial_rotary_factor 0.1 gives 1 RoPE channels"


CASES = {
    "missing_shard": ("llada", missing_shard), "missing_key": ("llada", missing_key),
    "missing_bias_dream": ("dream", missing_bias_dream), "unexpected_key": ("llada", unexpected_key),
    "shape_mismatch": ("llada", shape_mismatch), "shape_mismatch_config": ("llada", shape_mismatch_config),
    "key_not_in_shard": ("llada", key_not_in_shard), "truncated_shard": ("llada", truncated_shard),
    "garbage_shard": ("llada", garbage_shard), "malformed_index": ("llada", malformed_index),
    "index_without_weight_map": ("llada", index_without_weight_map), "no_weights": ("llada", no_weights),
    "unknown_model_type": ("llada", unknown_model_type), "missing_model_type": ("dream", missing_model_type),
    "malformed_config": ("llada", malformed_config), "config_not_object": ("dream", config_not_object),
    "config_missing_field": ("llada", config_missing_field), "config_wrong_type": ("llada", config_wrong_type),
    "config_unsupported": ("llada", config_unsupported), "missing_config": ("dream", missing_config),
    "mask_outside_vocab": ("llada", mask_outside_vocab),
    "tokenizer_missing_llada": ("llada", tokenizer_missing_llada),
    "tokenizer_missing_dream": ("dream", tokenizer_missing_dream),
    "tokenizer_corrupt": ("llada", tokenizer_corrupt), "added_token_id_moved": ("dream", added_token_id_moved),
    "sdar_missing_q_norm": ("sdar", sdar_missing_q_norm), "sdar_head_dim_mismatch": ("sdar", sdar_head_dim_mismatch),
    "sdar_attention_bias": ("sdar", sdar_attention_bias), "sdar_bad_block_size": ("sdar", sdar_bad_block_size),
    "sdar_tokenizer_missing": ("sdar", sdar_tokenizer_missing),
    "fast_dllm_sliding_layers": ("fast_dllm_v2", fast_dllm_sliding_layers),
    "fast_dllm_bad_bd_size": ("fast_dllm_v2", fast_dllm_bad_bd_size),
    "fast_dllm_no_mask_token": ("fast_dllm_v2", fast_dllm_no_mask_token),
    "fast_dllm_tied_but_lm_head_present": ("fast_dllm_v2", fast_dllm_tied_but_lm_head_present),
    "fast_dllm_bias_missing": ("fast_dllm_v2", fast_dllm_bias_missing),
    "lladamoe_missing_expert": ("llada_moe", moe_missing_expert),
    "lladamoe_layer_freq_short": ("llada_moe", lladamoe_layer_freq_short),
    "lladamoe_bias_disabled_but_stored": ("llada_moe", lladamoe_bias_disabled_but_stored),
    "lladamoe_top_k_too_large": ("llada_moe", lladamoe_top_k_too_large),
    "lladamoe_expert_width": ("llada_moe", lladamoe_expert_width),
    "lladamoe_clip_qkv": ("llada_moe", lladamoe_clip_qkv),
    "llada2_missing_expert": ("llada2", moe_missing_expert),
    "llada2_fused_qkv_width": ("llada2", llada2_fused_qkv_width),
    "llada2_missing_expert_bias": ("llada2", llada2_missing_expert_bias),
    "llada2_bad_groups": ("llada2", llada2_bad_groups),
    "llada2_softmax_router": ("llada2", llada2_softmax_router),
    "llada2_no_dense_layer": ("llada2", llada2_no_dense_layer),
    "llada2_odd_partial_rotary": ("llada2", llada2_odd_partial_rotary),
}


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Fail loudly if any tensor data is read: every check must happen before materializing."""
    def trap(*_a, **_k):
        raise AssertionError("weights were read before the checkpoint was validated")
    monkeypatch.setattr(loading, "read_tensors", trap)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_gives_one_clear_error(tmp_path, case, no_weight_reads):
    family, damage = CASES[case]
    path = make_tiny_checkpoint(tmp_path / "c", family)
    file, problem = damage(path)
    for check in (lambda: load_backbone(path), lambda: check_checkpoint(path)):
        with pytest.raises(CheckpointError) as err:
            check()
        msg = str(err.value)
        assert problem in msg, msg
        assert file in msg, msg


def test_truncated_single_file_is_caught_by_the_header_check(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "c", "dream", sharded=False)
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="model.safetensors.*truncated"):
        read_safetensors_header(f)


def test_missing_directory_and_bad_dtype(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_backbone(tmp_path / "nowhere")
    path = make_tiny_checkpoint(tmp_path / "c", "llada")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_backbone(path, dtype="int8")


def test_quantized_tensor_is_refused(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "c", "llada")
    f = rewrite_shard(path, LLADA_Q, lambda t: t | {LLADA_Q: torch.zeros(64, 64, dtype=torch.int8)})
    with pytest.raises(CheckpointError, match=f"{f.name}.*dtype I8"):
        load_backbone(path)


def test_model_type_is_case_insensitive_and_rotary_buffers_are_skipped(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "c", "dream")
    assert json.loads((path / "config.json").read_text())["model_type"] == "Dream"
    edit_json(path / "config.json", model_type="dream")
    rewrite_shard(path, DREAM_KB, lambda t: t | {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    assert load_backbone(path).family == "dream"


def test_errors_are_value_errors_for_the_cli(tmp_path):
    """The CLI turns CheckpointError (a ValueError) into one line on stderr and exit code 2."""
    from dlmpipe.cli import main

    path = make_tiny_checkpoint(tmp_path / "c", "llada")
    edit_json(path / "config.json", model_type="gpt2")
    rc = main(["prepare-backbone", "--path", str(path), "--name", "x", "--out", str(tmp_path / "m.json")])
    assert rc == 2 and not (tmp_path / "m.json").exists()


def test_sdar_mask_is_named_differently_in_its_two_token_files(tmp_path):
    """SDAR's release declares id 151669 as ``<|MASK|>`` in tokenizer_config.json and ``<MASK>`` in
    added_tokens.json; like transformers, tokenizer_config.json's ``added_tokens_decoder`` wins
    and the legacy file is not read, so the checkpoint loads with ``<|MASK|>`` as its mask."""
    path = make_tiny_checkpoint(tmp_path / "c", "sdar")
    legacy = json.loads((path / "added_tokens.json").read_text())
    loaded = load_backbone(path)
    assert legacy["<MASK>"] == loaded.mask_id == loaded.tokenizer.convert_tokens_to_ids("<|MASK|>")
    assert "<|MASK|>" not in legacy
