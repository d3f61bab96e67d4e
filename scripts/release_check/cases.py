"""The settings per release (small grids: `all` runs in minutes on one core) and their prompts.
Imported by both sides (release venv and main venv): torch only."""
from __future__ import annotations

import itertools


def v2_cases() -> list[dict]:
    """Fast-dLLM v2 batch_sample: prompt lengths around the 16-row block (16: exactly one block)."""
    out = [dict(ckpt=f"v2_s{seed}", seed=seed, P=P, sub=sub, thr=thr, block_cache=bc, G=32)
           for seed, P, sub, thr, bc in itertools.product(
               (0, 1, 2, 3), (5, 9, 16, 21, 24, 32), (4, 8), (0.3, 0.9, 1.0), (True, False))]
    out += [dict(ckpt=f"v2_s{seed}_stop", seed=seed, P=P, sub=4, thr=thr, block_cache=bc, G=48)
            for seed, P, thr, bc in itertools.product((0, 1, 2, 3), (5, 21, 24), (0.3, 0.9),
                                                      (True, False))]
    return out


def sdar_cases() -> list[dict]:
    """SDAR generate.py (remasking, sampling) and the OpenCompass evaluation loop (threshold; its
    steps divide the block: get_num_transfer_tokens)."""
    sampling = [(1.0, 1, 1.0), (1.0, 0, 0.8), (0.7, 4, 1.0)]  # top_k 1: generate.py's greedy
    out = []
    for (block, steps), seed in itertools.product(((4, 2), (8, 3)), (0, 1)):
        gen = {4: 16, 8: 24}[block]
        for (rem, thr), (T, k, p), P in itertools.product(
                [("low_confidence_static", 0.85), ("low_confidence_dynamic", 0.5),
                 ("sequential", 0.85)], sampling, (3, 5, 8, 11, 16)):
            out.append(dict(loop="generate", block=block, seed=seed, steps=steps, remasking=rem,
                            threshold=thr, T=T, top_k=k, top_p=p, P=P, gen=gen))
        for thr, (T, k, p), P in itertools.product((0.95, 0.5), sampling, (3, 5, 8, 11, 16)):
            out.append(dict(loop="evaluation", block=block, seed=seed, steps=block // 2,
                            remasking="low_confidence", threshold=thr, T=T, top_k=k, top_p=p,
                            P=P, gen=gen))
    return out


def dinfer_cases() -> list[dict]:
    """dInfer's decoders over its iterators: LLaDA-MoE (no cache, dual, prefix, vicinity with and
    without warm-up; dlmpipe's rule paper and released) and LLaDA2.0 (prefix, attnmask)."""
    decoders = [{"decoder": "threshold", "threshold": 0.9},
                {"decoder": "hierarchy", "threshold": 0.8, "low_threshold": 0.5},
                {"decoder": "credit", "threshold": 0.9}, {"decoder": "credit", "threshold": 0.6}]
    vic = lambda w, **kw: {"cache": "vicinity", "prefix_look": 2, "after_look": 3, "warmup": w, **kw}
    caches = {"llada_moe": [{"cache": "none"}, {"cache": "dual"}, {"cache": "prefix"}, vic(0),
                            vic(2), vic(2, rule="released"),
                            {**vic(4, rule="released"), "prefix_look": 16, "after_look": 16},
                            {**vic(4), "prefix_look": 16, "after_look": 16}],
              "llada2": [{"cache": "prefix"}, {"cache": "attnmask"}]}
    return [{"family": fam, **d, **c, "P": P, "n": n, "G": 2 * n, "mseed": s, "pseed": s}
            for fam in ("llada_moe", "llada2") for d in decoders for c in caches[fam]
            for n in (8, 16) for P in (5, 8, 16, 21, 22) for s in (0, 1)]


CASES = {"fast_dllm_v2": v2_cases, "sdar": sdar_cases, "dinfer": dinfer_cases}


def prompt_of(release: str, case: dict) -> list[int]:
    import torch
    if release == "fast_dllm_v2":
        g = torch.Generator().manual_seed(case["seed"] * 1000 + case["P"])
        return torch.randint(3, 250, (case["P"],), generator=g).tolist()
    if release == "sdar":
        g = torch.Generator().manual_seed(1000 * case["seed"] + case["P"])
        return torch.randint(0, 300, (case["P"],), generator=g).tolist()
    g = torch.Generator().manual_seed(5000 + case["pseed"] * 97 + case["P"])
    return torch.randint(1, 320, (case["P"],), generator=g).tolist()


def label(release: str, case: dict) -> str:
    """The table's row: the setting, without the seed and prompt length."""
    c = case
    if release == "fast_dllm_v2":
        return (f"{'block cache' if c['block_cache'] else 'no cache':11} sub {c['sub']} thr {c['thr']}"
                + (" (stop ckpt)" if c["ckpt"].endswith("_stop") else ""))
    if release == "sdar":
        s = "greedy" if c["top_k"] == 1 else f"T{c['T']},k{c['top_k']},p{c['top_p']}"
        rem = f"threshold {c['threshold']}" if c["loop"] == "evaluation" else c["remasking"]
        return f"{c['loop']:10} {rem:22} {s:13} block {c['block']}"
    d = c["decoder"] + (f"({c['threshold']},{c['low_threshold']})" if c["decoder"] == "hierarchy"
                        else f"({c['threshold']})")
    cache = c["cache"] + (f"({c['prefix_look']},{c['after_look']},{c['warmup']})"
                          if c["cache"] == "vicinity" else "") + (f" {c['rule']}" if c.get("rule") else "")
    return f"{c['family']:9} {d:18} {cache:25} n {c['n']}"
