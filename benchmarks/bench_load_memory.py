"""Peak host memory while loading a ~1 GB checkpoint, against the size of the loaded weights.

The loader promises to materialize the weights once, straight into the target dtype/device, so
the resident-set peak of a fresh process should stay near one copy of the weights (plus the
interpreter and libraries). This writes an LLaDA-format sharded bf16 checkpoint of about 1 GB
(random weights), then loads it in a fresh subprocess per dtype and reports
``peak RSS - RSS before loading`` from ``resource.getrusage`` (the kernel's high-water mark, which
also counts file pages mapped into the process) and psutil's anonymous memory where available.

    python benchmarks/bench_load_memory.py [--dir /tmp/dlmpipe-bench-1gb] [--dtypes bfloat16 float32]
        [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
from pathlib import Path

GIB = 1024 ** 3

# LLaDA layout at ~0.54 B parameters: 1.08 GB in bf16.
SHAPE = dict(d_model=2048, n_layers=8, n_heads=16, mlp_hidden=5632, vocab=32000)


def write_checkpoint(out: Path, n_shards: int = 3) -> int:
    """Write config.json, tokenizer and bf16 shards tensor by tensor; returns the weight bytes."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.checkpoints import llada_config, write_llada_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    ids = write_llada_tokenizer(out)
    s = SHAPE
    d, mlp, v = s["d_model"], s["mlp_hidden"], s["vocab"]
    shapes = {"model.transformer.wte.weight": (v, d)}
    for i in range(s["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        shapes |= {b + "attn_norm.weight": (d,), b + "q_proj.weight": (d, d), b + "k_proj.weight": (d, d),
                   b + "v_proj.weight": (d, d), b + "attn_out.weight": (d, d), b + "ff_norm.weight": (d,),
                   b + "ff_proj.weight": (mlp, d), b + "up_proj.weight": (mlp, d), b + "ff_out.weight": (d, mlp)}
    shapes |= {"model.transformer.ln_f.weight": (d,), "model.transformer.ff_out.weight": (v, d)}
    keys = list(shapes)
    per = math.ceil(len(keys) / n_shards)
    g = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for k in range(n_shards):
        name = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        chunk = {key: (0.02 * torch.randn(shapes[key], generator=g)).to(torch.bfloat16)
                 for key in keys[k * per:(k + 1) * per]}
        save_file(chunk, str(out / name), metadata={"format": "pt"})
        weight_map |= {key: name for key in chunk}
        total += sum(t.numel() * 2 for t in chunk.values())
        del chunk
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    cfg = llada_config(d, s["n_layers"], s["n_heads"], s["n_heads"], mlp, v, ids, "bfloat16")
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return total


CHILD = r"""
import json, resource, sys, time
import torch
from dlmpipe.backbones import load_backbone
try:
    import psutil
    proc = psutil.Process()
except ImportError:
    proc = None
def mem():
    if proc is None:
        return {}
    full = proc.memory_full_info()
    return {"rss": full.rss, "anon": getattr(full, "uss", full.rss)}
before = mem()
base_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
loaded = load_backbone(sys.argv[1], dtype=sys.argv[2], device=sys.argv[3], with_tokenizer=False)
if loaded.model.device.type == "cuda":
    torch.cuda.synchronize()
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
after = mem()
weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
print(json.dumps({"dtype": sys.argv[2], "weights": weights, "rss_before": before.get("rss", base_peak),
                  "peak": peak, "base_peak": base_peak, "rss_after": after.get("rss"),
                  "uss_after": after.get("anon"), "seconds": seconds}))
"""


def measure(path: Path, dtype: str, device: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), dtype, device], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/dlmpipe-bench-1gb")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: then the host peak is the staging")
    args = ap.parse_args()
    path = Path(args.dir)
    if not (path / "model.safetensors.index.json").is_file():
        size = write_checkpoint(path)
        print(f"wrote {size / GIB:.2f} GiB bf16 checkpoint to {path}")
    on_disk = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    print(f"checkpoint: {path} ({on_disk / GIB:.2f} GiB of safetensors, bf16); loading to {args.device}")
    print(f"{'dtype':>9} {'weights GiB':>12} {'peak-before GiB':>16} {'ratio':>6} "
          f"{'RSS after GiB':>14} {'load s':>7}")
    for dtype in args.dtypes:
        r = measure(path, dtype, args.device)
        grow = r["peak"] - r["rss_before"]
        print(f"{dtype:>9} {r['weights'] / GIB:12.2f} {grow / GIB:16.2f} {grow / r['weights']:6.2f} "
              f"{(r['rss_after'] or 0) / GIB:14.2f} {r['seconds']:7.2f}")


if __name__ == "__main__":
    main()
