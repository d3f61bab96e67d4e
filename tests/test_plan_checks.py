"""Everything knowable before a job is checked when the campaign is built (the Snakefile's
``Campaign``, ``python -m dlmpipe.campaign``), each problem one line naming its dotted key:
real benchmarks' data files, parameters the checkpoint's widths rule out, weight pins against
the files on disk (hashed once), an unknown benchmark before anything else, YAML syntax errors
with file, line and column, refused pairings with the caches that would serve, out-of-range
values with their range. Through Snakemake, each stops the run before any job."""
from __future__ import annotations

import copy
import hashlib
import inspect
import shutil

import pytest

from dlmpipe.campaign import show as cp  # `python -m dlmpipe.campaign`
from dlmpipe import registry
from dlmpipe.backbones.shipped import SHIPPED_DIR, read_record
from dlmpipe.campaign import Campaign, ConfigError
from dlmpipe.tasks.sources import DATA_ENV

from .checkpoints import make_tiny_checkpoint
from .workflow import REPO

SHARD = "model-00001-of-00002.safetensors"
DATA = REPO / "tests" / "data"
SHARED = (REPO / ".." / "shared" / "data").resolve()


def problems(config: dict, **kwargs) -> list[str]:
    """The problems of a campaign ([] when it is valid)."""
    try:
        Campaign(copy.deepcopy(config), **kwargs)
    except ConfigError as e:
        return e.problems
    return []


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    """An empty $DLMPIPE_DATA_DIR, the working directory at the repository (so that
    ../shared/data from it and from the repository are one directory)."""
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv(DATA_ENV, str(empty))
    monkeypatch.chdir(REPO)
    return empty


def flip_byte(file, offset: int = -1) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 1
    file.write_bytes(bytes(data))


def sha256(file) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


# ---- a. benchmark data -------------------------------------------------------------------------
def test_a_missing_data_file_names_the_tasks_key_and_each_path_looked_at_once(tiny_config, no_data):
    tiny_config["tasks"]["math-500"] = {"benchmark": "math500", "gen_length": 8}
    found = [p for p in problems(tiny_config) if p.startswith("tasks.")]
    looked = [no_data.resolve() / "math500_test.jsonl", SHARED / "math500_test.jsonl"]
    assert found == [f"tasks.math-500.source: no data file given and none found (looked at "
                     f"{looked[0]}, {looked[1]}); set tasks.math-500.source, or {DATA_ENV} to a "
                     "directory holding one"]
    # a file named in the config that is not there
    tiny_config["tasks"]["math-500"]["source"] = str(no_data / "math.jsonl")
    assert problems(tiny_config) == [
        f"tasks.math-500.source: data file not found: {no_data / 'math.jsonl'}"]
    # the other files a loader reads, and the exemplars few-shot prompts need
    tiny_config["tasks"] = {
        "mbpp_et": {"gen_length": 8, "source": str(DATA / "MBPP_ET.jsonl"),
                    "base_source": str(no_data / "mbpp.json")},
        "gsm8k": {"gen_length": 8, "source": str(DATA / "math500_test.jsonl"), "fewshot": 3}}
    assert problems(tiny_config) == [
        f"tasks.mbpp_et.base_source: data file not found: {no_data / 'mbpp.json'}",
        "tasks.gsm8k.fewshot_source: needed with fewshot 3 (a file of exemplars; test rows are "
        "never used as exemplars)"]


def test_data_files_found_where_the_loaders_look_pass(tiny_config, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(DATA))
    tiny_config["tasks"]["math-500"] = {"benchmark": "math500", "gen_length": 8}
    tiny_config["tasks"]["mmlu_pro"] = {"gen_length": 8}  # its validation split too (fewshot 5)
    assert problems(tiny_config) == []
    # a campaign planned for another machine (check_paths=False) reads no data file
    monkeypatch.setenv(DATA_ENV, "/nonexistent")
    tiny_config["tasks"]["finqa"] = {"gen_length": 8}
    assert problems(tiny_config, check_paths=False) == []


# ---- b. parameters against the checkpoint's widths ---------------------------------------------
def spa(**cache) -> dict:
    return {"sampler": {"name": "llada_confidence"}, "cache": {"name": "spa", **cache}}


def test_a_spa_rank_above_the_value_projection_is_refused(tiny_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the hash cache of the shipped toy's pins
    # the tiny toy: d_model 32, 2 heads (train_toy: as many kv heads)
    tiny_config["methods"]["spa"] = spa()
    assert problems(tiny_config) == [
        "methods.spa.cache.rank: 128 exceeds the value projection's rank min(n_kv_heads*head_dim, "
        "d_model) = min(2*16, 32) = 32 (method spa on toy: backbones.toy.toy)"]
    tiny_config["methods"]["spa"] = spa(rank=32)
    assert problems(tiny_config) == []
    tiny_config["methods"]["spa"] = spa(identifier="value")  # no proxy: the rank is unused
    assert problems(tiny_config) == []
    # a checkpoint's config.json: Dream's GQA, 4 heads of 16, 2 kv heads -> rank 32
    dream = make_tiny_checkpoint(tmp_path / "dream", "dream")
    tiny_config["backbones"]["dream"] = {"path": str(dream)}
    tiny_config["methods"]["spa"] = {**spa(rank=32), "overrides": {"dream": {"cache": {"rank": 48}}}}
    assert problems(tiny_config) == [
        "methods.spa.cache.rank: 48 exceeds the value projection's rank min(n_kv_heads*head_dim, "
        f"d_model) = min(2*16, 64) = 32 (method spa on dream, with methods.spa.overrides.dream: "
        f"{dream / 'config.json'})"]
    # the shipped toy: d_model 128, 4 heads of 32
    tiny_config["backbones"] = {"toy": {"shipped": "toy"}}
    tiny_config["methods"]["spa"] = spa(rank=256)
    assert problems(tiny_config) == [
        "methods.spa.cache.rank: 256 exceeds the value projection's rank min(n_kv_heads*head_dim, "
        f"d_model) = min(4*32, 128) = 128 (method spa on toy: {SHIPPED_DIR / 'toy' / 'config.json'})"]


def test_a_drift_rank_above_the_value_projection_is_refused(tiny_config):
    tiny_config["analyses"] = {"drift": [{"methods": ["llada-confidence"], "rank": 64}]}
    assert problems(tiny_config) == [
        "analyses.drift[0].rank: 64 exceeds the value projection's rank min(n_kv_heads*head_dim, "
        "d_model) = min(2*16, 32) = 32 (backbone toy: backbones.toy.toy)"]
    tiny_config["analyses"]["drift"][0]["rank"] = 32
    assert problems(tiny_config) == []


def test_a_block_longer_than_gen_length_is_refused(tiny_config):
    tiny_config["methods"]["llada-confidence"]["sampler"]["block_length"] = 16
    assert problems(tiny_config) == [  # one per task: each has gen_length 8
        "methods.llada-confidence.sampler.block_length: 16 is longer than gen_length 8 (method "
        f"llada-confidence, tasks.{task}.gen_length)" for task in ("toy_code", "toy_arith")]


def test_a_toys_heads_divide_its_width_and_its_defaults_are_train_toys(tiny_config):
    from dlmpipe.backbones.toy import train_toy
    from dlmpipe.sizes import TOY_SIZE

    tiny_config["backbones"]["toy"]["toy"]["d_model"] = 30
    tiny_config["backbones"]["toy"]["toy"]["n_heads"] = 4
    assert problems(tiny_config) == [
        "backbones.toy.toy.d_model: 30 is not a multiple of n_heads 4 (each head is d_model / "
        "n_heads wide)"]
    defaults = {k: p.default for k, p in inspect.signature(train_toy).parameters.items()}
    assert TOY_SIZE == {k: defaults[k] for k in TOY_SIZE}


# ---- c. weight pins against the files on disk ----------------------------------------------------
@pytest.fixture
def pinned_copy(tmp_path, monkeypatch, tiny_config):
    """The tiny campaign on a copy of the shipped toy as a `path:` checkpoint pinned by its
    record; the working directory (where the hash cache lives) in tmp_path."""
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(SHIPPED_DIR / "toy", ckpt)
    tiny_config["backbones"] = {"real": {"path": str(ckpt), "sha256": read_record("toy")["sha256"]}}
    return tiny_config, ckpt


def test_pins_that_do_not_match_the_files_are_refused_at_plan_time(pinned_copy):
    config, ckpt = pinned_copy
    assert problems(config) == []
    want = config["backbones"]["real"]["sha256"][SHARD]
    flip_byte(ckpt / SHARD)
    assert problems(config) == [f"backbones.real.sha256: {ckpt / SHARD}: sha256 mismatch: expected "
                                f"{want}, actual {sha256(ckpt / SHARD)}"]
    (ckpt / SHARD).unlink()
    assert problems(config) == [f"backbones.real.sha256: {ckpt / SHARD}: pinned by sha256 but "
                                f"missing (expected sha256 {want})"]


def test_each_file_is_hashed_once_while_it_stays_the_same(pinned_copy, monkeypatch):
    """.snakemake/dlmpipe/sha256.json of the working directory keeps each file's hash with its
    size, inode, mtime and ctime: a second plan hashes nothing; a file written again is hashed
    again, even with its old size and mtime."""
    import os

    from dlmpipe.campaign import hashes

    config, ckpt = pinned_copy
    assert problems(config) == []
    assert (ckpt.parent / ".snakemake" / "dlmpipe" / "sha256.json").is_file()
    hashed = []
    monkeypatch.setattr(hashes, "file_sha256", lambda f: hashed.append(f.name) or sha256(f))
    assert problems(config) == [] and hashed == []
    st = (ckpt / SHARD).stat()
    flip_byte(ckpt / SHARD)
    os.utime(ckpt / SHARD, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old mtime, same size
    assert len(problems(config)) == 1 and hashed == [SHARD]


def test_a_shipped_checkpoint_that_is_not_its_record_is_refused(tmp_path, monkeypatch, tiny_config):
    from dlmpipe.backbones import shipped
    from dlmpipe.campaign import backbones

    monkeypatch.chdir(tmp_path)
    copy_dir = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, copy_dir)
    monkeypatch.setattr(shipped, "SHIPPED_DIR", copy_dir)
    monkeypatch.setattr(backbones, "SHIPPED_DIR", copy_dir)
    tiny_config["backbones"] = {"toy": {"shipped": "toy"}}
    assert problems(tiny_config) == []
    flip_byte(copy_dir / "toy" / SHARD)
    assert problems(tiny_config) == [
        f"backbones.toy.shipped: {copy_dir / 'toy' / SHARD}: sha256 mismatch: expected "
        f"{read_record('toy')['sha256'][SHARD]}, actual {sha256(copy_dir / 'toy' / SHARD)} "
        f"(pinned by {copy_dir / 'toy' / 'training.json'})"]


# ---- d. an unknown benchmark first -------------------------------------------------------------
def test_an_unknown_benchmark_is_reported_first(tiny_config):
    tiny_config["seed"] = -1
    tiny_config["tasks"]["gsm9k"] = {}                              # no gen_length either
    tiny_config["tasks"]["alias"] = {"benchmark": "nonesuch"}
    found = problems(tiny_config)
    assert found[0].startswith("tasks.gsm9k: unknown task; known tasks: bbh, ")
    assert found[1].startswith("tasks.alias.benchmark: unknown benchmark 'nonesuch'; known: bbh, ")
    assert found[2:] == ["seed: -1 is out of range: must be >= 0"]  # not the unknown tasks' keys


# ---- e. YAML syntax -----------------------------------------------------------------------------
BROKEN = "seed: 0\nmethods: [a, b\ntasks: {}\n"
BROKEN_AT = ("line 3, column 6: YAML syntax error: expected ',' or ']', but got ':' (while parsing a "
             "flow sequence at line 2, column 10)")


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN)
    assert cp.main([str(broken)]) == 2
    assert capsys.readouterr().err == f"invalid {broken}:\n  {BROKEN_AT}\n"
    (tmp_path / "tabs.yaml").write_text("seed: 0\ntasks:\n\ttoy_code: {gen_length: 8}\n")
    assert cp.main([str(tmp_path / "tabs.yaml")]) == 2
    assert "line 3, column 1: YAML syntax error: found character '\\t'" in capsys.readouterr().err
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert cp.main([str(tmp_path / "list.yaml")]) == 2
    assert "(top level): a campaign is a mapping" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["--configfile", "--configfile=", "config.yaml"])
def test_snakemake_names_line_and_column_of_a_broken_campaign_file(tmp_path, how, warm_snakemake):
    """`snakemake --configfile` (Snakemake reads it before the Snakefile: profiles/default checks
    it first) and the default config.yaml (the Snakefile reads it first)."""
    name = "config.yaml" if how == "config.yaml" else "broken.yaml"
    (tmp_path / name).write_text(BROKEN)
    args = {"--configfile": ["--configfile", name], "--configfile=": [f"--configfile={name}"],
            "config.yaml": []}[how]
    proc = warm_snakemake(tmp_path, "-n", *args, check=False)
    assert proc.returncode != 0
    assert f"invalid {name}:\n  {BROKEN_AT}" in proc.stdout + proc.stderr
    assert "rule " not in proc.stdout and not (tmp_path / "results").exists()


# ---- f. pairings ----------------------------------------------------------------------------------
def test_a_refused_pairing_names_the_caches_that_serve_the_sampler(tiny_config):
    tiny_config["methods"]["dual-saber"] = {"sampler": {"name": "saber"},
                                            "cache": {"name": "fast_dllm_dual"}}
    assert problems(tiny_config) == [
        "methods.dual-saber: cache 'fast_dllm_dual' gives fresh logits only for the rows of the "
        "current block; sampler 'saber' reads every response row (visible ones too) at every step; "
        "caches that serve it: none, archer, spa, dllm_cache"]
    for sampler in registry.SAMPLERS:
        serving = [c for c in registry.CACHES if registry.pairing_problem(sampler, c) is None]
        for cache in set(registry.CACHES) - set(serving):
            assert registry.pairing_problem(sampler, cache).endswith(
                f"; caches that serve it: {', '.join(serving)}")


# ---- g. ranges --------------------------------------------------------------------------------------
RANGES = [  # (change, value, the message)
    ("methods/archer/cache/K", -1, "methods.archer.cache.K: -1 is out of range: must be >= 1 or inf"),
    ("methods/archer/sweep", {"cache.K": [1, 0]},
     "methods.archer.sweep.cache.K: 0 is out of range: must be >= 1 or inf"),
    ("methods/archer/sampler/temperature", -0.5,
     "methods.archer.sampler.temperature: -0.5 is out of range: must be >= 0"),
    ("methods/fast/sampler", {"name": "threshold", "tau": 1.5},
     "methods.fast.sampler.tau: 1.5 is out of range: must be >= 0 and <= 1"),
    ("batch_size", 0, "batch_size: 0 is out of range: must be auto or >= 1"),
    ("seed", -1, "seed: -1 is out of range: must be >= 0"),
    ("resources/generate/gpu", -1, "resources.generate.gpu: -1 is out of range: must be >= 0 or null"),
    ("tasks/toy_code/gen_length", 0, "tasks.toy_code.gen_length: 0 is out of range: must be >= 1"),
    # not a range: the type is wrong
    ("methods/archer/cache/K", "big", "methods.archer.cache.K: 'big' is not valid; expected refresh "
                                      "radius, an integer >= 1 or inf"),
]


@pytest.mark.parametrize("change,value,message", RANGES, ids=[f"{r[0]}={r[1]}" for r in RANGES])
def test_out_of_range_values_state_the_range(tiny_config, change, value, message):
    *parents, last = change.split("/")
    node = tiny_config
    for p in parents:
        node = node.setdefault(p, {"cache": {"name": "none"}} if p == "fast" else {})
    node[last] = value
    found = problems(tiny_config)
    assert len(found) == 1 and found[0].startswith(message), found


# ---- through Snakemake: the run stops before any job --------------------------------------------
def test_snakemake_stops_before_any_job_naming_every_plan_problem(tmp_path, warm_snakemake, tiny_config,
                                                                write_config, no_data):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(SHIPPED_DIR / "toy", ckpt)
    flip_byte(ckpt / SHARD)
    tiny_config["backbones"]["real"] = {"path": str(ckpt), "sha256": read_record("toy")["sha256"]}
    tiny_config["tasks"]["math500"] = {"gen_length": 8}
    tiny_config["methods"]["spa"] = spa()
    config = write_config(tiny_config, tmp_path / "c.yaml")
    proc = warm_snakemake(tmp_path, "-n", configfile=config, check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"backbones.real.sha256: {ckpt / SHARD}: sha256 mismatch" in out
    assert "tasks.math500.source: no data file given and none found" in out
    assert "methods.spa.cache.rank: 128 exceeds the value projection's rank" in out
    assert "rule " not in proc.stdout and not (tmp_path / "results").exists()
    # the pins were hashed once, in the workflow's working directory
    assert (tmp_path / ".snakemake" / "dlmpipe" / "sha256.json").is_file()


def test_a_jobs_own_error_reaches_the_console_and_paths_follow_the_campaign_file(
        tmp_path, warm_snakemake, tiny_config, write_config):
    """A failing job's log ends on the console, not only in its file (every rule's shell ends
    with show_failure, the Snakefile's shell prefix); a relative path resolves against the folder of the
    campaign file, not Snakemake's working directory."""
    folder = tmp_path / "campaign"
    folder.mkdir()
    (folder / "q.jsonl").write_text('{"question": "1 + 1?", "answer": "2"}\n')
    tiny_config["tasks"]["mine"] = {"benchmark": "local", "gen_length": 8, "source": "q.jsonl",
                                    "prompt": "{question}"}
    tiny_config["tasks"]["toy_arith"]["ids"] = ["no-such-id"]  # only its job can tell
    config = write_config(tiny_config, folder / "c.yaml")
    proc = warm_snakemake(tmp_path, "--cores", "1", "--keep-going", "results/tasks/toy_arith.parquet",
                     "results/tasks/mine.parquet", configfile=config, check=False)
    assert proc.returncode != 0
    assert "unknown task id(s): ['no-such-id']" in proc.stderr  # the job's own words
    assert (tmp_path / "results" / "tasks" / "mine.parquet").is_file()


def test_every_rule_s_shell_shows_its_log_when_it_fails():
    rules = (REPO / "workflow" / "rules").glob("*.smk")
    blocks = [block for f in rules for block in f.read_text().split("\nrule ")[1:]]
    shells = ["\n".join(line for line in block.splitlines() if not line.startswith("#"))
              for block in blocks if "    shell:" in block]
    ending = ' > {log} 2>&1 || show_failure {log}"'
    assert shells and all(block.rstrip().endswith(ending) and "    log:" in block
                          for block in shells), [b.split(":")[0] for b in shells
                                                 if not b.rstrip().endswith(ending)]


def test_a_release_loop_on_a_full_attention_backbone_is_refused(tiny_config, tmp_path, monkeypatch):
    """The backbone's attention pattern comes from config.json's model_type (SDAR, Fast-dLLM v2:
    block-causal); a block loop of a release on a full-attention backbone fails at config time
    with the reason, and every other method runs on a block-causal one (dlmpipe/registry/)."""
    monkeypatch.chdir(tmp_path)
    sdar = make_tiny_checkpoint(tmp_path / "sdar", "sdar")
    tiny_config["backbones"]["sdar"] = {"path": str(sdar)}
    tiny_config["methods"]["sdar-generate"] = {"sampler": {"name": "sdar"}, "cache": {"name": "none"},
                                               "backbones": ["sdar"]}
    assert problems(tiny_config) == []
    del tiny_config["methods"]["sdar-generate"]["backbones"]
    assert problems(tiny_config) == [
        "methods.sdar-generate: sampler 'sdar' decodes a block-causal backbone's blocks "
        "(block_size: SDAR, Fast-dLLM v2); this backbone attends bidirectionally over the whole "
        "sequence (method sdar-generate on toy: backbones.toy (toy) (llada family))"]


# ---- every problem at once ---------------------------------------------------------------------
def test_schema_errors_pairings_and_data_are_reported_together(tiny_config, no_data):
    """A schema error does not hide the refused pairing, the missing data file or the
    checkpoint that is not there (docs/ARCHITECTURE.md: every problem at once)."""
    tiny_config["seed"] = -1
    tiny_config["methods"]["dual-saber"] = {"sampler": {"name": "saber"},
                                            "cache": {"name": "fast_dllm_dual"}}
    tiny_config["tasks"]["gsm8k"] = {"gen_length": 8, "source": str(no_data / "nope.jsonl")}
    tiny_config["backbones"]["gone"] = {"path": str(no_data / "no-checkpoint")}
    found = problems(tiny_config)
    assert "seed: -1 is out of range: must be >= 0" in found
    assert any(p.startswith("methods.dual-saber: cache 'fast_dllm_dual'") for p in found), found
    assert any(p.startswith("tasks.gsm8k.source: ") and "nope.jsonl" in p for p in found), found
    assert any(p.startswith("backbones.gone") for p in found), found


def test_a_task_without_its_source_is_told_what_the_source_is(tiny_config, no_data):
    """The message names the task's own missing file, never another benchmark's (GSM8K's
    few-shot) words."""
    tiny_config["tasks"]["mine"] = {"benchmark": "local", "gen_length": 8, "prompt": "{q}",
                                    "answer": "a", "metric": "exact"}
    found = problems(tiny_config)
    assert found == ["tasks.mine.source: needed: the local .jsonl/.csv/.parquet file of the "
                     "task's rows (docs/SCORING.md, \"Your own dataset\")"], found
