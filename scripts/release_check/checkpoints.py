"""Tiny checkpoints in each release's format (tests/checkpoints.py's block_checkpoint and
moe_checkpoint), the LM head peaked (all rows zero but a few) so confidences spread and thresholds
bite, and the release's modeling/configuration files copied beside them from the checkout given.
Main venv. Usage: python -m scripts.release_check.checkpoints OUT RELEASE [--v2-hub DIR]
[--sdar DIR] [--dinfer DIR] (RELEASE: fast_dllm_v2 | sdar | dinfer)."""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.checkpoints import block_checkpoint, moe_checkpoint, write_weights


def v2(out: Path, hub: Path | None, seed: int, stop: bool) -> Path:
    """Fast-dLLM v2 (bd_size 16): 20 live rows among byte tokens, <|im_end|> live with `stop`."""
    d = out / f"v2_s{seed}{'_stop' if stop else ''}"
    block_checkpoint(d, "fast_dllm_v2", sharded=False, d_model=64, n_layers=3, n_heads=4,
                     n_kv_heads=2, mlp_hidden=96, seed=seed, block_size=16)
    if hub is not None:
        for f in ("modeling.py", "configuration.py"):
            shutil.copy(hub / f, d / f)
    t = load_file(str(d / "model.safetensors"))
    tok = json.loads((d / "tokenizer_config.json").read_text())
    added = {v["content"]: int(k) for k, v in tok["added_tokens_decoder"].items()}
    V, D = t["lm_head.weight"].shape
    g = torch.Generator().manual_seed(1000 + seed)
    rows = torch.arange(3, 250)[torch.randperm(247, generator=g)[:20]]
    if stop:
        rows = torch.cat([rows, torch.tensor([added["<|im_end|>"]])])
    W = torch.zeros(V, D)
    W[rows] = torch.randn(len(rows), D, generator=g) * 0.5
    t["lm_head.weight"] = W
    (d / "model.safetensors").unlink()
    write_weights(d, t, 1)
    meta = {"mask": added["|<MASK>|"], "stop": [added["<|im_end|>"]],
            "pad": added["<|endoftext|>"]}
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def sdar(out: Path, rel: Path | None, block: int, seed: int) -> Path:
    """SDAR: 13 live ordinary rows and <|im_end|> (weaker), logits ~ N(0, 16)."""
    d = out / f"sdar_b{block}_s{seed}"
    block_checkpoint(d, "sdar", sharded=False, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                     mlp_hidden=96, seed=seed, block_size=block)
    cfg = json.loads((d / "config.json").read_text())
    t = load_file(str(d / "model.safetensors"))
    w = t["lm_head.weight"]
    g = torch.Generator().manual_seed(100 + seed)
    eos = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    keep = torch.randperm(300, generator=g)[:13].tolist() + [eos[0]]
    new = torch.zeros_like(w)
    new[keep] = w[keep] * 4.0 / w[keep].norm(dim=1, keepdim=True)
    new[eos[0]] *= 0.6
    t["lm_head.weight"] = new.contiguous()
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    if rel is not None:
        for f in ("modeling_sdar.py", "configuration_sdar.py",
                  "fused_linear_diffusion_cross_entropy.py"):
            shutil.copy(rel / "training/model/SDAR-4B-Chat" / f, d / f)
    (d / "meta.json").write_text(json.dumps({"mask": cfg["mask_token_id"], "stop": eos}))
    return d


def _peak_moe(d: Path, seed: int) -> None:
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    shard = idx["weight_map"]["lm_head.weight"]
    sd = load_file(str(d / shard))
    W = sd["lm_head.weight"]
    g = torch.Generator().manual_seed(100 + seed)
    keep = torch.zeros(W.shape[0], dtype=torch.bool)
    keep[torch.randperm(199, generator=g)[:24] + 1] = True
    sd["lm_head.weight"] = torch.where(keep[:, None], W * 6.0, torch.zeros_like(W)).contiguous()
    save_file(sd, str(d / shard), metadata={"format": "pt"})


def dinfer(out: Path, rel: Path | None, family: str, seed: int) -> Path:
    """LLaDA-MoE (dlmpipe's copy, and `_dinfer`: fused w1/w2 as dInfer's tools/transfer.py stacks
    them, with its configuration file) and LLaDA2.0 (one copy, dInfer's configuration file)."""
    d = out / f"{family}_s{seed}"
    kw = dict(shared=False, expert_bias=False) if family == "llada_moe" else {}
    moe_checkpoint(d, family, sharded=True, n_layers=2, seed=seed, **kw)
    _peak_moe(d, seed)
    cfg = json.loads((d / "config.json").read_text())
    meta = json.dumps({"mask": 324, "stop": [cfg["eos_token_id"]]})  # moe_checkpoint's ids
    (d / "meta.json").write_text(meta)
    if family == "llada2":
        if rel is not None:
            shutil.copy(rel / "python/dinfer/model/configuration_llada2_moe.py", d)
        return d
    dst = out / f"{family}_s{seed}_dinfer"
    dst.mkdir()
    for f in d.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    if rel is not None:
        shutil.copy(rel / "tools/configuration_lladamoe.py", dst)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    sd = {}
    for shard in sorted(set(idx["weight_map"].values())):
        sd.update(load_file(str(d / shard)))
    fused = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp."
        n_exp = sum(1 for k in sd if k.startswith(f"{p}experts.") and k.endswith("down_proj.weight"))
        take = lambda name: [sd.pop(f"{p}experts.{j}.{name}.weight") for j in range(n_exp)]
        gate, up, down = take("gate_proj"), take("up_proj"), take("down_proj")
        fused[f"{p}w1"] = torch.stack([torch.cat([a, b], 0) for a, b in zip(gate, up)]).contiguous()
        fused[f"{p}w2"] = torch.stack(down).contiguous()
    fused.update(sd)
    save_file(fused, str(dst / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    (dst / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in fused}}))
    return d


def build(out: Path, release: str, v2_hub=None, sdar_dir=None, dinfer_dir=None) -> None:
    from .cases import CASES
    seeds = sorted({c.get("seed", c.get("mseed")) for c in CASES[release]()})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for d in out.iterdir():  # rebuilt from scratch each time
        if d.is_dir() and d.name.startswith({"fast_dllm_v2": "v2_", "sdar": "sdar_",
                                             "dinfer": "llada"}[release]):
            shutil.rmtree(d)
    opt = lambda p: Path(p) if p else None
    for seed in seeds:
        if release == "fast_dllm_v2":
            for stop in (False, True):
                v2(out, opt(v2_hub), seed, stop)
        elif release == "sdar":
            for block in (4, 8):
                sdar(out, opt(sdar_dir), block, seed)
        else:
            for fam in ("llada_moe", "llada2"):
                dinfer(out, opt(dinfer_dir), fam, seed)


if __name__ == "__main__":
    a = argparse.ArgumentParser()
    a.add_argument("out")
    a.add_argument("release", choices=("fast_dllm_v2", "sdar", "dinfer"))
    a.add_argument("--v2-hub")
    a.add_argument("--sdar")
    a.add_argument("--dinfer")
    x = a.parse_args()
    build(Path(x.out), x.release, x.v2_hub, x.sdar, x.dinfer)
