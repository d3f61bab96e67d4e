"""docs/DEVELOPING.md's "Adding a method" holds as written: an entry declares everything about
itself, a missing declaration fails at registration naming the field and the doc section, and
a cache registered from a module outside the repository is picked up by the contract tests
(host-sync budget, shadow rows, cost model, pairings, block-causal and MoE statements) with no
other file touched; the exactness table then asks for its one row."""
from __future__ import annotations

import dataclasses
import os
import re
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

#: the contract tests, each selecting the new cache's own cases (-k below); the pairing check (one
#: case per family and cache: every sampler with it) at one full-attention and one block-causal
#: family (the other two families repeat it with no other path for a new cache)
PAIRING = "tests/test_exactness.py::test_every_allowed_pairing_serves_the_rows_its_sampler_reads"
CONTRACT = ["tests/test_host_sync.py::test_every_sampler_and_cache_has_a_budget",
            "tests/test_host_sync.py::test_a_step_reads_back_only_what_its_decisions_need",
            "tests/test_wino.py::test_a_cached_forward_serves_the_full_forwards_shadow_rows_on_an_unchanged_sequence",
            "tests/test_wino.py::test_caches_declare_what_they_compute",
            "tests/test_cli.py::test_the_cost_model_covers_every_method_and_its_exact_settings_cost_full_recompute",
            f"{PAIRING}[stride_refresh-llada]", f"{PAIRING}[stride_refresh-sdar]",
            "tests/test_exactness.py::test_every_method_states_what_it_means_on_block_causal_backbones",
            "tests/test_moe_methods.py::test_every_cache_states_what_it_means_on_moe_backbones"]
#: the recipe's third thing, which the module alone does not give: the exactness table's row
DEGENERATE_ROW = "tests/test_exactness.py::test_every_cache_has_a_degenerate_row"


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


def test_a_cache_from_its_own_module_is_picked_up_by_the_contract_tests(tmp_path, monkeypatch, capsys):
    (tmp_path / "stride_refresh_cache.py").write_text(textwrap.dedent(MODULE))
    env = {**os.environ, registry.METHODS_ENV: "stride_refresh_cache", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    # one pytest run: the contract tests pass with the new cache, and the exactness table (the
    # recipe's third thing) fails, naming it
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-n", "0", "-p",
                          "no:cacheprovider", "-k", "stride_refresh or budget or declare or "
                          "cost_model or serves or states or degenerate", *CONTRACT, DEGENERATE_ROW],
                         cwd=REPO, env=env, capture_output=True, text=True)
    out = run.stdout + run.stderr
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    passed = set(re.findall(r"^PASSED (\S+)", out, re.M))
    assert failed == [DEGENERATE_ROW] and run.returncode == 1, out[-3000:]
    assert "stride_refresh" in out.split("= FAILURES =", 1)[1].split("= PASSES =", 1)[0]
    # every contract test ran and passed, the host-sync and shadow-row ones with its own cases
    assert {p.split("[")[0] for p in passed} == {c.split("[")[0] for c in CONTRACT}, out[-3000:]
    assert {f"{PAIRING}[stride_refresh-llada]", f"{PAIRING}[stride_refresh-sdar]"} <= passed
    for test in CONTRACT[1:3]:
        assert {f"{test}[stride_refresh-{family}]" for family in ("llada", "dream")} <= passed, test
    # and the schema, the pairing check and `dlmpipe methods` know it: the command run here, after
    # the registry's loader of $DLMPIPE_METHODS (what a fresh process runs when it imports the
    # registry, as the pytest run above did), the entry removed after (issue 46: not a second
    # interpreter)
    from dlmpipe.cli import main

    monkeypatch.setenv(registry.METHODS_ENV, "stride_refresh_cache")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        registry._import_method_modules()
        assert main(["methods"]) == 0
        shown = capsys.readouterr().out
    finally:
        registry.CACHES.pop("stride_refresh", None)
        sys.modules.pop("stride_refresh_cache", None)
    assert "stride_refresh" in shown


def test_a_cache_built_on_an_existing_one_takes_the_parameters_its_entry_declares():
    """The recipe's way to build on an existing cache (docs/DEVELOPING.md): subclass it, fix the
    parent's parameters (the entry declares only the new ones) or pass ``**options`` on (the
    entry declares the parent's too, e.g. copied from its entry); the registry's check of
    constructor against entry accepts both and names what differs otherwise."""
    from dlmpipe.engine.dkv import DKVDecodeCache

    class Fixed(DKVDecodeCache):
        def __init__(self, model, *, warm: int):
            super().__init__(model, refresh_interval=8)
            self.warm = warm

    class Passing(DKVDecodeCache):
        def __init__(self, model, *, warm: int, **options):
            super().__init__(model, **options)
            self.warm = warm

    def entry(cls, params):
        made = dataclasses.replace(registry.CACHES["dkv_decode"], name="warm_dkv", params=params)
        object.__setattr__(made, "load", lambda: cls)  # the class itself: no module to import
        return made

    warm = {"warm": registry.integer(2, "the first `warm` steps of a block are full")}
    passed_on = {**registry.CACHES["dkv_decode"].params, **warm}
    assert registry.constructor_params(Fixed) == {"warm"}
    assert registry.constructor_params(Passing) == {"warm", "refresh_interval"}
    assert entry(Fixed, warm).constructor_problem() is None
    assert entry(Passing, passed_on).constructor_problem() is None
    assert ("takes ['refresh_interval', 'warm'], the entry declares ['warm']"
            in entry(Passing, warm).constructor_problem())
