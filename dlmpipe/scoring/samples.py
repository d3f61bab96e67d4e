"""``dlmpipe score-samples``: score external EvalPlus-style samples against a registered task.

Input rows are ``{"task_id", "solution"}`` (a self-contained program, EvalPlus's convention) or
``{"task_id", "completion"}`` (continues the task's ``code_prefix``, e.g. the HumanEval prompt);
math/exact tasks take ``completion`` (or ``solution``) as the model's answer text. Output rows
repeat the input and add per-suite outcomes (``base_status``/``base_passed``, ``plus_status``/
``plus_passed`` where the task has extended tests), ``passed``, the ``isolation`` level and, for
answer tasks, ``extracted`` and ``extraction_rule``. The pass@1 summary (mean over tasks of the
fraction of passing samples) goes to stdout, closed by a warning when any sample ran under a level
weaker than bubblewrap (levels.py).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ..io import atomic_write_text
from ..tasks.registry import load_task
from .code import Settings
from .levels import level_caveats, weaker_than_bwrap
from .score import score_many

SCORER_OPTIONS = ("time_limit", "min_input_time", "time_factor", "case_time_limit",
                  "load_time_limit", "limits")


def read_samples(path: str | Path, known: dict[str, dict]) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: not JSON ({e})") from None
            if not isinstance(row, dict) or "task_id" not in row or not (
                    "solution" in row or "completion" in row):
                raise ValueError(f"{path}: line {n}: needs task_id and solution or completion")
            if str(row["task_id"]) not in known:
                raise ValueError(f"{path}: line {n}: unknown task id {row['task_id']!r}")
            rows.append(row)
    return rows


def pass_at_1(rows: list[dict], key: str) -> tuple[float, int]:
    """Mean over tasks of each task's fraction of passing samples (pass@1 with n samples)."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        if r.get(key) is not None:
            by_task[str(r["task_id"])].append(bool(r[key]))
    if not by_task:
        return float("nan"), 0
    return sum(sum(v) / len(v) for v in by_task.values()) / len(by_task), len(by_task)


def score_samples(task: str, samples: str | Path, out: str | Path, workers: int = 0,
                  options: dict | None = None, sandbox: str | None = None) -> list[dict]:
    options = dict(options or {})
    settings = Settings.from_options({k: options.pop(k) for k in SCORER_OPTIONS if k in options})
    tasks = {r["task_id"]: r for r in load_task(task, **options)}
    rows = read_samples(samples, tasks)
    pairs = []
    for r in rows:
        row = tasks[str(r["task_id"])]
        text = r["solution"] if "solution" in r else r["completion"]
        # external samples never saw our response_prefix
        pairs.append(({**row, "response_prefix": ""}, text or ""))
    results = score_many(pairs, workers, settings, progress=f"score-samples {task}",
                         sandbox=sandbox)

    scored = []
    for r, res in zip(rows, results):
        out_row = {**r, "base_status": res["status"], "base_passed": res["passed"],
                   "passed": res["passed"], "detail": res["detail"], "isolation": res["isolation"]}
        if res.get("plus_status") is not None:
            out_row.update(plus_status=res["plus_status"], plus_passed=res["plus_passed"])
        if "extraction_rule" in res:
            out_row.update(extracted=res["extracted"], extraction_rule=res["extraction_rule"])
        scored.append(out_row)

    atomic_write_text(out, "".join(json.dumps(row) + "\n" for row in scored))
    print(summary(task, scored))
    return scored


def summary(task: str, scored: list[dict]) -> str:
    levels = sorted({r["isolation"] for r in scored})
    lines = [f"{task}: {len(scored)} samples, isolation: {', '.join(levels) or '-'}"]
    for label, key in (("base", "base_passed"), ("plus", "plus_passed")):
        value, n = pass_at_1(scored, key)
        if n:
            lines.append(f"pass@1 {label}: {100 * value:.2f}% ({n} tasks)")
    for level in levels:
        if weaker_than_bwrap(level):
            n = sum(r["isolation"] == level for r in scored)
            lines.append(f"WARNING: {n} of {len(scored)} samples ran under {level} isolation, "
                         f"weaker than bubblewrap: {level_caveats(level)} (docs/SCORING.md)")
    return "\n".join(lines)
