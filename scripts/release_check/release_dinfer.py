"""dInfer's side: the release's own decoders and iterators (python/dinfer/ of the checkout given,
imported unchanged) and its model classes loaded as benchmarks/benchmark_dataset.py does
(AutoConfig from the checkpoint, the class, load_weights), on the tiny checkpoints; entry points
as that script builds them:
  LLaDA-MoE: BlockWiseDiffusionLLM(model, decoder, BlockIteratorFactory(start_block_align=True),
             cache_factory=None | KVCacheFactory('dual'|'prefix'), early_stop=True);
             VicinityCacheDiffusionLLM(..., KVCacheFactory('dual'), prefix_look, after_look, warmup_steps)
  LLaDA2.0:  BlockDiffusionLLM(..., BlockIteratorFactory(True, use_block_diffusion=True),
             KVCacheFactory('prefix', is_bd_model=True)); BlockDiffusionLLMAttnmask (no cache)
Records every forward (rows computed) and every decoder.decode call (positions committed): a
forward followed by a decode over masks is a "step", over a block without masks "idle", a
forward without one "forward". Release venv, PYTHONPATH with the vLLM stand-in
(../shared/releases/make_vllm_stub.py OUT).
Usage: python -m scripts.release_check.release_dinfer DINFER_CHECKOUT CKPTS DTYPE OUT.json"""
from __future__ import annotations

import json
import os
import sys
import traceback

import torch

from .cases import dinfer_cases, prompt_of


def main(rel, ckpts, dtype, out_file):
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    sys.path.insert(0, f"{rel}/python")
    from transformers import AutoConfig
    import dinfer.decoding.utils as U
    from dinfer import (ThresholdParallelDecoder, CreditThresholdParallelDecoder,
                        HierarchyDecoder, BlockWiseDiffusionLLM, VicinityCacheDiffusionLLM,
                        BlockDiffusionLLM, BlockDiffusionLLMAttnmask, BlockIteratorFactory,
                        KVCacheFactory)
    from dinfer.model import LLaDAMoeModelLM, LLaDA2MoeModelLM
    dtype = getattr(torch, dtype)

    def load(family, seed):
        path = f"{ckpts}/{family}_s{seed}" + ("_dinfer" if family == "llada_moe" else "")
        cls = LLaDAMoeModelLM if family == "llada_moe" else LLaDA2MoeModelLM
        model = cls(config=AutoConfig.from_pretrained(path, trust_remote_code=True)).eval()
        kw = {} if family == "llada_moe" else {"device": "cpu"}
        model.load_weights(path, torch_dtype=dtype, **kw)
        return model, json.load(open(f"{path}/meta.json"))

    def decoder(c, mask, eos):
        kw = dict(temperature=0, threshold=c["threshold"], mask_id=mask, eos_id=eos)
        if c["decoder"] == "hierarchy":
            return HierarchyDecoder(low_threshold=c["low_threshold"], **kw)
        return (CreditThresholdParallelDecoder if c["decoder"] == "credit"
                else ThresholdParallelDecoder)(**kw)

    def dllm(model, dec, c):
        if c["family"] == "llada2":
            it = BlockIteratorFactory(start_block_align=True, use_block_diffusion=True)
            if c["cache"] == "prefix":
                return BlockDiffusionLLM(model, dec, it, early_stop=True,
                                         cache_factory=KVCacheFactory("prefix", is_bd_model=True))
            return BlockDiffusionLLMAttnmask(model, dec, it, early_stop=True)
        it = BlockIteratorFactory(start_block_align=True)
        if c["cache"] == "vicinity":
            return VicinityCacheDiffusionLLM(model, dec, it, cache_factory=KVCacheFactory("dual"),
                                             early_stop=True, prefix_look=c["prefix_look"],
                                             after_look=c["after_look"], warmup_steps=c["warmup"])
        return BlockWiseDiffusionLLM(model, dec, it, early_stop=True, cache_factory=None
                                     if c["cache"] == "none" else KVCacheFactory(c["cache"]))

    models, out = {}, []
    for c in dinfer_cases():
        key = (c["family"], c["mseed"])
        if key not in models:
            models[key] = load(*key)
        model, meta = models[key]
        mask, eos = meta["mask"], meta["stop"][0]
        records, captured = [], {}
        orig_fwd = model.forward

        def fwd(input_ids=None, *a, **kw):
            pos, rp, L = kw.get("position_ids"), kw.get("replace_position"), input_ids.shape[1]
            lo = int(pos[0, 0]) if pos is not None else int(rp[0]) if rp is not None else 0
            records.append({"forward": len(records), "kind": "forward", "rows": [[lo, lo + L]],
                            "committed": []})
            return orig_fwd(input_ids, *a, **kw)
        model.forward = fwd
        dec = decoder(c, mask, eos)
        orig_dec = dec.decode

        def decode(logits, block_start, block_end, x, *a, **kw):
            before = x.data[0].clone()
            res = orig_dec(logits, block_start, block_end, x, *a, **kw)
            r = records[-1]
            r["kind"] = "step" if (before[block_start:block_end] == mask).any() else "idle"
            r["committed"] = [{"pos": p, "token": int(x.data[0, p]), "prev": int(before[p])}
                              for p in (x.data[0] != before).nonzero()[:, 0].tolist()]
            return res
        dec.decode = decode
        orig_get = U.TokenArray.get_generated_tokens

        def grab(self):
            captured["x"] = self.data[0].tolist()
            return orig_get(self)
        U.TokenArray.get_generated_tokens = grab
        prompt = prompt_of("dinfer", c)
        err = None
        try:
            dllm(model, dec, c).generate(torch.tensor([prompt]), gen_length=c["G"],
                                         block_length=c["n"])
        except Exception:
            err = traceback.format_exc(limit=3)
        finally:
            U.TokenArray.get_generated_tokens = orig_get
            del model.forward
        x = captured.get("x")
        out.append({"case": c, "records": records, "error": err, "prompt": prompt, "mask": mask,
                    "final": None if x is None else x[len(prompt):]})
    json.dump(out, open(out_file, "w"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:5])
