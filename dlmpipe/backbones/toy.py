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
rows are seen through K/V from an earlier, more masked state of the sequence (``toy_objectives._stale_view``:
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
family, with SDAR's block-diffusion objective (``toy_objectives._block_forward``): each sequence is laid out from
position 0 (blocks count from there, as at inference), every block of the response is noised with
its own mask ratio, and the noised copy's block ``b`` attends to itself and to the clean copy's
blocks before ``b`` (the exact prefix a block-causal decode has), the clean copy block-causally
to itself: one forward trains every block as the active block over its finished prefix.

The formats a toy is saved in are ``toy_format.py``, the objectives ``toy_objectives.py``; this
module is the training loop, its environment record and the prefix hash.
"""
from __future__ import annotations

import hashlib
import math
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..environment import cpu_model
from ..io import atomic_write_json
from .model import Backbone, BackboneConfig
from .pins import weight_sha256
from .rowwise import plain_ops
from .toy_format import build_sdar_tokenizer, build_tokenizer, save_llada_checkpoint
from .toy_objectives import _block_batch, _block_loss, _masked_loss, _step


def training_environment(threads: int) -> dict:
    """What decides a trained toy's exact bits besides its options: the kernels torch picks."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": cpu_model(), "machine": platform.machine(), "threads": threads,
            "python": platform.python_version()}


#: the training steps after which train_toy hashes the weights (``prefix`` in training.json): a
#: cheap retraining check (tests/test_shipped_toy.py) that train_toy still trains the same bits
PREFIX_STEPS = 10


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
