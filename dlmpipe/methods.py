"""Method registry: a config method (sampler + cache + parameters) -> live objects.

Every pairing the math allows is a config line: samplers and caches are looked up by name and
built from their parameter dicts; ``check_pairing`` rejects the pairings that cannot work.
"""
from __future__ import annotations

from .backbones.model import Backbone
from .engine.archer import ArcherCache
from .engine.base import Cache
from .engine.dkv import DKVDecodeCache, DKVGreedyCache
from .engine.dllm_cache import DLLMCache
from .engine.fast_dllm import FastDLLMDualCache, FastDLLMPrefixCache
from .engine.full import FullRecompute
from .engine.spa import SPACache
from .samplers.base import Sampler
from .samplers.llada_confidence import LLaDAConfidence
from .samplers.parallel import FactorSampler, ThresholdSampler
from .samplers.random_order import RandomOrder
from .samplers.saber import Saber

SAMPLERS: dict[str, type[Sampler]] = {"llada_confidence": LLaDAConfidence, "saber": Saber,
                                      "threshold": ThresholdSampler, "factor": FactorSampler,
                                      "random_order": RandomOrder}
CACHES: dict[str, type[Cache]] = {"none": FullRecompute, "archer": ArcherCache,
                                  "fast_dllm_prefix": FastDLLMPrefixCache,
                                  "fast_dllm_dual": FastDLLMDualCache,
                                  "dkv_decode": DKVDecodeCache, "dkv_greedy": DKVGreedyCache,
                                  "spa": SPACache, "dllm_cache": DLLMCache}


def _split(spec: dict) -> tuple[str, dict]:
    params = dict(spec)
    return params.pop("name"), params


def check_pairing(sampler_name: str, cache_name: str) -> None:
    """Raise ValueError when the cache cannot serve the sampler (e.g. rollback needs all rows)."""
    if sampler_name not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler_name!r}; known: {', '.join(sorted(SAMPLERS))}")
    if cache_name not in CACHES:
        raise ValueError(f"unknown cache {cache_name!r}; known: {', '.join(sorted(CACHES))}")
    if SAMPLERS[sampler_name].needs_all_rows and not CACHES[cache_name].serves_all_rows:
        raise ValueError(f"cache {cache_name!r} cannot serve sampler {sampler_name!r}: the sampler "
                         "reads logits of every response row at every step and the cache "
                         "leaves some rows without logits")


def build_method(method: dict, model: Backbone) -> tuple[Sampler, Cache]:
    sampler_name, sampler_params = _split(method["sampler"])
    cache_name, cache_params = _split(method["cache"])
    check_pairing(sampler_name, cache_name)
    return SAMPLERS[sampler_name](**sampler_params), CACHES[cache_name](model, **cache_params)
