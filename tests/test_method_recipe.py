"""docs/DEVELOPING.md's "Adding a method" holds as written: an entry declares everything about
itself, a missing declaration fails at registration naming the field and the doc section, and
a cache registered from a module outside the repository is picked up by the contract tests
(host-sync budget, shadow rows, cost model, pairings, block-causal and MoE statements) with no
other file touched; the exactness table then asks for its one row."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from dlmpipe import registry
from dlmpipe.registry.component import REQUIRED

from .workflow import REPO

#: the issue's cache: a global refresh every `every` steps of a block, the current block between
MODULE = '''
"""A throwaway cache: one module, one registry entry (docs/DEVELOPING.md, "Adding a method")."""
from dlmpipe import registry
from dlmpipe.engine.row_cache import RowKVCache
from dlmpipe.registry.costs import CacheCost, block_start


class StrideRefresh(RowKVCache):
    def __init__(self, model, *, every: int):
        super().__init__(model)
        self.every = every

    def response_logits(self, x, block):
        self.stats.nfe += 1
        first = self.block is None
        new_block = self._enter(block)
        lo, hi = self.block
        serve = self.positions[lo:hi]
        if new_block or self.block_step % self.every == 0:
            self.stats.refreshes += 0 if first else 1
            return self._full_forward(x, serve)
        self.stats.cached_forwards += 1
        start = self.model.first_logit_row(self.prompt_len + lo)
        return self._forward_rows(x, self.positions[start:self.prompt_len + hi], serve)


registry.register("cache", registry.Component(
    "stride_refresh", "stride_refresh_cache:StrideRefresh",
    "a full forward every `every` steps of a block, else the current block", "block_rows",
    {"every": registry.integer(4, "full forward every this many steps (1: full recompute)")},
    shadow_rows=True,
    on_block_causal="the active block's rows between refreshes of the active block",
    on_moe="reused K/V rows keep the routing of the step they were computed at",
    cost=CacheCost("full every `every` updates of a block, else the block",
                   lambda c, t: t.n if block_start({"refresh_interval": c.get("every", 4)}, t)
                   else t.s.block),
    host_sync={"stride_refresh": ({}, 0, 0)}, exact={"every": 1}, cheap={}))
'''

CONTRACT = ["tests/test_host_sync.py::test_every_sampler_and_cache_has_a_budget",
            "tests/test_host_sync.py::test_a_step_reads_back_only_what_its_decisions_need",
            "tests/test_wino.py::test_a_cached_forward_serves_the_full_forwards_shadow_rows_on_an_unchanged_sequence",
            "tests/test_wino.py::test_caches_declare_what_they_compute",
            "tests/test_cli.py::test_the_cost_model_covers_every_method_and_its_exact_settings_cost_full_recompute",
            "tests/test_exactness.py::test_every_allowed_pairing_serves_the_rows_its_sampler_reads",
            "tests/test_exactness.py::test_every_method_states_what_it_means_on_block_causal_backbones",
            "tests/test_moe_methods.py::test_every_cache_states_what_it_means_on_moe_backbones"]


@pytest.mark.parametrize("kind", ["sampler", "cache"])
def test_a_missing_declaration_fails_at_registration_naming_field_and_doc(kind):
    table = registry.KINDS[kind]
    entry = next(iter(table.values()))
    for field in REQUIRED[kind]:
        blank = dataclasses.replace(entry, name="new_one", **{field: None if field not in (
            "on_block_causal", "on_moe") else ""})
        with pytest.raises(ValueError, match=rf"{kind} 'new_one': no `{field}` declared "
                                             r"\(docs/DEVELOPING.md, \"Adding a method\"\)"):
            registry.register(kind, blank)
        with pytest.raises(ValueError, match=f"no `{field}` declared"):
            registry.table(blank, kind=kind)
    with pytest.raises(ValueError, match="registered already"):
        registry.register(kind, entry)
    assert "new_one" not in table


def test_a_cache_from_its_own_module_is_picked_up_by_the_contract_tests(tmp_path):
    (tmp_path / "stride_refresh_cache.py").write_text(textwrap.dedent(MODULE))
    env = {**os.environ, registry.METHODS_ENV: "stride_refresh_cache", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "-k", "stride_refresh or budget or declare or cost_model or serves or "
                          "states", *CONTRACT], cwd=REPO, env=env, capture_output=True, text=True)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "--collect-only",
                             "-p", "no:cacheprovider", *CONTRACT[:3]], cwd=REPO, env=env,
                            capture_output=True, text=True).stdout
    assert "stride_refresh" in listed  # its own host-sync and shadow-row cases
    # and the schema, the pairing check and `dlmpipe methods` know it
    shown = subprocess.run([sys.executable, "-m", "dlmpipe", "methods"], cwd=REPO, env=env,
                           capture_output=True, text=True).stdout
    assert "stride_refresh" in shown
    # the recipe's third thing: the exactness table asks for its row, naming it
    missing = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                              "no:cacheprovider",
                              "tests/test_exactness.py::test_every_cache_has_a_degenerate_row"],
                             cwd=REPO, env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "stride_refresh" in missing.stdout
