"""Train the toy backbone: a small LLaDA-shaped model, masked-diffusion objective, on the CPU.

The result is saved in LLaDA's exact on-disk format (config.json with LLaDA's fields, sharded
safetensors with LLaDA's key names, a character-level tokenizer loadable with AutoTokenizer),
so it goes through the very loader real LLaDA checkpoints use. Deterministic given the options
(seed, thread count, ...) and the CPU kernels torch picks: another torch version or CPU
capability (AVX2 / AVX512) rounds sums differently and trains other weights, which is why the
default campaign decodes a shipped toy (dlmpipe/backbones/shipped.py). ``training.json`` beside
the weights records every option, that environment and the weights' sha256.

``stale_kv`` and ``stale_rows`` (the shipped toy: 0.5 and 0.3, with 3000 steps) train the toy
on the states the caches serve it. ``stale_kv``: the share of training sequences in which some
rows are seen through K/V from an earlier, more masked state of the sequence (``_stale_view``:
the prompt's rows as of the all-masked response, or random rows at a random earlier step).
``stale_rows``: the share in which, besides stale prompt K/V, the response rows whose token has
not changed since an earlier state keep, at every layer after the first, that state's K/V and
attention + FFN output on top of their current input (``_reused_rows``), as SPA-Cache and
dLLM-Cache serve the rows they do not recompute between response refreshes. Without them,
which circuit a toy learns depends on its seed, and the caches' verdicts with it: some seeds
route the counting chain through the prompt's rows or read every neighbour's newest state, and
every method that reuses a row's state (Archer without refresh, SPA-Cache, dLLM-Cache,
Fast-dLLM's dual cache, dKV-Cache) fell to 10-60% where other seeds kept it above 95% (600 and
1500 steps, seeds 0-2); with ``stale_kv`` alone SPA-Cache and dLLM-Cache still fell to 52.5-70%
on seeds 3-4, and with both at 1500 steps the seeds that had not converged (final loss 0.011 and
0.023 where the others reached 0.002-0.003) lost there instead. Trained with both for 3000 steps,
config.yaml gives what each default method does on toys of seeds 0-4.

``block_size`` > 0 trains a block-diffusion toy instead (the shipped ``toy_block``): SDAR's layout
(per-head q/k norms) and on-disk format (config.json with SDAR's fields, Qwen3's key names, a
character-level tokenizer with SDAR's special tokens, mask ``<|MASK|>``), loaded by the ``sdar``
family, with SDAR's block-diffusion objective (``_block_forward``): each sequence is laid out from
position 0 (blocks count from there, as at inference), every block of the response is noised with
its own mask ratio, and the noised copy's block ``b`` attends to itself and to the clean copy's
blocks before ``b`` (the exact prefix a block-causal decode has), the clean copy block-causally
to itself: one forward trains every block as the active block over its finished prefix.
"""
from __future__ import annotations

import hashlib
import math
import os
import platform
import tempfile
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from ..environment import cpu_model
from ..io import atomic_write, atomic_write_json
from ..tasks.toy import GENERATORS
from .model import Backbone, BackboneConfig
from .pins import weight_sha256
from .rowwise import plain_ops
from .weights import checkpoint_key_map

SPECIAL_TOKENS = ["<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>",
                  "<|start_header_id|>", "<|end_header_id|>"]
#: the block toy's (SDAR's names: docs/MODELS.md)
SDAR_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]


def build_tokenizer(out_dir: Path):
    """Character-level fast tokenizer with LLaDA's special tokens, saved in HF format."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    vocab["<unk>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
        pad_token="<|endoftext|>", mask_token="<|mdm_mask|>", unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[3:])
    tok.save_pretrained(str(out_dir))
    return tok


def build_sdar_tokenizer(out_dir: Path):
    """Character-level fast tokenizer with SDAR's special tokens (mask ``<|MASK|>``, stops
    ``<|endoftext|>`` and ``<|im_end|>``), saved in HF format (tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SDAR_SPECIAL_TOKENS + CHARS)}
    vocab["<unk>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        mask_token="<|MASK|>", unk_token="<unk>", additional_special_tokens=SDAR_SPECIAL_TOKENS[1:3])
    tok.save_pretrained(str(out_dir))
    return tok


def sdar_config_json(cfg: BackboneConfig, tok) -> dict:
    """config.json with the fields of SDAR-4B-Chat's, at the block toy's sizes."""
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    return {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "attention_bias": False, "attention_dropout": 0.0, "block_size": cfg.block_size,
        "bos_token_id": eos, "eos_token_id": eos,
        "mask_token_id": tok.convert_tokens_to_ids("<|MASK|>"), "head_dim": cfg.head_dim,
        "hidden_act": "silu", "hidden_size": cfg.d_model, "initializer_range": 0.02,
        "intermediate_size": cfg.mlp_hidden, "max_position_embeddings": 4096,
        "max_window_layers": cfg.n_layers, "model_type": "sdar",
        "num_attention_heads": cfg.n_heads, "num_hidden_layers": cfg.n_layers,
        "num_key_value_heads": cfg.n_kv_heads, "rms_norm_eps": cfg.norm_eps, "rope_scaling": None,
        "rope_theta": cfg.rope_theta, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "float32", "use_cache": False, "use_sliding_window": False,
        "vocab_size": cfg.vocab_size,
    }


def llada_config_json(cfg: BackboneConfig, tok) -> dict:
    """config.json with the fields of LLaDA-8B-Instruct's, at the toy's sizes."""
    return {
        "architectures": ["LLaDAModelLM"],
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "attention_dropout": 0.0,
        "attention_layer_norm": False,
        "block_type": "llama",
        "d_model": cfg.d_model,
        "embedding_dropout": 0.0,
        "embedding_size": cfg.vocab_size,
        "eos_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        "pad_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        "bos_token_id": tok.convert_tokens_to_ids("<|startoftext|>"),
        "mask_token_id": tok.convert_tokens_to_ids("<|mdm_mask|>"),
        "include_bias": False,
        "include_qkv_bias": False,
        "init_device": "meta",
        "layer_norm_type": "rms",
        "max_sequence_length": 4096,
        "mlp_hidden_size": cfg.mlp_hidden,
        "mlp_ratio": cfg.mlp_hidden // cfg.d_model,
        "multi_query_attention": None,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "n_layers": cfg.n_layers,
        "rms_norm_eps": cfg.norm_eps,
        "rope": True,
        "rope_theta": cfg.rope_theta,
        "scale_logits": False,
        "vocab_size": cfg.vocab_size,
        "weight_tying": False,
        "torch_dtype": "float32",
    }


def save_llada_checkpoint(model: Backbone, tok, out_dir: Path, n_shards: int = 2) -> None:
    """Write config.json, ``model-0000i-of-0000n.safetensors`` shards and the index (the family's
    key names; SDAR's config.json and generation_config.json for a block toy)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    native_to_ckpt = {v: k for k, v in checkpoint_key_map(model.cfg).items()}
    tensors = {native_to_ckpt[n]: p.detach().contiguous().clone()
               for n, p in model.state_dict().items()}
    keys = sorted(tensors)
    per = math.ceil(len(keys) / n_shards)
    weight_map, total = {}, 0
    for s in range(n_shards):
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        chunk = {k: tensors[k] for k in keys[s * per:(s + 1) * per]}
        atomic_write(out_dir / name, lambda tmp: save_file(chunk, str(tmp), metadata={"format": "pt"}))
        weight_map.update({k: name for k in chunk})
        total += sum(t.numel() * t.element_size() for t in chunk.values())
    atomic_write_json(out_dir / "model.safetensors.index.json",
                      {"metadata": {"total_size": total}, "weight_map": weight_map})
    if model.cfg.family == "sdar":
        atomic_write_json(out_dir / "config.json", sdar_config_json(model.cfg, tok))
        eos, im_end = (tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>"))
        atomic_write_json(out_dir / "generation_config.json",
                          {"bos_token_id": eos, "eos_token_id": [im_end, eos], "pad_token_id": eos})
    else:
        atomic_write_json(out_dir / "config.json", llada_config_json(model.cfg, tok))


def _batch(rng: random.Random, tok, tasks: list[str], batch: int, gen_len: int, pad_id: int):
    """Left-padded prompts + answers padded with EOS to ``gen_len`` (LLaDA SFT layout)."""
    prompts, answers = [], []
    for _ in range(batch):
        ex = GENERATORS[rng.choice(tasks)](rng)
        p = tok(ex["prompt"], add_special_tokens=False)["input_ids"]
        a = tok(ex["answer"], add_special_tokens=False)["input_ids"][:gen_len]
        prompts.append(p)
        answers.append(a + [pad_id] * (gen_len - len(a)))
    plen = max(map(len, prompts))
    ids = torch.full((batch, plen + gen_len), pad_id, dtype=torch.long)
    key_mask = torch.zeros((batch, plen + gen_len), dtype=torch.bool)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        ids[i, plen - len(p):plen] = torch.tensor(p)
        ids[i, plen:] = torch.tensor(a)
        key_mask[i, plen - len(p):] = True
    return ids, key_mask, plen


def _block_batch(rng: random.Random, tok, tasks: list[str], batch: int, gen_len: int, pad_id: int):
    """Prompts + answers padded with EOS to ``gen_len``, each sequence from position 0 (blocks
    count from there, as at inference), right-padded to the longest; the key mask and the
    response positions."""
    rows = []
    for _ in range(batch):
        ex = GENERATORS[rng.choice(tasks)](rng)
        p = tok(ex["prompt"], add_special_tokens=False)["input_ids"]
        a = tok(ex["answer"], add_special_tokens=False)["input_ids"][:gen_len]
        rows.append((p, a + [pad_id] * (gen_len - len(a))))
    t = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((batch, t), pad_id, dtype=torch.long)
    key_mask = torch.zeros((batch, t), dtype=torch.bool)
    response = torch.zeros((batch, t), dtype=torch.bool)
    for i, (p, a) in enumerate(rows):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a)
        key_mask[i, :len(p) + len(a)] = True
        response[i, len(p):len(p) + len(a)] = True
    return ids, key_mask, response


def _block_forward(model: Backbone, noisy: torch.Tensor, clean: torch.Tensor,
                   key_mask: torch.Tensor) -> torch.Tensor:
    """SDAR's training forward: ``[noisy || clean]`` at the same positions; a noisy row of block
    ``b`` attends to the noisy rows of block ``b`` and the clean rows of blocks before ``b``, a
    clean row to the clean rows of blocks up to its own (``model.attention_mask``). Returns the
    noisy rows' logits."""
    t = noisy.shape[1]
    pos = torch.arange(t)
    rope = model.rope(torch.cat([pos, pos]))
    blk = pos // model.cfg.block_size
    same = blk[:, None] == blk[None, :]
    prefix = model.attention_mask(pos, pos)  # the key's block not after the query's
    mask = torch.cat([torch.cat([same, prefix & ~same], 1),
                      torch.cat([torch.zeros_like(same), prefix], 1)], 0)
    attn_mask = mask[None, None] & torch.cat([key_mask, key_mask], 1)[:, None, None, :]
    h = model.embed(torch.cat([noisy, clean], 1))
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        b, hh, tt, hd = o.shape
        mid = h + model.attn_output(i, o.transpose(1, 2).reshape(b, tt, hh * hd))
        h = mid + model.ffn(i, mid)
    return model.logits(h[:, :t])


def _masked_forward(model: Backbone, ids: torch.Tensor, key_mask: torch.Tensor,
                    stale: tuple | None = None) -> torch.Tensor:
    """Training forward that ignores left padding (RoPE is relative, so this equals inference
    on the unpadded prompt). ``stale`` = (earlier ids, stale rows ``[B, T]``, per-layer reused
    rows ``[L, B, T]`` or None): the stale rows attend normally but are seen by every row through
    the K/V they had at the earlier, more masked ids, as a cache that has not refreshed them yet
    serves them (``stale_kv``); a reused row of layer l also keeps that layer's earlier output
    (attention + FFN) on top of its current input, as selective caches serve the rows they do
    not recompute (``stale_rows``)."""
    rope = model.rope(torch.arange(ids.shape[1]))
    attn_mask = key_mask[:, None, None, :]
    served = None
    if stale is not None:
        with torch.no_grad():
            _, earlier_kv, earlier_delta = _layers(model, stale[0], rope, attn_mask)
        served = (stale[1][:, None, :, None], earlier_kv, stale[2], earlier_delta)
    h, _, _ = _layers(model, ids, rope, attn_mask, served)
    return model.logits(h)


def _layers(model: Backbone, ids: torch.Tensor, rope, attn_mask: torch.Tensor, served=None):
    """Final hidden rows, every layer's K/V and, unless ``served``, its output (attention + FFN);
    ``served`` = (rows mask, per-layer K/V, per-layer reused rows or None, per-layer outputs):
    those rows' K/V are replaced by the given ones before attention, the reused rows' outputs by
    the given ones."""
    h = model.embed(ids)
    kvs, deltas = [], []
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        reused = None
        if served is not None:
            rows, (old_k, old_v) = served[0], served[1][i]
            if served[2] is not None:
                reused = served[2][i]
                rows = rows | reused[:, None, :, None]
            k, v = torch.where(rows, old_k, k), torch.where(rows, old_v, v)
        kvs.append((k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        b, hh, t, hd = o.shape
        a = model.attn_output(i, o.transpose(1, 2).reshape(b, t, hh * hd))
        mid = h + a
        out = mid + model.ffn(i, mid)
        if served is None:
            deltas.append(out - h)  # what a later pass reuses (the served pass needs none)
        elif reused is not None:
            out = torch.where(reused[:, :, None], h + served[3][i], out)
        h = out
    return h, kvs, deltas


def _stale_view(ids: torch.Tensor, noisy: torch.Tensor, key_mask: torch.Tensor, plen: int,
                mask_id: int, share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """An earlier decoding state of ``noisy`` and the rows whose K/V come from it, in a ``share``
    of the sequences (none in the others). Half of those see the prompt's rows as a cache filled
    before any token was decoded serves them (the response all masked: Archer without refresh,
    SPA-Cache, dLLM-Cache between prompt refreshes); the other half see random rows (each with a
    per-sequence probability) as they were at a random earlier step (each response token shown
    masked again with a per-sequence probability: dKV-Cache, Fast-dLLM's stale blocks)."""
    b, t = ids.shape
    prompt_case = torch.rand(b, 1) < 0.5
    again = torch.where(prompt_case, torch.ones(b, 1), torch.rand(b, 1))
    remask = (again > torch.rand(b, t)) & (noisy != mask_id) & key_mask
    remask[:, :plen] = False
    earlier = torch.where(remask, torch.full_like(ids, mask_id), noisy)
    in_prompt = (torch.arange(t) < plen)[None, :].expand(b, t)
    rows = torch.where(prompt_case, in_prompt, torch.rand(b, t) < torch.rand(b, 1))
    rows &= (torch.rand(b, 1) < share) & key_mask
    return earlier, rows


def _reused_rows(ids: torch.Tensor, noisy: torch.Tensor, key_mask: torch.Tensor, plen: int,
                 mask_id: int, share: float, n_layers: int, view: tuple[torch.Tensor, torch.Tensor]):
    """``view`` (from ``_stale_view``) with, in a ``share`` of the sequences, a selective cache's
    state between response refreshes: the earlier state shows each decoded response token
    masked again with a per-sequence probability (up to 0.4), the prompt's rows are stale, and at
    every layer >= 1 each response row whose token did not change since is reused (its K/V and
    output from the earlier state) with a per-sequence probability in [0.5, 1] (SPA-Cache,
    dLLM-Cache: a quarter or less of the rows recomputed per layer, the changed ones first)."""
    earlier, rows = view
    b, t = ids.shape
    case = (torch.rand(b, 1) < share)
    again = 0.4 * torch.rand(b, 1)
    remask = (again > torch.rand(b, t)) & (noisy != mask_id) & key_mask
    remask[:, :plen] = False
    earlier = torch.where(case, torch.where(remask, torch.full_like(ids, mask_id), noisy), earlier)
    in_prompt = (torch.arange(t) < plen)[None, :].expand(b, t)
    rows = torch.where(case, in_prompt & key_mask, rows)
    keep = 0.5 + 0.5 * torch.rand(b, 1)
    reused = (torch.rand(n_layers, b, t) < keep) & ~in_prompt & ~remask & case & key_mask
    reused[0] = False
    return earlier, rows, reused


def _block_loss(model: Backbone, ids: torch.Tensor, key_mask: torch.Tensor, response: torch.Tensor,
                mask_id: int) -> torch.Tensor:
    """The block-diffusion loss: every block's response positions masked with the block's own
    ratio t (in [0.05, 1]), cross-entropy / t over the masked ones, per response token."""
    b, t = ids.shape
    blocks = -(-t // model.cfg.block_size)
    ratio = 0.05 + 0.95 * torch.rand(b, blocks)
    ratio = ratio.repeat_interleave(model.cfg.block_size, dim=1)[:, :t]
    masked = (torch.rand(ids.shape) < ratio) & response
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    logits = _block_forward(model, noisy, ids, key_mask)
    ce = F.cross_entropy(logits[masked], ids[masked], reduction="none")
    return (ce / ratio[masked]).sum() / response.sum()


def _masked_loss(model, rng, tok, tasks, batch_size, gen_length, eos, mask_id, pretrain_fraction,
                 stale_kv, stale_rows, n_layers) -> torch.Tensor:
    """One batch's loss for the full-attention toy: LLaDA's masked-diffusion objective."""
    ids, key_mask, plen = _batch(rng, tok, list(tasks), batch_size, gen_length, eos)
    t = 0.05 + 0.95 * torch.rand(batch_size, 1)  # mask ratio; bounded away from 0 so 1/t stays tame
    # SFT-style rows mask only the response; pretraining-style rows mask the whole text,
    # which supervises every position and teaches the copy/lookup circuits much sooner
    masked = (torch.rand(ids.shape) < t) & key_mask
    sft = torch.rand(batch_size, 1) >= pretrain_fraction
    masked[:, :plen] &= ~sft
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    stale = None
    if stale_kv or stale_rows:
        stale = (*_stale_view(ids, noisy, key_mask, plen, mask_id, stale_kv), None)
    if stale_rows:
        stale = _reused_rows(ids, noisy, key_mask, plen, mask_id, stale_rows, n_layers, stale[:2])
    logits = _masked_forward(model, noisy, key_mask, stale)
    ce = F.cross_entropy(logits[masked], ids[masked], reduction="none")
    return (ce / t.expand_as(ids)[masked]).sum() / key_mask.sum()


def _step(model: Backbone, opt, sched, loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


def training_environment(threads: int) -> dict:
    """What decides a trained toy's exact bits besides its options: the kernels torch picks."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": cpu_model(), "machine": platform.machine(), "threads": threads,
            "python": platform.python_version()}


#: the training steps after which train_toy hashes the weights (``prefix`` in training.json): a
#: cheap retraining check (tests/test_shipped_toy.py) that train_toy still trains the same bits
PREFIX_STEPS = 100


def parameter_sha256(model: torch.nn.Module) -> str:
    """sha256 of a model's parameters and buffers: each name, then its float bytes, by name."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def prefix_environment(threads: int) -> dict:
    """What decides the prefix hash's bits: training_environment less the Python version, plus
    MKL's and ATen's kernel choices where set (``MKL_CBWR``, ``ATEN_CPU_CAPABILITY``)."""
    env = {k: v for k, v in training_environment(threads).items() if k != "python"}
    return {**env, "MKL_CBWR": os.environ.get("MKL_CBWR"),
            "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY")}


def parameter_fingerprint(model: torch.nn.Module) -> list[list[float]]:
    """Each parameter's mean and root mean square (float64, by name): what the prefix check
    compares within a tolerance where the kernels differ from the record's (another machine's
    rounding moves the weights by far less than one training step does)."""
    out = []
    for _, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().double()
        out.append([t.mean().item(), t.pow(2).mean().sqrt().item()])
    return out


def fingerprint_distance(a: list, b: list) -> float:
    """The largest difference between two fingerprints' entries, relative to the entry's scale."""
    return max(abs(x - y) / (abs(y) + 1e-3) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def train_prefix(options: dict, steps: int = PREFIX_STEPS) -> dict:
    """Train only the first ``steps`` steps of what ``options`` (a training.json's) train and
    return ``{"steps", "sha256", "environment"}``: the weights' parameter_sha256 at that point
    (the learning-rate schedule is the full training's) and what decides those bits."""
    with tempfile.TemporaryDirectory(prefix="dlmpipe-toy-prefix-") as tmp:
        return train_toy(tmp, **options, prefix_steps=steps, prefix_only=True,
                         log=lambda *_: None)["prefix"]


def train_toy(out_dir: str | Path, seed: int = 0, steps: int = 600, batch_size: int = 32,
              d_model: int = 128, n_layers: int = 4, n_heads: int = 4, mlp_hidden: int = 384,
              gen_length: int = 16, lr: float = 3e-3, threads: int = 2, pretrain_fraction: float = 0.0,
              stale_kv: float = 0.0, stale_rows: float = 0.0,
              block_size: int = 0, tasks: tuple[str, ...] = ("toy_code", "toy_arith"), log=print,
              prefix_steps: int = PREFIX_STEPS, prefix_only: bool = False) -> dict:
    """Train and save the toy backbone; returns training statistics (with ``options``, every
    keyword argument above but ``log`` and the prefix ones, and ``environment``, what else
    decides the exact bits). ``block_size`` > 0: a block-diffusion toy in SDAR's format (module
    docstring). ``prefix``: the weights' sha256 after ``prefix_steps`` steps
    (recorded in training.json; ``prefix_only`` stops there and saves nothing but the
    tokenizer: train_prefix)."""
    options = {"seed": seed, "steps": steps, "batch_size": batch_size, "d_model": d_model,
               "n_layers": n_layers, "n_heads": n_heads, "mlp_hidden": mlp_hidden,
               "gen_length": gen_length, "lr": lr, "threads": threads,
               "pretrain_fraction": pretrain_fraction, "tasks": list(tasks)}
    if stale_kv:  # recorded only when used: records (and weights) of earlier toys stay valid
        options["stale_kv"] = stale_kv
    if stale_rows:
        options["stale_rows"] = stale_rows
    if block_size:
        options["block_size"] = block_size
        if stale_kv or stale_rows:
            raise ValueError("stale_kv and stale_rows train full-attention toys only")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(f"train:{seed}")
    tok = build_sdar_tokenizer(out_dir) if block_size else build_tokenizer(out_dir)
    vocab = 128
    assert len(tok) <= vocab
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    if block_size:  # SDAR's layout, as the sdar family reads it back
        mask_id = tok.convert_tokens_to_ids("<|MASK|>")
        cfg = BackboneConfig(family="sdar", d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                             n_kv_heads=n_heads, mlp_hidden=mlp_hidden, vocab_size=vocab,
                             rope_theta=10000.0, norm_eps=1e-6, qkv_bias=False, mask_id=mask_id,
                             stop_ids=[eos], qk_norm=True, block_size=block_size)
    else:
        mask_id = tok.convert_tokens_to_ids("<|mdm_mask|>")
        cfg = BackboneConfig(family="llada", d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                             n_kv_heads=n_heads, mlp_hidden=mlp_hidden, vocab_size=vocab,
                             rope_theta=10000.0, norm_eps=1e-5, qkv_bias=False, mask_id=mask_id,
                             stop_ids=[eos], pad_id=eos)
    model = Backbone(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    # unit-scale embeddings: tiny ones are swamped by the blocks' outputs early on and the
    # model takes many more steps to start attending to prompt content (copying digits)
    torch.nn.init.normal_(model.embed.weight, std=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    start = time.perf_counter()
    prefix = None
    losses = []
    for step in (bar := tqdm(range(steps), desc="train toy backbone", mininterval=5)):
        with plain_ops():  # training's own ops, its no-grad passes too (rowwise.py)
            if block_size:
                loss = _block_loss(model, *_block_batch(rng, tok, list(tasks), batch_size, gen_length, eos),
                                   mask_id)
            else:
                loss = _masked_loss(model, rng, tok, tasks, batch_size, gen_length, eos, mask_id,
                                    pretrain_fraction, stale_kv, stale_rows, n_layers)
        _step(model, opt, sched, loss)
        losses.append(loss.item())
        if step + 2 == min(prefix_steps, steps):
            before_last = parameter_fingerprint(model)
        if step + 1 == min(prefix_steps, steps):
            fingerprint = parameter_fingerprint(model)
            prefix = {"steps": step + 1, "sha256": parameter_sha256(model),
                      "environment": prefix_environment(threads), "fingerprint": fingerprint,
                      "last_step_moved": fingerprint_distance(before_last, fingerprint) if step else None}
            if prefix_only:
                return {"prefix": prefix}
        if step % 100 == 0:
            bar.set_postfix(loss=f"{sum(losses[-100:]) / len(losses[-100:]):.3f}")
    model.eval()
    save_llada_checkpoint(model, tok, out_dir)
    stats = {"seed": seed, "steps": steps, "batch_size": batch_size, "final_loss": sum(losses[-50:]) / 50,
             "train_seconds": time.perf_counter() - start, "parameters": sum(p.numel() for p in model.parameters())}
    record = {"options": options, "environment": training_environment(threads),
              "sha256": weight_sha256(out_dir), "prefix": prefix,
              "stats": {k: stats[k] for k in ("final_loss", "train_seconds", "parameters")}}
    atomic_write_json(out_dir / "training.json", record)
    log(f"toy backbone: {stats}")
    return {**stats, "options": options, "environment": record["environment"], "sha256": record["sha256"],
            "prefix": prefix}
