"""Build a config method (sampler + cache + parameters) into live objects.

The entries (classes, parameters and defaults, pairing rows, artifacts) live in
``dlmpipe.registry``; this module only instantiates them, with the defaults filled there and
``auto`` parameters bound to the backbone (a campaign binds them earlier, per backbone, from the
checkpoint's identity; without one, the model's family alone decides).
"""
from __future__ import annotations

from . import registry
from .backbones.identity import BackboneIdentity
from .backbones.model import Backbone
from .engine.base import Cache
from .graphs import check_device
from .samplers.base import Sampler


def check_pairing(sampler_name: str, cache_name: str) -> None:
    """Raise ValueError when the cache cannot serve the sampler (e.g. rollback needs all rows)."""
    problem = registry.pairing_problem(sampler_name, cache_name)
    if problem:
        raise ValueError(problem)


def attention_of(model: Backbone) -> str:
    """The backbone's attention pattern as the registry names it (``registry.ATTENTIONS``)."""
    return "full" if model.cfg.block_size is None else "block_causal"


def build_sampler(spec: dict) -> Sampler:
    component, params = registry.resolve("sampler", spec)
    return component.load()(**params)


def build_cache(spec: dict, model: Backbone, artifacts: dict | None = None,
                backbone: BackboneIdentity | None = None) -> Cache:
    """``artifacts``: loaded artifacts by kind (e.g. ``{"proxies": ...}``), passed to caches
    that need them (``registry.Component.artifacts``). ``backbone``: the checkpoint's identity
    for ``auto`` parameters (default: the model's family, no checkpoint name)."""
    identity = backbone or BackboneIdentity(model.cfg.family, (), "model")
    component, params = registry.resolve("cache", spec, identity)
    needed = {kind: (artifacts or {}).get(kind) for kind, needs in component.artifacts.items()
              if needs(params)}
    return component.load()(model, **params, **needed)


def build_method(method: dict, model: Backbone, artifacts: dict | None = None,
                 backbone: BackboneIdentity | None = None, compile: str = "none") -> tuple[Sampler, Cache]:
    """``compile``: how fixed-shape steps run (dlmpipe/graphs.py), checked against the model's
    device before anything runs."""
    check_pairing(method["sampler"]["name"], method["cache"]["name"])
    if problems := registry.attention_problems(method, attention_of(model)):
        raise ValueError("; ".join(problems))
    if compile == "cuda_graphs" and model.cfg.n_experts:
        raise ValueError("compile: cuda_graphs cannot capture an MoE backbone's forward: its expert "
                         "layer reads the per-expert row counts to the host and calls the experts "
                         "the routing chose (dlmpipe/backbones/moe.py); use compile: none or torch_compile")
    check_device(compile, model.device)
    sampler = build_sampler(method["sampler"])
    cache = build_cache(method["cache"], model, artifacts, backbone)
    sampler.use_compile(compile)
    cache.use_compile(compile)
    return sampler, cache
