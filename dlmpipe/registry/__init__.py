"""The method registry: every sampler and cache, declared once (docs/METHODS.md states each rule).

One entry per sampler and per cache carries what the rest of the pipeline needs to know about it:
its class (imported lazily, so this package, the campaign check and Snakemake's parsing never
import torch), the logit rows it reads (sampler) or serves (cache), the artifacts it needs (SPA
singular proxies), its parameters with defaults, ranges and descriptions, and the checks that
relate its parameters to a task's generation length and the backbone's widths.

- ``component.py``: what an entry is (``Component``), logit rows, parameter declarations;
- ``samplers.py`` and ``caches.py``: the entries (``SAMPLERS``, ``CACHES``);
- ``derived.py``: what derives from them: the config schema's sampler/cache blocks
  (``schema_defs``; dlmpipe.config_schema installs them), the pairing rule (``pairing_problem``:
  a sampler may not read rows a cache leaves stale; ``attention_problems``: what a backbone's
  attention pattern rules out), the workflow's extra inputs (``artifacts``:
  the svd rule's proxies file), construction with defaults filled and ranges checked
  (``resolve``; dlmpipe.methods builds), parameters chosen from the backbone when set to
  ``auto`` (``bind``: SPA-Cache's ``profile``; the campaign binds them per backbone, so a
  generate job's params hold the concrete value);
- ``describe.py``: every entry and the pairing table for people (``dlmpipe methods``).

Adding a method: write its class, add one entry to samplers.py or caches.py, add one row to the
exactness table in tests/test_exactness.py (docs/DEVELOPING.md, "Adding a method"). An entry
declares everything about itself (``component.REQUIRED``: what it means on block-causal and MoE
backbones, its cost model, host-sync budget, the setting equal to full recompute); one that
lacks a declaration fails at registration. A method outside this package: a module named in
``$DLMPIPE_METHODS`` (``os.pathsep``-separated module names) calling ``register``. ``python -m dlmpipe methods`` (or ``python -m
dlmpipe.registry``) prints every entry's parameters and which caches serve which samplers.
"""
from .caches import CACHES, rank_within_value_projection
from .component import (ROWS, ROWS_MEANING, Component, choice, constructor_params, fraction_or_null,
                        integer, number, positive_or_null, seed_or_null, serves, table)
from .derived import (ATTENTIONS, BOUNDS, KINDS, NoFit, artifacts, attention_problems,
                      attention_refusal, bind, bind_method, bounds, canonical,
                      expected, gen_length_problems, lookup, pairing_problem, refusal, register,
                      resolve, schema_defs, serving_caches, widths_problems)
from .describe import describe, pairing_table
from .samplers import (CONFIDENCE, LLADA_SCHEDULE, PARALLEL_BLOCKS, SAMPLERS, TEMPERATURE,
                       blocks_tile_response, steps_split_over_blocks)

__all__ = ["ATTENTIONS", "attention_problems", "attention_refusal", "BOUNDS", "CACHES", "CONFIDENCE", "KINDS", "LLADA_SCHEDULE", "PARALLEL_BLOCKS", "ROWS",
           "ROWS_MEANING", "SAMPLERS", "TEMPERATURE", "Component", "NoFit", "artifacts", "bind",
           "bind_method", "blocks_tile_response", "bounds", "canonical", "choice", "constructor_params",
           "describe",
           "expected", "fraction_or_null", "gen_length_problems", "integer", "lookup", "number",
           "pairing_problem", "pairing_table", "positive_or_null", "rank_within_value_projection",
           "refusal", "register", "resolve", "schema_defs", "seed_or_null", "serves", "serving_caches",
           "steps_split_over_blocks", "table", "widths_problems"]

METHODS_ENV = "DLMPIPE_METHODS"


def _import_method_modules() -> None:
    """Modules of methods declared outside this package, each calling ``register``."""
    import importlib
    import os

    for name in filter(None, os.environ.get(METHODS_ENV, "").split(os.pathsep)):
        importlib.import_module(name)


_import_method_modules()
