"""``python -m dlmpipe``: the user's commands (check, methods, decode, plan) lead the help, the job
commands parse exactly as the workflow's rules call them, and each user command does what it
says: ``methods`` shows every entry and the pairing rule's verdict on every pair, ``decode``
decodes a prompt on the shipped toy, ``plan`` counts the jobs Snakemake plans (also for the
papers' campaigns without their checkpoints) and prices them."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
import torch
import yaml

from dlmpipe import cost, plan, registry
from dlmpipe.campaign import load_campaign
from dlmpipe.cli import build_parser, main
from dlmpipe.commands import jobs, user
from dlmpipe.tasks import load_task

from .workflow import CONFIGS, REPO, expected_counts, job_counts


def section(out: str, title: str) -> list[str]:
    """The lines of one titled section of a command's output (up to the next blank line)."""
    lines = out.split(f"\n{title}")[1].split("\n\n")[0].splitlines()
    return [line for line in lines[1:] if line.strip()]


# ---- help ------------------------------------------------------------------------------------
def test_help_lists_the_users_commands_first_and_the_rules_jobs_apart():
    out = subprocess.run([sys.executable, "-m", "dlmpipe", "--help"], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout
    listed = {}  # command -> (group, line number)
    group = None
    for i, line in enumerate(out.splitlines()):
        if line.endswith(":") and not line.startswith(" "):
            group = line[:-1]
        elif group and (m := re.match(r"  (\S+)", line)) and not line.startswith("   "):
            listed[m.group(1)] = (group, i)
    assert [c for c, _ in sorted(listed.items(), key=lambda kv: kv[1][1])][:len(user.COMMANDS)] == list(user.COMMANDS)
    assert {c for c, (g, _) in listed.items() if g == "user commands"} == set(user.COMMANDS)
    assert {c for c, (g, _) in listed.items() if g == "tools"} == set(jobs.TOOLS)
    # the job group is exactly what the rules run
    called = {m for smk in (REPO / "workflow" / "rules").glob("*.smk")
              for m in re.findall(r"python -m dlmpipe ([a-z-]+)", smk.read_text())}
    assert {c for c, (g, _) in listed.items() if g.startswith("job commands")} == called
    assert called.isdisjoint(user.COMMANDS) and called.isdisjoint(jobs.TOOLS)


def test_every_job_command_parses_as_the_rules_call_it(tmp_path, warm_snakemake):
    """Every command line of a dry run of the default campaign (every stage and analysis)
    parses with the CLI's parser."""
    proc = warm_snakemake(tmp_path, "-n", "-p", configfile=REPO / "config.yaml")
    parser, seen = build_parser(), set()
    for line in re.findall(r"^Shell command: (.*)$", proc.stdout, re.M):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command, words = [], [*lexer, ";"]
        for word in words:  # commands end at a separator; a redirection ends their arguments
            if word in (";", "&&", "||", "|", "{", "}", "(", ")"):
                if command[:3] == ["python", "-m", "dlmpipe"]:
                    args = parser.parse_args((command + [None])[3:(command + [None]).index(None)])
                    seen.add(args.command)
                    assert callable(args.func)
                command = []
            elif word[0] in "<>&" or command[-1:] == [None]:
                command.append(None)
            elif not command and re.match(r"^[A-Za-z_]\w*=", word):
                continue  # an environment assignment before the command (DLMPIPE_GPUS=N)
            else:
                command.append(word)
    assert {"generate", "score", "time-method", "summarize", "svd", "intervene"} <= seen


# ---- methods ---------------------------------------------------------------------------------
def test_methods_shows_every_entry_and_the_pairing_rules_verdict_on_every_pair(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for kind, table in registry.KINDS.items():
        for name, entry in table.items():
            assert f"  {name}: {entry.description}" in out
            for key, spec in entry.params.items():
                assert f"    {key} = " in out and registry.expected(spec) in out
    lines = out.split("which caches serve which samplers")[1].splitlines()[1:]
    caches = lines[0].split()
    assert caches == list(registry.CACHES)
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:1 + len(registry.SAMPLERS)]}
    assert list(rows) == list(registry.SAMPLERS)
    legend = dict(re.findall(r"^  ([a-z]): (.*(?:\n     .*)*)", out, re.M))
    legend = {k: " ".join(v.split()) for k, v in legend.items()}
    refused = 0
    for s, cells in rows.items():
        for c, cell in zip(caches, cells):
            problem = registry.pairing_problem(s, c)
            if problem is None:
                assert cell == "✓", (s, c)
                continue
            refused += 1
            reason = legend[cell].replace("the cache", f"cache {c!r}").replace(
                "the sampler", f"sampler {s!r}")
            assert problem.startswith(reason), (s, c, problem, reason)
    assert refused and len(legend) < refused  # one letter per reason, not per pair


def test_methods_markdown_has_the_same_table(capsys):
    main(["methods", "--format", "markdown"])
    out = capsys.readouterr().out
    assert all(f"#### `{n}`" in out for table in registry.KINDS.values() for n in table)
    table = [line for line in out.splitlines() if line.startswith("| `") and line.count("|") ==
             len(registry.CACHES) + 2]
    cells = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
             for line in table}
    for s in registry.SAMPLERS:
        assert [c == "✓" for c in cells[s]] == [registry.pairing_problem(s, c) is None
                                                 for c in registry.CACHES]


# ---- decode ----------------------------------------------------------------------------------
def test_decode_on_the_shipped_toy_prints_the_text_and_its_numbers(capsys):
    """The shipped toy fills a toy_arith chain exactly with LLaDA confidence (config.yaml: exact),
    with full recompute and under Archer K = 4, one token per update: NFE = gen_length, and
    Archer refreshes every 4th update (its distance reaches K), as the cost model counts."""
    row = load_task("toy_arith", n=1)[0]
    for cache, sets, full in (("none", [], 32), ("archer", ["--set", "cache.K=4"], 8)):
        assert main(["decode", "--checkpoint", "shipped:toy", "--sampler", "llada_confidence",
                     "--cache", cache, *sets, "--prompt", row["prompt"], "--gen-length", "32",
                     "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(row["answer"]), out
        numbers = dict(re.findall(r"(steps|NFE|refreshes|cached forwards) (\d+)", out))
        assert numbers["steps"] == numbers["NFE"] == "32"
        assert int(numbers["cached forwards"]) == 32 - full
        method = registry.bind_method({"gen_length": 32, "sampler": {"name": "llada_confidence"},
                                       "cache": {"name": cache, **({"K": 4} if sets else {})}}, None)
        assert cost.decode_cost(method, len(row["prompt"])).full == full
        assert re.search(r"wall time \d+\.\d+ s, first token \d+\.\d+ s, \d+ tokens before the "
                         r"first stop: \d+\.\d tokens/s", out)


def test_decode_refuses_what_a_campaign_refuses(capsys):
    assert main(["decode", "--checkpoint", "shipped:toy", "--sampler", "saber", "--cache",
                 "fast_dllm_dual", "--prompt", "1 2 _", "--device", "cpu"]) == 2
    assert registry.pairing_problem("saber", "fast_dllm_dual") in capsys.readouterr().err
    assert main(["decode", "--checkpoint", "shipped:toy", "--sampler", "threshold", "--prompt",
                 "1 2 _", "--set", "sampler.block_length=24", "--device", "cpu"]) == 2
    assert "does not divide gen_length 32" in capsys.readouterr().err
    assert main(["decode", "--checkpoint", "shipped:nothing", "--sampler", "saber", "--prompt",
                 "1", "--device", "cpu"]) == 2
    assert "no shipped checkpoint 'nothing'" in capsys.readouterr().err


# ---- plan ------------------------------------------------------------------------------------
def planned(out: str) -> dict[str, int]:
    rows = dict(line.split() for line in section(out, "jobs per rule:"))
    return {rule: int(n) for rule, n in rows.items() if rule != "total"}


def gpu_hours(out: str) -> dict[str, float]:
    rows = section(out, "GPU-hours per backbone")[1:]
    return {r.split()[0]: float(r.split()[5]) for r in rows if not r.startswith("  total")}


@pytest.mark.parametrize("name", ["archer", "spa"])
def test_plan_prices_a_paper_campaign_without_its_checkpoints(name, capsys):
    config = REPO / "configs" / f"{name}.yaml"
    campaign = load_campaign([config], check_paths=False)
    assert not any(campaign.checkpoint_path(b).exists() for b in campaign.backbones)
    assert main(["plan", str(config)]) == 0
    out = capsys.readouterr().out
    # the jobs the dry runs of tests/test_paper_configs.py plan (on tiny checkpoints)
    assert planned(out) == {k: v for k, v in expected_counts(campaign).items() if v}
    hours = gpu_hours(out)
    assert list(hours) == campaign.backbones and all(h > 0 for h in hours.values())
    samples = dict(line.split()[:2] for line in section(out, "samples per task:"))
    assert {t: int(n) for t, n in samples.items()} == {
        "archer": {"mbpp": 427, "livecodebench": 400, "humaneval": 164},
        "spa": {"gsm8k": 1319, "math500": 500, "gpqa_main": 448, "bbh": 6511, "mmlu_pro": 12032,
                "mbpp": 427, "humaneval": 164}}[name]
    assumptions = out.split("\nassumptions:\n")[1]
    for part in ("sampler", "cache"):
        for used in {m[part]["name"] for m in campaign.methods.values()}:
            assert f"{part} {used}: " in assumptions
    assert "GPU: H100 SXM, 989 TFLOP/s" in assumptions and "not here yet" in out


def test_plan_counts_the_jobs_a_dry_run_plans(tmp_path, warm_snakemake, capsys, monkeypatch):
    """A small campaign with every kind of job (a trained toy, shards, SPA's proxies, a paper
    table, the three analyses): plan's counts equal Snakemake's."""
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["shards"] = 2
    config["methods"]["spa"] = {"sampler": {"name": "llada_confidence"},
                                "cache": {"name": "spa", "rank": 8}, "tasks": ["toy_code"]}
    config["tables"] = {"main": {"style": "spa", "methods": ["llada-confidence", "spa"]}}
    config["analyses"] = {
        "shadow": [{"methods": ["archer-kinf"], "tasks": ["toy_code"]}],
        "intervention": [{"methods": ["archer-kinf"], "tasks": ["toy_arith"]}],
        "drift": [{"methods": ["llada-confidence"], "tasks": ["toy_code"], "rank": 8}]}
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    dry = job_counts(warm_snakemake(tmp_path, "-n", configfile=path).stdout)
    monkeypatch.chdir(REPO)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert planned(out) == {k: v for k, v in dry.items() if v}
    assert {"train_toy", "svd", "merge_generations", "tables", "shadow_probe", "score_branch",
            "drift_profile"} <= set(planned(out))


def test_parameters_are_the_native_models():
    """The plan's parameter count equals the model's own, for both families and the toy."""
    from dlmpipe.backbones.model import Backbone, BackboneConfig
    from dlmpipe.backbones.shipped import read_record

    for family, bias in (("llada", False), ("dream", True)):
        cfg = BackboneConfig(family, 64, 3, 4, 2, 96, 300, 10000.0, 1e-6, bias, 0)
        with torch.device("meta"):
            model = Backbone(cfg)
        assert plan.parameters(64, 3, 4, 2, 96, 300, bias) == sum(p.numel() for p in model.parameters())
    for tied in (False, True):  # SDAR's layout: a head width of its own, per-head q/k norms
        cfg = BackboneConfig("sdar", 64, 3, 4, 2, 96, 300, 10000.0, 1e-6, False, 0, attn_head_dim=32,
                             qk_norm=True, tie_embeddings=tied, block_size=4)
        with torch.device("meta"):
            model = Backbone(cfg)
        assert plan.parameters(64, 3, 4, 2, 96, 300, False, 32, True, tied) == sum(
            p.numel() for p in model.parameters())
    record = read_record("toy")  # train_toy counted its own model
    o = record["options"]
    assert plan.parameters(o["d_model"], o["n_layers"], o["n_heads"], o["n_heads"], o["mlp_hidden"],
                           plan.TOY_VOCABULARY, False) == record["stats"]["parameters"]
    campaign = load_campaign([REPO / "configs" / "archer.yaml"], check_paths=False)
    sizes = {b: plan.backbone_size(campaign, b).parameters for b in campaign.backbones}
    assert 8.0e9 < sizes["llada-8b-instruct"] < 8.1e9  # LLaDA-8B
    assert 7.6e9 < sizes["dream-v0-instruct-7b"] == sizes["diffucoder-7b-cpgrpo"] < 7.7e9  # Qwen2.5-7B


def test_the_cost_model_covers_every_method_and_its_exact_settings_cost_full_recompute():
    """Every registered sampler and cache has a cost model; at the settings where a cache equals
    full recompute (the exactness table's) it costs what full recompute costs, and every other
    setting costs no more."""
    assert set(cost.SAMPLER_ASSUMPTIONS) == set(registry.SAMPLERS)
    assert set(cost.CACHE_ASSUMPTIONS) == set(registry.CACHES)
    exact = {n: c.exact for n, c in registry.CACHES.items()}  # each entry's declared setting
    for s in registry.SAMPLERS:
        sampler = {"name": s, **({"block_length": 32} if "block_length" in
                                 registry.SAMPLERS[s].params else {})}
        full = cost.decode_cost(registry.bind_method(
            {"gen_length": 64, "sampler": sampler, "cache": {"name": "none"}}, None), 100)
        assert full.rows == pytest.approx(full.updates * (164 + (32 if s == "wino" else 0)))
        for c, params in exact.items():
            if registry.pairing_problem(s, c):
                continue
            for spec in ({"name": c, **params}, {"name": c}):
                d = cost.decode_cost(registry.bind_method(
                    {"gen_length": 64, "sampler": sampler, "cache": spec}, None), 100)
                assert d.updates == full.updates
                assert d.rows <= full.rows + 1e-9, (s, spec)
                if spec != {"name": c} or c == "none":
                    assert d.rows == pytest.approx(full.rows), (s, spec)


def test_task_sizes_match_the_data_where_it_is_here():
    """The known sizes the plan uses equal the loaders' rows on every data file present."""
    from dlmpipe.tasks.benchmarks import BENCHMARKS
    from dlmpipe.tasks.registry import task_rows

    checked = 0
    for name, bench in BENCHMARKS.items():
        if name == "local":
            continue  # no released file: its size is its file's (test_local_dataset.py)
        rows = bench.size({})
        try:
            loaded = load_task(name)
        except (FileNotFoundError, ValueError, ModuleNotFoundError):
            continue  # its data is not here
        checked += 1
        assert len(loaded) == rows == task_rows(name, {}), name
        if bench.subtask_rows:
            counts = {}
            for r in loaded:
                counts[r["subtask"]] = counts.get(r["subtask"], 0) + 1
            default = bench.subtask_rows.get("*")
            assert counts == {s: bench.subtask_rows.get(s, default) for s in counts}, name
    if not checked:
        pytest.skip("no benchmark data here")
    assert task_rows("toy_code", {}) == 40 and task_rows("mbpp", {"limit": 150}) == 150
