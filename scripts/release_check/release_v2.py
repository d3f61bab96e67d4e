"""Fast-dLLM v2's side: the release's own `batch_sample` (v2/generation_functions.py at upstream
8292f3c, loaded from the file given, unchanged) bound to the hub model class that
AutoModelForCausalLM(trust_remote_code=True) loads from each tiny checkpoint (the hub's
modeling.py beside it). Records each forward (an instance-level wrapper around model.forward,
which batch_sample calls as self.forward): rows computed, kind, and what it committed (the x
tensor its input is a view of, before it and before the next forward). Release venv, with
../shared/releases/stubs (sitecustomize.py) on PYTHONPATH.
Usage: python -m scripts.release_check.release_v2 GENERATION_FUNCTIONS.py CKPTS DTYPE OUT.json"""
from __future__ import annotations

import importlib.util
import json
import sys
import traceback
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

from .cases import v2_cases, prompt_of


def main(gf_file, ckpts, dtype, out_file):
    spec = importlib.util.spec_from_file_location("release_generation_functions", gf_file)
    gf = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gf  # (inspect finds its classes' source)
    spec.loader.exec_module(gf)
    # batch_sample's timers are CUDA calls: no-ops on a CPU-only machine
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.nvtx.range_push = torch.cuda.nvtx.range_pop = lambda *a, **k: None
    dtype = getattr(torch, dtype)
    models, out = {}, []
    for case in v2_cases():
        if case["ckpt"] not in models:
            m = AutoModelForCausalLM.from_pretrained(f"{ckpts}/{case['ckpt']}",
                                                     trust_remote_code=True, dtype=dtype).eval()
            models[case["ckpt"]] = (m, json.load(open(f"{ckpts}/{case['ckpt']}/meta.json")))
        m, meta = models[case["ckpt"]]
        rec, states = [], []
        orig = type(m).forward

        def fwd(input_ids=None, past_key_values=None, update_past_key_values=False,
                use_block_cache=False, block_past_key_values=None, replace_position=None, **kw):
            base = input_ids._base if input_ids._base is not None else input_ids
            lo = (past_key_values.get_seq_length() if past_key_values is not None else 0) + (
                replace_position or 0)
            kind = ("commit" if update_past_key_values else "step")
            if kind == "commit" and not rec:
                kind = "prefill"
            rec.append({"forward": len(rec), "kind": kind, "rows": [[lo, lo + input_ids.shape[1]]],
                        "full": block_past_key_values is None})
            states.append(base[0].tolist())
            return orig(m, input_ids=input_ids, past_key_values=past_key_values,
                        update_past_key_values=update_past_key_values,
                        use_block_cache=use_block_cache, block_past_key_values=block_past_key_values,
                        replace_position=replace_position, **kw)
        m.forward = fwd
        prompt = prompt_of("fast_dllm_v2", case)
        P, err, final = len(prompt), None, None
        try:
            res = gf.Fast_dLLM_QwenForCausalLM.batch_sample(
                m, torch.tensor([prompt]), SimpleNamespace(pad_token_id=meta["pad"]), 16, case["G"],
                case["sub"], P, torch.tensor([P]), mask_id=meta["mask"], threshold=case["thr"],
                stop_token=meta["stop"][0], use_block_cache=case["block_cache"], top_p=0.95,
                temperature=0.0)
            final = res[0].tolist()
        except Exception:
            err = traceback.format_exc(limit=3)
        del m.forward
        states.append(final)
        for k, r in enumerate(rec):
            a, b = states[k], states[k + 1]
            r["committed"] = None if b is None else [
                {"pos": p, "token": b[p], "prev": a[p] if p < len(a) else meta["mask"]}
                for p in range(len(b)) if b[p] != (a[p] if p < len(a) else meta["mask"])
                and b[p] != meta["mask"]]
        out.append({"case": case, "records": rec, "final": None if final is None else final[P:],
                    "error": err, "prompt": prompt, "mask": meta["mask"],
                    "stop": meta["stop"] + [meta["pad"]]})
    json.dump(out, open(out_file, "w"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:5])
