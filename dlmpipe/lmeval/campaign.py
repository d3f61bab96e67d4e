"""An lm-eval task in a campaign: ``benchmark: lm_eval`` (docs/CAMPAIGNS.md, docs/SCORING.md).

``load_lm_eval`` (the task loader, registered in dlmpipe/tasks/registry.py) writes one task row
per doc: the prompt lm-eval builds for it (``doc_to_text``, few-shot exemplars by its sampler and
seed, description, delimiters), dlmpipe's answer kind and reference where it scores that
benchmark (``rules.py``; otherwise kind ``lm_eval``: no dlmpipe verdict), and the ``lm_eval``
column (JSON: the task, its options, the doc id, lm-eval's stop strings, the metric) from which
the score job rebuilds the task. ``lm_eval_verdicts`` (the score job) gives each completion, cut
at lm-eval's stop strings as its models cut it, lm-eval's own verdict (its filters, then
``process_results``, exactly as its evaluator runs them) and dlmpipe's (extraction), both on
that text. The response length is the campaign task's ``gen_length``, not lm-eval's
``max_gen_toks``: a diffusion decoder fills a fixed number of positions.

lm-eval is imported inside the functions only: the registry imports this module.
"""
from __future__ import annotations

import json

#: a task row's kind when dlmpipe has no rule for the lm-eval task (only lm-eval's verdict)
NO_RULE = "lm_eval"
COLUMN = "lm_eval"  # the task-file column (docs/ARCHITECTURE.md, optional task columns)


def load_lm_eval(lm_eval_task: str, num_fewshot: int | None = None, dataset_path: str | None = None,
                 dataset_kwargs: dict | None = None, lm_eval_metric: str | None = None,
                 fewshot_seed: int | None = None, limit: int | None = None) -> list[dict]:
    """Task rows of lm-eval task ``lm_eval_task`` (a generate_until task), reading local data
    where ``dataset_path``/``dataset_kwargs`` say (lm-eval's task keys, dlmpipe/lmeval/tasks.py).
    ``lm_eval_metric``: ``metric,filter`` of the verdict (default: the task's first filter and
    first metric, the first row of lm-eval's table). ``limit``: the first ``limit`` docs' rows
    only (the task's ``limit``, passed by the registry), their requests built as lm-eval's
    evaluator builds them under its ``--limit`` (docs in order, few-shot exemplars drawn doc by
    doc: the same rows as the first of all, without building every doc's request: GSM8K's 1,319
    2-shot requests ~2.6 CPU s)."""
    from .rules import dlmpipe_rule
    from .tasks import load_task

    options = {"num_fewshot": num_fewshot, "dataset_path": dataset_path,
               "dataset_kwargs": _absolute_files(dataset_kwargs), "fewshot_seed": fewshot_seed}
    task = load_task(lm_eval_task, **options)
    metric = primary_metric(task, lm_eval_metric)
    task.build_all_requests(limit=limit)
    rows = []
    for inst in sorted(task.instances, key=lambda i: i.doc_id):
        context, gen_kwargs = inst.args
        until = gen_kwargs.get("until") or []
        rule = dlmpipe_rule(lm_eval_task, inst.doc) or {"kind": NO_RULE,
                                                        "answer": str(task.doc_to_target(inst.doc))}
        rows.append({"task_id": f"{lm_eval_task}/{inst.doc_id}", "prompt": context,
                     "code_prefix": "", "test": "", "entry_point": "", **rule,
                     COLUMN: json.dumps({"task": lm_eval_task, "doc_id": inst.doc_id,
                                         "options": options, "metric": metric,
                                         "until": [until] if isinstance(until, str) else until})})
    return rows


def missing_files(options: dict) -> list[str]:
    """The local data files a task's ``dataset_kwargs.data_files`` names that do not exist (the
    campaign's check before any job)."""
    from pathlib import Path

    files = (options.get("dataset_kwargs") or {}).get("data_files") or {}
    files = list(files.values()) if isinstance(files, dict) else [files]
    flat = [f for item in files for f in (item if isinstance(item, list) else [item])]
    return [str(Path(str(f)).expanduser().absolute()) for f in flat
            if not Path(str(f)).expanduser().is_file()]


def _absolute_files(dataset_kwargs: dict | None) -> dict | None:
    """``dataset_kwargs`` with its data files as absolute paths (the score job rebuilds the
    task from them, wherever it runs)."""
    if not dataset_kwargs or not dataset_kwargs.get("data_files"):
        return dataset_kwargs
    from .tasks import _absolute

    files = dataset_kwargs["data_files"]
    files = ({s: _absolute(f) for s, f in files.items()} if isinstance(files, dict)
             else {"test": _absolute(files)})
    return {**dataset_kwargs, "data_files": files}


def primary_metric(task, chosen: str | None = None) -> str:
    """``metric,filter`` of the verdict: ``chosen`` or the first filter's first metric; refused
    unless the task generates text and the metric is a mean over docs (a per-doc verdict)."""
    from lm_eval.api.metrics import mean

    from .verdicts import LOGLIKELIHOOD_REFUSAL

    name = task.config.task
    if task.OUTPUT_TYPE != "generate_until":
        raise ValueError(f"lm-eval task {name!r} is {task.OUTPUT_TYPE}, not generate_until: "
                         f"{LOGLIKELIHOOD_REFUSAL}")
    filters = [f.name for f in getattr(task, "_filters", [])] or ["none"]
    metrics = list(task.aggregation())
    available = [f"{m},{f}" for f in filters for m in metrics]
    metric = chosen or available[0]
    if metric not in available:
        raise ValueError(f"lm_eval_metric {metric!r}: lm-eval task {name!r} has "
                         f"{', '.join(available)}")
    if task.aggregation()[metric.split(",")[0]] is not mean:
        raise ValueError(f"lm-eval task {name!r}: {metric} is not a mean over docs, so it gives "
                         "no per-sample verdict; choose another lm_eval_metric")
    return metric


def lm_eval_verdicts(rows: list[dict], completions: list[str]) -> list[dict]:
    """The score columns of each (task row, completion): lm-eval's verdict (``lm_eval_score``
    of the row's metric, ``lm_eval_metric``, ``lm_eval_metrics``: every filter's metrics and
    filtered answer, JSON), which is also the row's ``score``/``passed`` (the task is lm-eval's
    definition), and dlmpipe's (``dlmpipe_passed`` with ``extracted``/``extraction_rule``; None
    without a rule), both on the completion cut at lm-eval's stop strings."""
    from ..scoring.answers import check_answer
    from .verdicts import _cut
    from .tasks import load_task

    specs = [json.loads(r[COLUMN]) for r in rows]
    texts = [_cut(c or "", s["until"]) for c, s in zip(completions, specs)]
    out: list[dict] = [{} for _ in rows]
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(specs):
        groups.setdefault(json.dumps([s["task"], s["options"]], sort_keys=True), []).append(i)
    for members in groups.values():
        spec = specs[members[0]]
        task = load_task(spec["task"], **spec["options"])
        ids = sorted({specs[i]["doc_id"] for i in members})
        task.build_all_requests(samples=ids)  # lm-eval numbers the selected docs 0, 1, ...
        by_doc = {ids[inst.doc_id]: inst for inst in task.instances}
        for i in members:
            by_doc[specs[i]["doc_id"]].resps = [texts[i]]
        task.apply_filters()
        for i in members:
            inst = by_doc[specs[i]["doc_id"]]
            per = {}
            for key, filtered in inst.filtered_resps.items():
                for metric, value in task.process_results(inst.doc, [filtered]).items():
                    per[f"{metric},{key}"] = {"value": float(value), "answer": str(filtered)}
            metric = specs[i]["metric"]
            score = per[metric]["value"]
            out[i] = {"passed": score == 1.0, "score": score,
                      "status": "passed" if score == 1.0 else "failed",
                      "detail": f"lm-eval {metric} {score:g} on {per[metric]['answer']!r}"[:200],
                      "isolation": "none", "lm_eval_score": score, "lm_eval_metric": metric,
                      "lm_eval_metrics": json.dumps(per, sort_keys=True),
                      "dlmpipe_passed": None, "extracted": None, "extraction_rule": None}
    for i, row in enumerate(rows):
        if row.get("kind") != NO_RULE:
            v = check_answer(row, texts[i])
            out[i].update(dlmpipe_passed=v.passed, extracted=v.extracted, extraction_rule=v.rule)
    return out

