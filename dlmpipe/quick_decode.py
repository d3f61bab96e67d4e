"""One prompt, one method, one checkpoint: a quick look at what a method does (``dlmpipe decode``).

Everything is the generate job's own code: the checkpoint loads as a job loads it
(backbones/loading.py, pinned weights checked), the method is built as a job builds it
(methods.build_method: defaults filled, ranges and pairing checked, ``auto`` parameters chosen
from the checkpoint's identity; SPA-Cache's singular proxies computed from the loaded weights),
the prompt is encoded as a task row's (generate.encode_prompt) and decode.decode decodes it,
so what it prints is what a campaign's job would decode for that prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

SHIPPED = "shipped:"


def parse_sets(items: list[str]) -> dict[str, dict]:
    """``["cache.K=4", "sampler.tau=0.8"]`` -> ``{"sampler": {"tau": 0.8}, "cache": {"K": 4}}``
    (values read as YAML, as a config file writes them: 4, 0.8, inf, null, true)."""
    out: dict[str, dict] = {"sampler": {}, "cache": {}}
    for item in items:
        key, eq, value = item.partition("=")
        part, dot, param = key.strip().partition(".")
        if not eq or not dot or part not in out or not param:
            raise ValueError(f"--set {item!r}: expected sampler.<parameter>=<value> or "
                             "cache.<parameter>=<value>")
        out[part][param] = yaml.safe_load(value)
    return out


@dataclass(frozen=True)
class Checkpoint:
    """Where a checkpoint is, the sha256 its weights must have and its identity."""

    path: Path
    sha256: dict[str, str] | None
    identity: object  # backbones.identity.BackboneIdentity


def find_checkpoint(spec: str) -> Checkpoint:
    """``shipped:<name>`` (a checkpoint shipped with dlmpipe, checked against its record) or a
    local checkpoint directory."""
    from .backbones.identity import checkpoint_identity, shipped_identity

    if spec.startswith(SHIPPED):
        from .backbones.shipped import read_record, shipped_path

        name = spec[len(SHIPPED):]
        path = shipped_path(name)
        return Checkpoint(path, read_record(name)["sha256"],
                          shipped_identity(path, f"shipped {name}"))
    path = Path(spec).expanduser()
    return Checkpoint(path, None, checkpoint_identity(path))


def quick_decode(checkpoint: str, sampler: str, cache: str, prompt: str, gen_length: int,
                 sets: dict[str, dict] | None = None, device: str = "auto",
                 dtype: str = "auto", chat: bool = False, seed: int = 0,
                 warmup: bool = False, trace: str | None = None,
                 block_size: int | None = None) -> dict:
    """Decode ``prompt`` once; returns the text (cut at the first stop token), the method as
    decoded (parameters filled), the decode's statistics, its synchronized wall time and time
    to first token, tokens per second, device and dtype. ``warmup``: one untimed decode first
    (kernels, allocations), as the jobs do. ``trace``: write every forward of the (timed)
    decode to that file as JSON lines (dlmpipe/trace.py; its observer's reads are inside the
    timed decode). ``block_size``: a block-causal backbone's block size for this decode (None:
    the checkpoint's), checked as a campaign's ``block_size`` is (docs/MODELS.md, "Block sizes
    and generation lengths")."""
    import torch

    from . import registry
    from .backbones.loading import load_backbone
    from .decode import decode
    from .generate import cut_at_stop, encode_prompt, resolve_device
    from .methods import build_method

    sets = sets or {"sampler": {}, "cache": {}}
    ckpt = find_checkpoint(checkpoint)
    method = registry.bind_method({"name": f"{sampler}+{cache}", "gen_length": gen_length,
                                   "sampler": {"name": sampler, **sets["sampler"]},
                                   "cache": {"name": cache, **sets["cache"]}}, ckpt.identity)
    if (p := registry.pairing_problem(sampler, cache)) or (
            p := "; ".join(registry.gen_length_problems(method, gen_length))):
        raise ValueError(p)
    if block_size is not None:
        from .campaign.jobs import block_size_problems

        if (p := "; ".join(block_size_problems("--block-size", block_size, method, gen_length,
                                               ckpt.identity, f"{ckpt.path}"))):
            raise ValueError(p)
        method["block_size"] = block_size
    dev = resolve_device(device)
    if dtype == "auto":
        dtype = "bfloat16" if dev.type == "cuda" else "float32"
    loaded = load_backbone(ckpt.path, dtype=dtype, device=dev, sha256=ckpt.sha256)
    loaded.model.use_block_size(block_size, "--block-size")
    artifacts = {}
    if "proxies" in registry.artifacts(method):  # SPA-Cache's singular proxies, from these weights
        from .engine.proxies import proxies_from_model

        artifacts["proxies"] = proxies_from_model(loaded.model)
    sampler_obj, cache_obj = build_method(method, loaded.model, artifacts, ckpt.identity)
    ids = torch.tensor(encode_prompt(loaded, {"prompt": prompt}, chat=chat), dtype=torch.long)

    def run(observer=None):
        return decode(loaded.model, sampler_obj, cache_obj, ids, gen_length,
                      torch.Generator().manual_seed(seed), observer=observer)

    if warmup:
        run()
    if trace:
        from .trace import DecodeTrace

        with DecodeTrace(trace) as observer:
            res = run(observer)
    else:
        res = run()
    cfg = loaded.model.cfg
    stops = cfg.stop_ids + ([cfg.pad_id] if cfg.pad_id is not None else [])
    kept = cut_at_stop(res.response.tolist(), stops)
    return {"text": loaded.tokenizer.decode(kept, skip_special_tokens=False), "method": method,
            "prompt_tokens": int(ids.shape[0]), "generated": len(kept),
            "time_s": res.time_s, "ttft_s": res.ttft_s,
            "tps": len(kept) / res.time_s if res.time_s > 0 else float("nan"),
            "device": str(dev), "dtype": dtype, "checkpoint": str(ckpt.path), **res.stats}


def report(r: dict) -> str:
    """What ``dlmpipe decode`` prints."""
    m = r["method"]
    params = {part: {k: v for k, v in m[part].items() if k != "name"} for part in ("sampler",
                                                                                  "cache")}
    return "\n".join([
        r["text"],
        "",
        f"sampler {m['sampler']['name']} {params['sampler']}",
        f"cache   {m['cache']['name']} {params['cache']}",
        f"{r['checkpoint']} on {r['device']} ({r['dtype']}); prompt {r['prompt_tokens']} tokens, "
        f"gen_length {m['gen_length']}",
        f"steps {r['steps']}, NFE {r['nfe']}, refreshes {r['refreshes']}, cached forwards "
        f"{r['cached_forwards']}, revisions {r['revisions']}",
        f"wall time {r['time_s']:.3f} s, first token {r['ttft_s']:.3f} s, {r['generated']} tokens "
        f"before the first stop: {r['tps']:.1f} tokens/s "
        f"({m['gen_length'] / r['time_s']:.1f} response positions/s)",
    ])
