"""Config checks: the schema fills defaults and every rejection names the offending key, both in
dlmpipe.campaign and when Snakemake parses the workflow (before any job runs)."""
from __future__ import annotations

import copy
import json
import math
import re

import pytest

from dlmpipe import campaign as cp
from dlmpipe import registry
from dlmpipe.campaign import Campaign, ConfigError, check_config, load_campaign

from .workflow import CONFIGS, REPO, job_blocks


#: the method families the default campaign keeps (the toy expectations are stored for them);
#: a method registered later is not forced into it
DEFAULT_CACHES = {"none", "archer", "fast_dllm_prefix", "fast_dllm_dual", "fast_dllm_v2",
                  "dkv_decode", "dkv_greedy", "spa", "dllm_cache", "d2cache"}
DEFAULT_SAMPLERS = {"llada_confidence", "saber", "threshold", "random_order", "certainty_prior",
                    "pc_sampler", "wino", "eb_sampler", "klass", "sdar", "fast_dllm_v2"}


def with_change(config: dict, dotted: str, value) -> dict:
    """A copy of ``config`` with the value at a dotted path set (``value=DELETE`` removes it)."""
    out = copy.deepcopy(config)
    *parents, last = dotted.split("/")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return out


DELETE = object()

# (change as "path/to/key", value, what the message must name)
REJECTIONS = [
    ("colour", "blue", "colour: unknown key"),
    ("methods/archer/cache/Kk", 3, "methods.archer.cache.Kk: unknown key"),
    ("methods/archer/sampler/steps", 4, "methods.archer.sampler.steps: unknown key"),
    ("backbones/real", {"path": "/nonexistent/llada"}, "backbones.real.path"),
    ("methods/archer/sampler/name", "sabre", "methods.archer.sampler.name: unknown sampler 'sabre'"),
    ("methods/archer/cache/name", "kvcache", "methods.archer.cache.name: unknown cache 'kvcache'"),
    ("methods/archer/cache/K", 0, "methods.archer.cache.K: 0 is out of range: must be >= 1 or inf"),
    ("methods/archer/sampler/temperature", -1, "methods.archer.sampler.temperature"),
    ("methods/archer/sweep/cache.K", [1, 0], "methods.archer.sweep.cache.K: 0 is out of range: must be >= 1 or inf"),
    ("tasks/toy_code/gen_length", 0, "tasks.toy_code.gen_length"),
    ("tasks/toy_code/gen_length", DELETE, "tasks.toy_code.gen_length: missing"),
    ("tasks/nonesuch", {"gen_length": 8}, "tasks.nonesuch: unknown task"),
    ("tasks/toy_code/fewshot", 3, "tasks.toy_code.fewshot: task 'toy_code' takes no option 'fewshot'"),
    ("tasks/bbh", {"gen_length": 8, "fewshot": -1}, "tasks.bbh.fewshot"),
    ("tasks/humaneval", {"gen_length": 8, "prompt_style": "chat"}, "tasks.humaneval.prompt_style"),
    ("device", "tpu", "device: 'tpu' is not one of"),
    ("compile", "jit", "compile: 'jit' is not one of"),
    ("compile", "cuda_graphs", "compile: cuda_graphs needs device: cuda"),  # tiny.yaml: device cpu
    ("sandbox", "none", "sandbox: 'none' is not valid; expected isolation of generated code"),
    ("batch_size", 0, "batch_size: 0 is out of range: must be auto or >= 1"),
    ("methods/archer/batch_size", "many", "methods.archer.batch_size"),
    ("reference_method", "greedy", "reference_method: 'greedy' is not a method"),
    ("methods/archer-k1", {"sampler": {"name": "saber"}, "cache": {"name": "archer", "K": 1}},
     "methods.archer-k1: method name 'archer-k1' is produced twice"),
    ("methods/archer/name", "archer", "methods.archer: method name 'archer' is produced twice"),
    ("methods/archer/name", "a-{cache.Q}", "methods.archer.name: template field {cache.Q}"),
    ("methods/llada-confidence/sampler/block_length", 3, "methods.llada-confidence.sampler.block_length"),
    ("backbones/toy/path", "/tmp", "backbones.toy: expected exactly one of `shipped`"),
    ("backbones/toy/sha256", {"model-00001-of-00002.safetensors": "0" * 64},
     "backbones.toy.sha256: a trained toy's weights depend on the machine's CPU kernels"),
    ("backbones/other", {"shipped": "nonesuch"}, "backbones.other.shipped: no shipped checkpoint 'nonesuch'"),
    ("backbones/other", {"shipped": "toy", "sha256": {"model.safetensors": "abc"}},
     "backbones.other.sha256.model.safetensors: 'abc' does not match"),
    ("tables/t1", {"style": "table1"}, "tables.t1.style: 'table1' is not one of archer, spa"),
    ("tables/t1", {"style": "archer", "rows": []}, "tables.t1.rows: unknown key"),
    ("tables/t1", {"style": "archer", "methods": ["archer-k3"]},
     "tables.t1.methods[0]: 'archer-k3' is neither a method nor a base method"),
    ("tables/t1", {"style": "archer", "operating_points": {"toy_code": "archer-k1"}},
     "tables.t1.operating_points.toy_arith: missing"),
    ("methods/archer/gen_length", 0, "methods.archer.gen_length"),
    ("methods/archer/sweep/gen_length", [8, 0], "methods.archer.sweep.gen_length: 0"),
    ("methods/archer/sweep/gen_lenght", [8], "methods.archer.sweep.gen_lenght: invalid name"),
    ("methods/archer/name", "a-{gen_length}", "methods.archer.name: template field {gen_length}"),
    ("methods/blocked", {"sampler": {"name": "llada_confidence", "block_length": 8},
                         "cache": {"name": "none"}, "sweep": {"gen_length": [8, 12]}},
     "methods.blocked.sampler.block_length: 8 does not divide gen_length 12 "
     "(method blocked-g12, gen_length)"),
    ("tasks/alias", {"benchmark": "nonesuch", "gen_length": 8},
     "tasks.alias.benchmark: unknown benchmark 'nonesuch'"),
    ("tasks/alias", {"benchmark": "", "gen_length": 8}, "tasks.alias.benchmark"),
]


@pytest.mark.parametrize("change,value,named", REJECTIONS, ids=[r[0] + "=" + str(r[1])[:12] for r in REJECTIONS])
def test_campaign_rejects_naming_the_key(tiny_config, change, value, named):
    with pytest.raises(ConfigError) as err:
        Campaign(with_change(tiny_config, change, value))
    assert named in str(err.value)


def test_batch_size_is_per_campaign_and_per_method(tiny_config):
    """``batch_size`` defaults to auto; a method's own overrides it; above 1 with a compile mode
    is refused at config time, naming the key that set it."""
    camp = Campaign(tiny_config)
    assert camp.config["batch_size"] == "auto"
    assert set(camp.batch_sizes.values()) == {"auto"}
    changed = with_change(with_change(tiny_config, "batch_size", 4), "methods/archer/batch_size", 2)
    camp = Campaign(changed)
    assert {camp.batch_size(m) for m, base in camp.origin.items() if base == "archer"} == {2}
    assert camp.batch_size("llada-confidence") == 4
    with pytest.raises(ConfigError, match="methods.archer.batch_size: 2 with compile: torch_compile"):
        Campaign(with_change(changed, "compile", "torch_compile"))
    Campaign(with_change(with_change(tiny_config, "compile", "torch_compile"), "batch_size", 1))


def test_checkpoint_directory_needs_config_json(tiny_config, tmp_path):
    config = with_change(tiny_config, "backbones/real", {"path": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"backbones\.real\.path: .* has no config\.json"):
        Campaign(config)
    (tmp_path / "config.json").write_text("{}")
    assert "real" in Campaign(config).backbones


def test_every_error_is_reported_at_once(tiny_config):
    config = with_change(tiny_config, "methods/archer/cache/K", 0)
    config = with_change(config, "seed", -1)
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert [p.split(":")[0] for p in err.value.problems] == ["methods.archer.cache.K", "seed"]


def test_unknown_sampler_is_one_message_not_a_cascade(tiny_config):
    config = with_change(tiny_config, "methods/archer/sampler", {"name": "sabre", "n": 3})
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert err.value.problems == [
        "methods.archer.sampler.name: unknown sampler 'sabre'; known: "
        + ", ".join(registry.SAMPLERS)]


def test_defaults_are_filled_from_the_schema(tiny_config):
    config = Campaign(tiny_config).config
    assert config["methods"]["archer"]["sampler"] == {
        "name": "saber", "n": 2, "mu": 2, "block_length": None, "temperature": 0,
        "max_steps_per_block": 1024}
    assert config["methods"]["archer"]["cache"] == {"name": "archer", "K": 8, "refresh": "distance", "A": 8}
    assert config["methods"]["llada-confidence"]["sampler"] == {
        "name": "llada_confidence", "block_length": None, "steps": None, "temperature": 0,
        "confidence": "probability"}
    assert config["backbones"]["toy"]["dtype"] == "float32" and config["backbones"]["toy"]["chat"] is False
    assert config["resources"]["generate"]["mem_mb"] > 0
    assert config["sandbox"] is None  # DLMPIPE_SANDBOX, else bwrap (dlmpipe.scoring.levels)


def test_jobs_see_the_schema_defaults_of_the_one_validation_pass(tmp_path, warm_snakemake, tiny_config):
    """The Snakefile validates once (Campaign) and its jobs get the nested defaults it filled,
    inside the methods map and the registry's sampler/cache blocks."""
    proc = warm_snakemake(tmp_path, "-n", "-p", configfile=CONFIGS / "tiny.yaml")
    generate = [line for line in proc.stdout.splitlines() if "dlmpipe generate " in line]
    planned = {m["name"]: m for m in map(json.loads, re.findall(r"--method '(\{.*?\})'", "\n".join(generate)))}
    campaign = Campaign(copy.deepcopy(tiny_config))
    for name in campaign.methods:
        assert planned[name] == campaign.method(name, "toy_code", "toy")
    # the timing jobs get the same method, with its batch size for their throughput pass
    timed = [line for line in proc.stdout.splitlines() if "dlmpipe time-method " in line]
    for m in map(json.loads, re.findall(r"--method '(\{.*?\})'", "\n".join(timed))):
        assert m == {**campaign.method(m["name"], "toy_code", "toy"), "batch_size": "auto"}
    assert planned["archer-k1"]["cache"] == {"name": "archer", "K": 1, "refresh": "distance", "A": 8}


def test_rules_read_the_config_the_one_pass_filled(tmp_path, warm_snakemake, tiny_config):
    """Campaign fills `config` itself, the dict the rules read: resources the campaign leaves
    out reach every job as the schema's defaults, the ones Snakemake's own validator fills."""
    from snakemake.utils import validate

    theirs = copy.deepcopy(tiny_config)
    validate(theirs, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    assert "mem_mb" not in tiny_config["resources"]["generate"]  # left to the schema
    proc = warm_snakemake(tmp_path, "-n", configfile=CONFIGS / "tiny.yaml")
    seen = set()
    for rule, body in job_blocks(proc.stdout):
        if rule in ("train_toy", "generate", "score"):
            want = theirs["resources"][rule]
            assert f"runtime={want['runtime']}," in body and f"mem_mb={want['mem_mb']}," in body, (rule, body)
            if rule == "generate":  # the batch size, a scheduling resource (0: auto)
                assert "batch_size=0," in body, body
            seen.add(rule)
    assert seen == {"train_toy", "generate", "score"}


def test_default_campaign_expands_readable_names():
    c = load_campaign([REPO / "config.yaml"])
    assert list(c.methods) == ["llada-confidence", "saber", "archer-k1", "archer-k4", "archer-kinf",
                               "fast-dllm-dual", "fast-dllm-parallel", "parallel-t0.3",
                               "dkv-decode", "dkv-greedy", "spa-r128-adaptive-p0.25",
                               "spa-r128-adaptive-p0.5", "dllm-cache-kp50-kr7", "d2cache",
                               "certainty-prior", "pc-sampler", "wino", "eb-sampler", "klass",
                               "sdar", "fast-dllm-v2"]
    assert c.methods["archer-kinf"]["cache"]["K"] == "inf"  # JSON-safe infinity
    assert c.method("archer-k4", "toy_code", "toy") == {**c.methods["archer-k4"], "gen_length": 32}
    # every method family of the engine is in the front door, the releases' block loops on the
    # block-diffusion toy only (the toy attends bidirectionally)
    blocks = {n for t in registry.KINDS.values() for n, e in t.items() if e.needs_block_causal}
    # (a method added later need not join it: adding one there changes the stored toy
    # expectations; the contract tests cover every registered method, tests/test_method_recipe.py)
    assert {m["cache"]["name"] for m in c.methods.values()} >= DEFAULT_CACHES
    assert {m["sampler"]["name"] for m in c.methods.values()} >= DEFAULT_SAMPLERS
    assert {n for n, m in c.methods.items() if blocks & {m["sampler"]["name"], m["cache"]["name"]}} \
        == {"sdar", "fast-dllm-v2"} == {m for b, _, m in c.decoding_jobs() if b == "toy_block"} - {
            "llada-confidence", "fast-dllm-dual", "fast-dllm-parallel", "d2cache", "dllm-cache-kp50-kr7"}
    assert {b for b, _, m in c.decoding_jobs() if m in ("sdar", "fast-dllm-v2")} == {"toy_block"}
    assert "gen_length" not in c.task_options("toy_code")


def test_sweeps_expand_as_a_cartesian_product_with_templates(tiny_config):
    config = with_change(tiny_config, "methods/grid", {
        "sampler": {"name": "llada_confidence"}, "cache": {"name": "none"},
        "sweep": {"sampler.steps": [8, 4], "sampler.temperature": [0.5, 1.0]}})
    config = with_change(config, "methods/t", {
        "name": "arch-{cache.refresh}-a{cache.A}", "sampler": {"name": "saber"},
        "cache": {"name": "archer", "refresh": "age"}, "sweep": {"cache.A": [2, 4]}})
    config = with_change(config, "methods/archer/sweep/cache.K", [1, math.inf])
    names = list(Campaign(config).methods)
    assert names == ["llada-confidence", "archer-k1", "archer-kinf", "grid-steps8-temperature0.5",
                     "grid-steps8-temperature1", "grid-steps4-temperature0.5",
                     "grid-steps4-temperature1", "arch-age-a2", "arch-age-a4"]


def test_a_method_sets_or_sweeps_gen_length_over_the_tasks(tiny_config):
    config = with_change(tiny_config, "methods/scaling", {
        "sampler": {"name": "llada_confidence", "block_length": 4}, "cache": {"name": "none"},
        "sweep": {"gen_length": [4, 12], "sampler.steps": [12]}})
    config = with_change(config, "methods/long", {
        "name": "long-g{gen_length}", "sampler": {"name": "dream"}, "cache": {"name": "none"},
        "gen_length": 32})
    c = Campaign(config)
    assert list(c.methods)[-3:] == ["scaling-g4-steps12", "scaling-g12-steps12", "long-g32"]
    for task in ("toy_code", "toy_arith"):           # both tasks have gen_length 8
        assert c.method("scaling-g12-steps12", task, "toy")["gen_length"] == 12
        assert c.method("long-g32", task, "toy")["gen_length"] == 32
        assert c.method("archer-k1", task, "toy")["gen_length"] == 8
    assert "gen_length" not in c.methods["archer-k1"]
    # the checks see the method's length, not the task's: block 4 divides 4 and 12, not 10 ...
    with pytest.raises(ConfigError, match=r"block_length: 4 does not divide gen_length 10 "
                                          r"\(method scaling-g10-steps12, gen_length\)"):
        Campaign(with_change(config, "methods/scaling/sweep/gen_length", [10]))
    # ... and 4 steps do not split over the 12 / 4 = 3 blocks
    with pytest.raises(ConfigError, match="sampler.steps: 4 is not a multiple of the 3 blocks"):
        Campaign(with_change(config, "methods/scaling/sweep/sampler.steps", [4]))


def test_a_task_alias_loads_a_benchmark_under_its_own_name(tiny_config):
    config = with_change(tiny_config, "tasks/code-2", {"benchmark": "toy_code", "n": 2, "gen_length": 8})
    c = Campaign(config)
    assert c.tasks == ["toy_code", "toy_arith", "code-2"]
    assert c.benchmark("code-2") == "toy_code" and c.benchmark("toy_code") == "toy_code"
    assert c.task_options("code-2") == {"n": 2}     # passed to the loader unchanged
    assert c.task_options("toy_code") == {"n": 3, "seed": 1000}
    # the benchmark's own loader options are checked, whatever the task's name
    config = with_change(config, "tasks/he-base", {"benchmark": "humaneval", "gen_length": 8,
                                                   "prompt_style": "completion", "limit": 150})
    assert Campaign(copy.deepcopy(config)).task_options("he-base") == {"prompt_style": "completion",
                                                                       "limit": 150}
    with pytest.raises(ConfigError, match="tasks.code-2.prompt_style: task 'toy_code' takes no "
                                          "option 'prompt_style'"):
        Campaign(with_change(config, "tasks/code-2/prompt_style", "completion"))


def test_schema_blocks_are_the_registry_entries():
    """Schema enums, if/then branches and $defs blocks are generated from dlmpipe.registry."""
    schema = cp.load_schema()
    for kind, table in registry.KINDS.items():
        enum = schema["$defs"][kind]["properties"]["name"]["enum"]
        branches = [b["if"]["properties"]["name"]["const"] for b in schema["$defs"][kind]["allOf"]]
        assert enum == branches == list(schema["$defs"][kind + "s"]) == list(table)
        for name, component in table.items():
            assert schema["$defs"][kind + "s"][name]["properties"] == component.params


def test_a_new_registry_entry_is_a_config_line_without_touching_the_schema(monkeypatch, tiny_config):
    """One registry entry makes a cache configurable: name, parameters, defaults, ranges, pairing."""
    entry = registry.Component("echo", "dlmpipe.engine.full:FullRecompute", "test cache", "masked_rows",
                               {"depth": registry.integer(3, "how deep")})
    monkeypatch.setitem(registry.CACHES, "echo", entry)
    tiny_config["methods"]["echo"] = {"sampler": {"name": "llada_confidence"}, "cache": {"name": "echo"}}
    assert Campaign(copy.deepcopy(tiny_config)).methods["echo"]["cache"] == {"name": "echo", "depth": 3}
    tiny_config["methods"]["echo"]["cache"]["depth"] = 0
    with pytest.raises(ConfigError, match="methods.echo.cache.depth"):
        Campaign(copy.deepcopy(tiny_config))
    tiny_config["methods"]["echo"] = {"sampler": {"name": "saber"}, "cache": {"name": "echo"}}
    with pytest.raises(ConfigError, match="cache 'echo' gives fresh logits only for the masked rows"):
        Campaign(tiny_config)


def test_every_declared_range_is_enforced_when_a_method_is_built():
    """Outside a checked campaign (jobs, tests, benchmarks) the registry's ranges still hold."""
    from dlmpipe.methods import build_sampler

    checked = 0
    for kind, table in registry.KINDS.items():
        for name, component in table.items():
            for key, declared in component.params.items():
                alternatives = declared.get("anyOf", [declared])
                low = [a["minimum"] for a in alternatives if "minimum" in a]
                if not low:
                    continue
                bad = low[0] - 1
                if kind == "sampler":
                    with pytest.raises(ValueError, match=f"sampler {name}: {key} must be"):
                        build_sampler({"name": name, key: bad})
                else:
                    with pytest.raises(ValueError, match=f"cache {name}: {key} must be"):
                        registry.resolve("cache", {"name": name, key: bad})
                checked += 1
    assert checked >= 15


def test_campaign_command_prints_the_expansion(capsys):
    from dlmpipe.campaign.show import main  # `python -m dlmpipe.campaign`

    assert main([str(CONFIGS / "tiny.yaml")]) == 0
    out = capsys.readouterr().out
    assert "archer-kinf" in out and "generate jobs: 6" in out


# ---- through Snakemake: the run stops before any job, with the key in the message -------------
SNAKEMAKE_REJECTIONS = [r for r in REJECTIONS if r[0] in (
    "colour", "methods/archer/cache/Kk", "backbones/real", "methods/archer/sampler/name",
    "methods/archer/cache/name", "methods/archer/cache/K")]


@pytest.mark.parametrize("change,value,named", SNAKEMAKE_REJECTIONS,
                         ids=[r[0] for r in SNAKEMAKE_REJECTIONS])
def test_snakemake_stops_before_any_job(tmp_path, warm_snakemake, write_config, tiny_config,
                                        change, value, named):
    config = write_config(with_change(tiny_config, change, value), tmp_path / "bad.yaml")
    proc = warm_snakemake(tmp_path, "-n", configfile=config, check=False)
    assert proc.returncode != 0
    assert named in proc.stdout + proc.stderr
    assert "rule generate" not in proc.stdout
    assert not (tmp_path / "results").exists()


def test_a_configfile_replaces_the_default_campaign(tmp_path, warm_snakemake):
    """--configfile is a whole campaign: the default's methods are not merged into it."""
    proc = warm_snakemake(tmp_path, "-n", configfile=CONFIGS / "tiny.yaml")
    generated = set(re.findall(r"generations/toy/\w+/([\w.+-]+)\.parquet", proc.stdout))
    assert generated == {"llada-confidence", "archer-k1", "archer-kinf"}
