"""lm-evaluation-harness, both ways (dlmpipe/lmeval/; docs/SCORING.md "lm-evaluation-harness"):
a dlmpipe method as lm-eval's model (Python API and ``python -m dlmpipe lm-eval``) and an lm-eval
task in a campaign, whose verdicts, computed by dlmpipe's score stage, equal lm-eval's own on the
same completions. Offline: the local GSM8K and BBH files of ../shared/data, the shipped toy."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# lm-eval reads its data through `datasets`, which reads these when it is imported: never the hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dlmpipe.tasks.sources import data_dirs  # noqa: E402

from .workflow import REPO  # noqa: E402


def _data(name: str):
    for d in data_dirs():
        if (d / name).exists():
            return d / name
    pytest.skip(f"{name} not in $DLMPIPE_DATA_DIR or ../shared/data")


@pytest.fixture(scope="module")
def gsm8k():
    return {"dataset_kwargs": {"data_files": {"test": str(_data("gsm8k_test.jsonl"))}}}


@pytest.fixture(scope="module")
def gsm8k_rows(gsm8k) -> list[dict]:
    """The first three task rows of zero-shot GSM8K, for the tests that read them (``limit``:
    only their requests built, as lm-eval's evaluator does; that they are the first rows of all:
    test_gsm8k_exact_match_through_dlmpipe_equals_lm_evals_own)."""
    from dlmpipe.lmeval.campaign import load_lm_eval

    return load_lm_eval("gsm8k", num_fewshot=0, limit=3, **gsm8k)


@pytest.fixture(scope="module")
def date_understanding():
    return {"dataset_kwargs": {"data_files": {"test": str(_data("bbh") / "date_understanding.json")},
                               "field": "examples"}}


def _evaluate(model, task, limit: int, **kwargs) -> dict:
    """lm-eval's own evaluation of ``task`` (a Task object) with per-sample logs. Without the
    environment report lm-eval adds to its results (``add_env_info``: torch's collect_env,
    git; ~0.4 s of CPU a call), which these tests never read; the command's test keeps it."""
    from unittest import mock

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # an empty task index: the Task is given (lm-eval would index its 14,000 tasks, ~25 s)
    with mock.patch("lm_eval.evaluator.add_env_info", lambda results: None):
        return simple_evaluate(model=model, tasks=[task], limit=limit, log_samples=True,
                               task_manager=TaskManager(include_defaults=False), **kwargs)


def _lm_eval_verdicts(results: dict, task: str) -> dict[int, dict[str, float]]:
    """doc id -> {"metric,filter": value} from lm-eval's logged samples."""
    out: dict[int, dict[str, float]] = {}
    for s in results["samples"][task]:
        for metric in s["metrics"]:
            out.setdefault(s["doc_id"], {})[f"{metric},{s['filter']}"] = float(s[metric])
    return out


class Fixed:
    """An lm-eval model answering each doc with a given text (the same completions for lm-eval's
    evaluator and dlmpipe's score stage)."""

    def __new__(cls, answers):
        from lm_eval.api.model import LM

        class _Fixed(LM):
            def generate_until(self, requests, disable_tqdm=False):
                return [answers[r.doc_id] for r in requests]

            def loglikelihood(self, requests):
                raise NotImplementedError

            def loglikelihood_rolling(self, requests):
                raise NotImplementedError

        return _Fixed()


def _through_dlmpipe(rows: list[dict], completions: list[str]) -> dict[int, dict[str, float]]:
    """doc id -> {"metric,filter": value} from dlmpipe's score stage (lm_eval_verdicts)."""
    from dlmpipe.lmeval.campaign import lm_eval_verdicts

    out = {}
    for row, verdict in zip(rows, lm_eval_verdicts(rows, completions)):
        doc = json.loads(row["lm_eval"])["doc_id"]
        out[doc] = {k: v["value"] for k, v in json.loads(verdict["lm_eval_metrics"]).items()}
    return out


GSM8K_STYLES = [  # the first docs' answers are 18, 3, 70000, 540, 20, 64
    "She sells 9 eggs for $2 each.\n#### 18",       # strict and flexible
    "It takes 2 + 1 = 3 bolts. The answer is 3.",   # flexible only
    "The profit is $70,000.\n#### 70,000",          # thousands separators
    "#### 541",                                      # wrong
    "",                                              # nothing
    "so 64 glasses\n#### $64.",                      # the currency and the final period
]


def test_gsm8k_exact_match_through_dlmpipe_equals_lm_evals_own(gsm8k, tmp_path):
    """The score stage's lm-eval verdicts (lm_eval_verdicts: the task rebuilt from the task
    row, lm-eval's filters and process_results) equal lm-eval's evaluator's, filter by filter,
    on the same completions; the campaign's prompts are lm-eval's, and a limit gives the first
    rows of all."""
    from dlmpipe.lmeval.campaign import lm_eval_verdicts, load_lm_eval
    from dlmpipe.lmeval.tasks import load_task

    n = len(GSM8K_STYLES)
    results = _evaluate(Fixed(GSM8K_STYLES), load_task("gsm8k", num_fewshot=2, **gsm8k), n,
                        num_fewshot=2)
    own = _lm_eval_verdicts(results, "gsm8k")
    rows = load_lm_eval("gsm8k", num_fewshot=2, limit=n, **gsm8k)
    assert _through_dlmpipe(rows, GSM8K_STYLES) == own
    assert [own[i]["exact_match,strict-match"] for i in range(n)] == [1, 0, 1, 0, 0, 0]
    assert [own[i]["exact_match,flexible-extract"] for i in range(n)] == [1, 1, 1, 0, 0, 1]
    # dlmpipe's rules read "The answer is 3." and "#### $64." too (docs/SCORING.md)
    assert [v["dlmpipe_passed"] for v in lm_eval_verdicts(rows, GSM8K_STYLES)] == \
        [True, True, True, False, False, True]
    # prompts: lm-eval's contexts (2-shot, exemplars by its sampler and seed)
    contexts = {s["doc_id"]: s["arguments"][0][0] for s in results["samples"]["gsm8k"]}
    assert [r["prompt"] for r in rows] == [contexts[i] for i in range(n)]
    assert rows[0]["prompt"].count("Question:") == 3 and rows[0]["kind"] == "math"
    # a limit (the task's, load_lm_eval's) builds only the first docs' requests: the same rows
    # as the first of all (shown on the file's first 20 docs, all of whose requests are cheap)
    head = tmp_path / "gsm8k_head.jsonl"
    with open(gsm8k["dataset_kwargs"]["data_files"]["test"]) as f:
        head.write_text("".join(f.readlines()[:20]))
    small = {"dataset_kwargs": {"data_files": {"test": str(head)}}}
    assert load_lm_eval("gsm8k", num_fewshot=2, limit=n, **small) == \
        load_lm_eval("gsm8k", num_fewshot=2, **small)[:n]


def test_a_multiple_choice_set_both_verdicts_and_where_they_differ(date_understanding):
    """BBH date understanding (bbh_cot_fewshot): lm-eval's get-answer regex and exact match
    against "(B)", dlmpipe's choice rule against the letter; a bare letter is right for dlmpipe
    and wrong for lm-eval, and the scores say so."""
    from dlmpipe.lmeval.campaign import lm_eval_verdicts, load_lm_eval
    from dlmpipe.lmeval.tasks import load_task

    name = "bbh_cot_fewshot_date_understanding"
    rows = load_lm_eval(name, **date_understanding)[:3]
    assert [r["answer"] for r in rows] == ["B", "A", "B"] and rows[0]["kind"] == "choice"
    answers = ["... So the answer is (B).", "So the answer is A.", "So the answer is (D)."]
    task = load_task(name, **date_understanding)
    assert _through_dlmpipe(rows, answers) == _lm_eval_verdicts(_evaluate(Fixed(answers), task, 3), name)
    verdicts = lm_eval_verdicts(rows, answers)
    assert [v["lm_eval_score"] for v in verdicts] == [1.0, 0.0, 0.0]
    assert [v["dlmpipe_passed"] for v in verdicts] == [True, True, False]
    assert [v["passed"] for v in verdicts] == [True, False, False]  # the task's: lm-eval's
    assert verdicts[1]["extraction_rule"] == "answer is" and verdicts[1]["extracted"] == "A"


def test_dlmpipe_methods_as_lm_eval_models_on_local_gsm8k(gsm8k, gsm8k_rows):
    """simple_evaluate(model=DlmpipeLM(...)) with two methods of config.yaml on the shipped toy:
    lm-eval's results, the speed beside them, and the completions it decoded judged by dlmpipe's
    score stage exactly as lm-eval judged them."""
    from dlmpipe.lmeval.model import DlmpipeLM, speed_table
    from dlmpipe.lmeval.tasks import load_task

    rows = gsm8k_rows
    for method, batch in (("llada-confidence", 1), ("fast-dllm-dual", 3)):
        lm = DlmpipeLM(checkpoint="shipped:toy", method=method, config=str(REPO / "config.yaml"),
                       gen_length=32, batch_size=batch, device="cpu")
        results = _evaluate(lm, load_task("gsm8k", num_fewshot=0, **gsm8k), 3, num_fewshot=0)
        assert set(results["results"]["gsm8k"]) >= {"exact_match,strict-match",
                                                   "exact_match,flexible-extract"}
        speed = lm.speed()
        assert speed["samples"] == 3 and speed["batch_size"] == batch and speed["wall_s"] > 0
        assert speed["mean_nfe"] == 32 and speed["tokens_per_s"] > 0  # one token per step
        assert method in speed_table([speed])
        completions = {s["doc_id"]: s["resps"][0][0] for s in results["samples"]["gsm8k"]}
        assert _through_dlmpipe(rows, [completions[i] for i in range(3)]) == \
            _lm_eval_verdicts(results, "gsm8k")


def test_a_task_is_found_by_its_own_yaml_and_a_group_is_not_a_task():
    """lm-eval's YAMLs write ``task: name`` or ``"task": "name"`` (BBH's generated ones)."""
    from dlmpipe.lmeval.tasks import local_override, task_yaml

    assert task_yaml("gsm8k").name == "gsm8k.yaml"
    assert task_yaml("bbh_zeroshot_date_understanding").parent.name == "zeroshot"
    with pytest.raises(ValueError, match="not a group"):
        local_override("bbh_zeroshot", dataset_kwargs={"data_files": {"test": __file__}})


def test_loglikelihood_is_refused_saying_why():
    from dlmpipe.lmeval.campaign import primary_metric  # noqa: F401  (the campaign says the same)
    from dlmpipe.lmeval.model import DlmpipeLM

    lm = DlmpipeLM(checkpoint="shipped:toy", sampler="llada_confidence", device="cpu")
    for request in (lm.loglikelihood, lm.loglikelihood_rolling):
        with pytest.raises(NotImplementedError, match="no left-to-right factorization"):
            request([])


def test_chat_template_is_the_checkpoints_and_its_family_takes_one_turn():
    from dlmpipe.lmeval.model import DlmpipeLM

    lm = DlmpipeLM(checkpoint="shipped:toy", sampler="llada_confidence", device="cpu")
    text = lm.apply_chat_template([{"role": "user", "content": "2+2?"}])
    assert text.startswith("<|startoftext|><|start_header_id|>user") and text.endswith(
        "assistant<|end_header_id|>\n\n")
    with pytest.raises(ValueError, match="--fewshot_as_multiturn false"):
        lm.apply_chat_template([{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"},
                                {"role": "user", "content": "3"}])


def test_a_campaign_task_names_an_lm_eval_task_and_the_summary_has_both_verdicts(tmp_path, gsm8k):
    """``benchmark: lm_eval`` validates, and its jobs (prepare-task with the campaign's options,
    generate, score, summarize) give every score both verdicts and the summary a column each.
    The job commands run in this process (``dlmpipe.cli.main``, as ``python -m dlmpipe`` runs
    them): the property is what they write, not the process boundary (a job's own process:
    tests/test_generate_job.py; the score stage without torch: the last test here)."""
    import pandas as pd

    from dlmpipe.campaign import Campaign
    from dlmpipe.cli import main as cli

    config = {"backbones": {"toy": {"shipped": "toy"}}, "reference_method": "ref",
              "tasks": {"gsm8k-lm": {"benchmark": "lm_eval", "lm_eval_task": "gsm8k",
                                     "num_fewshot": 0, **gsm8k, "limit": 3, "gen_length": 32}},
              "methods": {"ref": {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}}}}
    campaign = Campaign(config)

    def run(*args: str) -> None:
        assert cli(list(args)) == 0, args
    run("prepare-backbone", "--path", str(campaign.checkpoint_path("toy")), "--name", "toy",
        "--out", str(tmp_path / "manifest.json"))
    run("prepare-task", "--name", campaign.benchmark("gsm8k-lm"), "--options",
        json.dumps(campaign.task_options("gsm8k-lm")), "--out", str(tmp_path / "gsm8k-lm.parquet"))
    run("generate", "--manifest", str(tmp_path / "manifest.json"), "--task-file",
        str(tmp_path / "gsm8k-lm.parquet"), "--method",
        json.dumps(campaign.method("ref", "gsm8k-lm", "toy")), "--out", str(tmp_path / "g.parquet"),
        "--provenance", str(tmp_path / "g.json"), "--device", "cpu", "--batch-size", "3")
    run("score", "--generations", str(tmp_path / "g.parquet"), "--task-file",
        str(tmp_path / "gsm8k-lm.parquet"), "--out", str(tmp_path / "s.parquet"))
    scores = pd.read_parquet(tmp_path / "s.parquet")
    assert scores["lm_eval_metric"].tolist() == ["exact_match,strict-match"] * 3
    assert scores["dlmpipe_passed"].notna().all() and scores["extraction_rule"].notna().all()
    assert (scores["score"] == scores["lm_eval_score"]).all()
    run("summarize", "--scores", str(tmp_path / "s.parquet"), "--reference", "ref",
        "--out-parquet", str(tmp_path / "summary.parquet"), "--out-csv", str(tmp_path / "summary.csv"))
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert {"quality_lm_eval", "lm_eval_metric", "quality_dlmpipe", "verdicts_differ"} <= set(summary)
    assert summary.loc[0, "quality_lm_eval"] == summary.loc[0, "quality"]


def test_the_lm_eval_command_runs_gsm8k_offline_and_prints_the_speed(gsm8k, monkeypatch, capsys):
    """``python -m dlmpipe lm-eval``: lm-eval's own flags, the model dlmpipe by default, local
    data by --dataset_kwargs; lm-eval's table, then the speed table. The command runs in this
    process (``dlmpipe.cli.main``, as ``python -m dlmpipe`` runs it, in the repository root),
    where lm-eval and torch are already imported; its speed table shows only the models this
    command made."""
    from dlmpipe.cli import main as cli
    from dlmpipe.lmeval import model

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(model, "CREATED", [])
    code = cli(["lm-eval", "--model_args",
                "checkpoint=shipped:toy,method=fast-dllm-dual,config=config.yaml,gen_length=32",
                "--tasks", "gsm8k", "--num_fewshot", "0", "--limit", "2", "--batch_size", "2",
                "--device", "cpu", "--dataset_kwargs", f"gsm8k={json.dumps(gsm8k['dataset_kwargs'])}"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert len(model.CREATED) == 1
    table, speed = out.out.split("dlmpipe speed", 1)
    assert "|gsm8k|" in table and "strict-match" in table and "flexible-extract" in table
    assert "|fast-dllm-dual|" in speed and "|cpu|2|2|" in speed


def test_dlmpipe_runs_without_lm_eval():
    """Only dlmpipe/lmeval/ imports lm_eval, and only when asked: every other module imports
    without it, the campaign checks and ``--help`` work, and the command says how to install it."""
    code = """
import importlib, pkgutil, sys
sys.modules["lm_eval"] = None  # importing it fails, as where the extra is not installed
import dlmpipe
failed = []
for m in pkgutil.walk_packages(dlmpipe.__path__, "dlmpipe."):
    if m.name == "dlmpipe.lmeval.model" or m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except Exception as e:
        failed.append((m.name, repr(e)))
print([f for f in failed if "lm_eval" in f[1]])
from dlmpipe.cli import main
sys.exit(main(["lm-eval", "--tasks", "gsm8k"]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
    assert out.returncode == 2 and "pip install 'dlmpipe[lm-eval]'" in out.stderr


def test_a_missing_local_data_file_stops_the_campaign_before_any_job(tmp_path):
    from dlmpipe.campaign import Campaign, ConfigError

    missing = tmp_path / "gsm8k_test.jsonl"
    config = {"backbones": {"toy": {"shipped": "toy"}}, "reference_method": "ref",
              "tasks": {"gsm8k-lm": {"benchmark": "lm_eval", "lm_eval_task": "gsm8k", "gen_length": 32,
                                     "dataset_kwargs": {"data_files": {"test": str(missing)}}}},
              "methods": {"ref": {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}}}}
    with pytest.raises(ConfigError, match=f"tasks.gsm8k-lm.dataset_kwargs.data_files: data file "
                                          f"not found: {missing}"):
        Campaign(config)


def test_the_score_stages_lm_eval_verdicts_import_no_torch(gsm8k_rows):
    """The score stage never imports torch (docs/SCORING.md): nor do lm-eval's verdicts. Their
    process gets the task rows as the score job does, made elsewhere (by the prepare-task job
    there; here by this process)."""
    code = f"""
import sys
from dlmpipe.lmeval.campaign import lm_eval_verdicts
rows = {gsm8k_rows[:2]!r}
verdicts = lm_eval_verdicts(rows, ["#### 18", "3"])
print([v["lm_eval_score"] for v in verdicts], "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.split("\n")[-2] == "[1.0, 0.0] False", out.stdout + out.stderr[-2000:]
