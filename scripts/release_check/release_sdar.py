"""SDAR's side: the release's own generate.py `block_diffusion_generate` and the OpenCompass loop
(evaluation/opencompass/opencompass/models/huggingface_bd3.py: its functions exec'd from the file,
unchanged) over the release's modeling_sdar.py (AutoModelForCausalLM, trust_remote_code) on the
tiny checkpoints. A forward pre-hook records each forward's rows, store_kv and input tokens (a
step's commits: what the next forward over its rows, or the returned x, holds that its input did
not); wrapping sample_with_temperature_topk_topp (called unchanged) records each step's draws and
confidences. Release venv, PYTHONPATH with the stand-ins' flash_attn and sitecustomize.py; their
triton (TRITON_STUB: a folder holding `triton/`) only while the remote code is imported.
Usage: python -m scripts.release_check.release_sdar SDAR_CHECKOUT TRITON_STUB CKPTS DTYPE OUT.json"""
from __future__ import annotations

import ast
import importlib.util
import json
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F

from .cases import sdar_cases, prompt_of


def load_release(rel):
    spec = importlib.util.spec_from_file_location("sdar_generate", f"{rel}/generate.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen  # (inspect finds its classes' source)
    spec.loader.exec_module(gen)
    from transformers.cache_utils import DynamicCache
    bd3_file = f"{rel}/evaluation/opencompass/opencompass/models/huggingface_bd3.py"
    keep = [n for n in ast.parse(open(bd3_file).read()).body if isinstance(n, ast.FunctionDef)
            and n.name in ("add_gumbel_noise", "top_k_logits", "top_p_logits",
                           "sample_with_temperature_topk_topp", "get_num_transfer_tokens",
                           "block_diffusion_generate")]
    bd3 = {"torch": torch, "F": F, "np": np, "DynamicCache": DynamicCache}
    exec(compile(ast.Module(keep, []), bd3_file, "exec"), bd3)
    return gen, bd3


def main(rel, triton_stub, ckpts, dtype, out_file):
    gen, bd3 = load_release(rel)
    from transformers import AutoModelForCausalLM
    # modeling_sdar.py decorates a training-only function with torch.compile at import: import
    # the compiler's modules before the triton stand-in is on the path (it breaks them)
    torch.compile(lambda t: t, fullgraph=True, mode="max-autotune-no-cudagraphs")
    for mod in ("torch._dynamo.debug_utils", "torch._inductor.codecache"):
        importlib.import_module(mod)
    dtype = getattr(torch, dtype)
    REC = {}

    def pre_hook(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        pos = kwargs["position_ids"][0]
        REC["fw"].append((int(pos[0]), int(pos[-1]) + 1, bool(kwargs.get("store_kv")),
                          ids[0].tolist()))

    def wrap(get, put):
        orig = get()

        def wrapped(logits, *a, **kw):
            x0, x0_p = orig(logits, *a, **kw)
            REC["draws"].append({"forward": len(REC["fw"]) - 1, "x0": x0[0].tolist(),
                                 "x0_p": x0_p[0].double().tolist()})
            return x0, x0_p
        put(wrapped)
    wrap(lambda: gen.sample_with_temperature_topk_topp,
         lambda f: setattr(gen, "sample_with_temperature_topk_topp", f))
    wrap(lambda: bd3["sample_with_temperature_topk_topp"],
         lambda f: bd3.__setitem__("sample_with_temperature_topk_topp", f))

    models, out = {}, []
    for c in sdar_cases():
        name = f"sdar_b{c['block']}_s{c['seed']}"
        if name not in models:
            sys.path.insert(0, triton_stub)
            m = AutoModelForCausalLM.from_pretrained(f"{ckpts}/{name}", trust_remote_code=True,
                                                     dtype=dtype).eval()
            sys.path.remove(triton_stub)
            for mod in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
                del sys.modules[mod]
            m.register_forward_pre_hook(pre_hook, with_kwargs=True)
            models[name] = (m, json.load(open(f"{ckpts}/{name}/meta.json")))
        m, meta = models[name]
        prompt = torch.tensor(prompt_of("sdar", c))
        REC.update(fw=[], draws=[])
        torch.manual_seed(c["seed"])
        x, err = None, None
        try:
            if c["loop"] == "generate":
                x = gen.block_diffusion_generate(
                    m, {"input_ids": prompt[None]}, meta["mask"], gen_length=c["gen"],
                    block_length=c["block"], denoising_steps=c["steps"], temperature=c["T"],
                    top_k=c["top_k"], top_p=c["top_p"], remasking_strategy=c["remasking"],
                    confidence_threshold=c["threshold"], stopping_criteria_idx=meta["stop"])
            else:
                x = bd3["block_diffusion_generate"](
                    m, None, {"input_ids": prompt[None], "attention_mask": torch.ones(1, c["P"])},
                    meta["mask"], gen_length=c["gen"], block_length=c["block"],
                    denoising_steps=c["steps"], temperature=c["T"], top_k=c["top_k"],
                    top_p=c["top_p"], remasking="low_confidence", threshold=c["threshold"],
                    stopping_criteria_idx=meta["stop"])
            x = x[0].tolist()
        except Exception as e:
            tb = traceback.extract_tb(e.__traceback__)[-1]
            err = f"{type(e).__name__}: {e} ({tb.filename.split('/')[-1]}:{tb.lineno})"
        records, draws = [], {d["forward"]: d for d in REC["draws"]}
        for i, (lo, hi, store, toks) in enumerate(REC["fw"]):
            if store:
                records.append({"forward": i, "kind": "commit" if records else "prefill",
                                "rows": [[lo, hi]], "committed": []})
                continue
            nxt = (REC["fw"][i + 1][3] if i + 1 < len(REC["fw"]) and REC["fw"][i + 1][0] == lo
                   else x[lo:hi] if x is not None else None)
            d = draws.get(i)
            com = None if nxt is None else [
                {"pos": lo + j, "token": b, "prev": a,
                 "confidence": d["x0_p"][j] if d else None}
                for j, (a, b) in enumerate(zip(toks, nxt)) if a != b]
            records.append({"forward": i, "kind": "step", "rows": [[lo, hi]], "committed": com})
        out.append({"case": c, "records": records, "draws": REC["draws"], "error": err,
                    "final": None if x is None else x[c["P"]:c["P"] + c["gen"]],
                    "prompt": prompt.tolist(), "mask": meta["mask"]})
    json.dump(out, open(out_file, "w"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:6])
