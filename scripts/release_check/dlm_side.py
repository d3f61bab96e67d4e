"""dlmpipe's side: the same checkpoints through dlmpipe's loader, build_method and decode with a
DecodeTrace (its records as they are). Main venv.
Usage: python -m scripts.release_check.dlm_side RELEASE CKPTS OUT.json [--release-json R.json]
(SDAR: the release's run, whose draws are replayed where a setting samples)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import traceback

import torch

import dlmpipe.samplers.sdar as sdar_mod
from dlmpipe.backbones.loading import load_backbone
from dlmpipe.decode import decode
from dlmpipe.methods import build_method
from dlmpipe.trace import DecodeTrace

from .cases import CASES, prompt_of


def v2_methods(c):
    return {"": {"sampler": {"name": "fast_dllm_v2", "sub_block_length": c["sub"],
                             "threshold": c["thr"]},
                 "cache": {"name": "fast_dllm_v2" if c["block_cache"] else "none"}}}


def sdar_methods(c):
    """generate.py: dlmpipe's rule paper and released; the evaluation loop: rule evaluation, and
    where greedy the default config's `sdar` (rule paper, temperature 0)."""
    if c["loop"] == "generate":
        rem = dict(remasking=c["remasking"], confidence_threshold=c["threshold"])
        out = {r: dict(rule=r, temperature=c["T"], **rem) for r in ("paper", "released")}
    else:
        rem = dict(remasking="low_confidence_dynamic" if c["threshold"] < 1
                   else "low_confidence_static", confidence_threshold=c["threshold"])
        out = {"evaluation": dict(rule="evaluation", temperature=c["T"], **rem)}
        if c["top_k"] == 1 and c["T"] == 1.0:
            out["paper-T0"] = dict(rule="paper", temperature=0.0, **rem)
    for v in out.values():
        if v["temperature"] != 0:
            v.update(top_k=c["top_k"] or None, top_p=c["top_p"])
    return {k: {"sampler": {"name": "sdar", "steps": c["steps"], **v}, "cache": {"name": "none"}}
            for k, v in out.items()}


def dinfer_methods(c):
    n, d = c["n"], c["decoder"]
    if d == "hierarchy":
        s = {"name": "dinfer_hierarchy", "threshold": c["threshold"],
             "low_threshold": c["low_threshold"]}
    elif d == "threshold":
        s = {"name": "dinfer_credit", "threshold": c["threshold"], "credit_alpha": 0.0}
    else:
        s = {"name": "dinfer_credit", "threshold": c["threshold"], "credit_alpha": 0.7,
             "boost_gamma": 0.2, "decay_beta": 0.8}
    s |= {"block_length": n, "block_alignment": "absolute", "temperature": 0.0}
    vic = lambda pre, after, warm: {"name": "dinfer_vicinity", "prefix_look": pre,
                                    "after_look": after, "warmup_steps": warm}
    cache = {"none": {"name": "none"}, "attnmask": {"name": "none"}, "dual": vic(0, 0, 0),
             "prefix": vic(0, 10**6, 0) if c["family"] == "llada_moe" else {"name": "none"},
             }.get(c["cache"]) or vic(c["prefix_look"], c["after_look"], c["warmup"])
    if c["cache"] == "vicinity":
        cache["rule"] = c.get("rule", "paper")
    return {"": {"sampler": s, "cache": cache}}


METHODS = {"fast_dllm_v2": v2_methods, "sdar": sdar_methods, "dinfer": dinfer_methods}


def ckpt_of(release, c):
    if release == "fast_dllm_v2":
        return c["ckpt"]
    if release == "sdar":
        return f"sdar_b{c['block']}_s{c['seed']}"
    return f"{c['family']}_s{c['mseed']}"


def gen_len(release, c):
    if release == "fast_dllm_v2":  # the release's blocks (batch_sample's whole blocks)
        return (c["P"] // 16 + c["G"] // 16) * 16 - c["P"]
    return c["gen"] if release == "sdar" else c["G"]


def run(release, ckpts, cases=None, release_runs=None, dtype=torch.float64):
    """[{"case", "variant", "records", "final", "error"}] for every case and dlmpipe setting."""
    own_draw, models, out = sdar_mod.draw, {}, []
    rel = {json.dumps(r["case"], sort_keys=True): r for r in (release_runs or [])}
    for c in cases if cases is not None else CASES[release]():
        name = ckpt_of(release, c)
        if name not in models:
            models[name] = load_backbone(f"{ckpts}/{name}", dtype=dtype, with_tokenizer=False).model
        model = models[name]
        if release == "dinfer" and c["family"] == "llada2":
            model.cfg = dataclasses.replace(model.cfg, block_size=c["n"])
        prompt = torch.tensor(prompt_of(release, c))
        for variant, spec in METHODS[release](c).items():
            queue = None
            r = rel.get(json.dumps(c, sort_keys=True))
            if release == "sdar" and spec["sampler"]["temperature"] != 0 and c["top_k"] != 1 and r:
                queue = [s["x0"] for s in r.get("draws", [])]  # the release's draws, replayed

                def replay(probs, temperature, generator, mask_id, fallback=None, q=queue):
                    if not q:
                        return own_draw(probs, temperature, generator, mask_id, fallback)
                    return torch.tensor(q.pop(0)[-probs.shape[0]:], dtype=torch.long)
                sdar_mod.draw = replay
            trace, err, final = DecodeTrace(), None, None
            try:
                s, cache = build_method(spec, model)
                res = decode(model, s, cache, prompt, gen_len(release, c),
                             torch.Generator().manual_seed(c.get("seed", 0)), observer=trace)
                final = res.response.tolist()
            except Exception:
                err = traceback.format_exc(limit=3)
            finally:
                sdar_mod.draw = own_draw
            out.append({"case": c, "variant": variant, "records": trace.records, "final": final,
                        "error": err})
    return out


if __name__ == "__main__":
    a = argparse.ArgumentParser()
    a.add_argument("release", choices=sorted(CASES))
    a.add_argument("ckpts")
    a.add_argument("out")
    a.add_argument("--release-json")
    x = a.parse_args()
    torch.set_num_threads(1)
    runs = json.load(open(x.release_json)) if x.release_json else None
    json.dump(run(x.release, x.ckpts, release_runs=runs), open(x.out, "w"))
