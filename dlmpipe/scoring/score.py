"""The score stage: generations + task file -> scores parquet (docs/ARCHITECTURE.md contracts).

Runs in its own job, never in the generation process, and never imports torch. Code samples run
in parallel, one sandbox each (``workers`` at a time; a thread only waits on its sandbox's pipes,
the work happens in the sandboxed processes). The output is written to a temporary file and
renamed, so a killed job leaves either nothing or a complete file, and a rerun starts clean.
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from ..arrow import column, read_table
from ..arrow import read_rows as read_task_table  # no pandas (dlmpipe/arrow.py)
from ..io import atomic_write_parquet
from .answers import ANSWER_KINDS, check_answer
from .code import Settings, score_code
from .levels import isolation
from .sandbox import Isolation

SCORE_FIELDS = [("passed", pa.bool_()), ("score", pa.float64()), ("status", pa.string()),
                ("detail", pa.string()), ("isolation", pa.string())]
PLUS_FIELDS = [("plus_passed", pa.bool_()), ("plus_status", pa.string())]
ANSWER_FIELDS = [("extracted", pa.string()), ("extraction_rule", pa.string())]
SUBTASK_FIELDS = [("subtask", pa.string())]
# an lm-eval task (benchmark lm_eval): lm-eval's verdict and dlmpipe's (dlmpipe/lmeval/campaign.py)
LM_EVAL_FIELDS = [("lm_eval_score", pa.float64()), ("lm_eval_metric", pa.string()),
                  ("lm_eval_metrics", pa.string()), ("dlmpipe_passed", pa.bool_())]


def score_sample(task_row: dict, completion: str, settings: Settings,
                 iso: Isolation | None = None, share: bool = True) -> dict:
    """Score columns for one completion of one task row, whatever its kind (``share``: a code
    sample's reference outputs may serve later samples, code.run_code)."""
    kind = task_row.get("kind", "")
    if kind == "code":
        return score_code(task_row, completion, settings, iso, share)
    if kind not in ANSWER_KINDS:
        return {"passed": False, "score": 0.0, "status": "error",
                "detail": f"unknown task kind {kind!r}", "isolation": "none"}
    verdict = check_answer(task_row, completion)
    return {"passed": verdict.passed, "score": 1.0 if verdict.passed else 0.0,
            "status": "passed" if verdict.passed else "failed", "detail": verdict.detail,
            "isolation": "none", "extracted": verdict.extracted, "extraction_rule": verdict.rule}


def score_many(pairs: list[tuple[dict, str]], workers: int = 0, settings: Settings | None = None,
               progress: str = "", sandbox: str | None = None) -> list[dict]:
    """Score (task row, completion) pairs in parallel; results in input order.

    ``sandbox``: the isolation level for code (levels.py; default ``$DLMPIPE_SANDBOX`` or bwrap).
    It is chosen and checked before any program runs: ``SandboxUnavailable`` means none ran."""
    settings = settings or Settings()
    iso = isolation(sandbox) if any(row.get("kind") == "code" for row, _ in pairs) else None
    workers = workers or os.cpu_count() or 1
    results: list[dict] = [{}] * len(pairs)
    start, done = time.monotonic(), 0
    # a problem's reference outputs come back from its sandbox only where another sample of
    # the batch can use them (one sample per problem, e.g. greedy decoding: none ever would)
    suites = Counter(row.get(c) for row, _ in pairs for c in ("test", "plus_test") if row.get(c))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(score_sample, row, text, settings, iso,
                               any(suites[row.get(c)] > 1 for c in ("test", "plus_test")
                                   if row.get(c)))
                   for row, text in pairs]
        for i, fut in enumerate(futures):
            results[i] = fut.result()
            done += 1
            if progress and (done == len(pairs) or done % max(1, len(pairs) // 10) == 0):
                print(f"{progress}: scored {done}/{len(pairs)} in {time.monotonic() - start:.1f}s",
                      file=sys.stderr, flush=True)
    return results


def score_generations(generations_path: str | Path, task_file: str | Path, out: str | Path,
                      workers: int = 0, options: dict | None = None,
                      sandbox: str | None = None) -> None:
    """Write ``scores/{b}/{t}/{method}.parquet``: the generations columns plus ``passed``,
    ``score``, ``status``, ``detail``, ``isolation`` (and ``plus_passed``/``plus_status`` when the
    task has extended tests; ``extracted``/``extraction_rule`` for answer tasks; ``subtask`` when
    the task has subtasks). ``options``: time limits and resources (``Settings``); ``sandbox``:
    the isolation level (``score_many``)."""
    generations = read_table(generations_path)
    tasks = {r["task_id"]: r for r in read_task_table(task_file)}
    ids = generations.column("task_id").to_pylist()
    completions = generations.column("completion").to_pylist()
    unknown = sorted({t for t in ids if t not in tasks})
    if unknown:
        raise ValueError(f"{generations_path}: task ids not in {task_file}: {unknown[:5]}")
    pairs = [(tasks[t], c or "") for t, c in zip(ids, completions)]
    if any(r.get("lm_eval") for r in tasks.values()):  # two verdicts: lm-eval's, dlmpipe's
        from ..lmeval.campaign import lm_eval_verdicts

        results = lm_eval_verdicts([row for row, _ in pairs], completions)
        fields = SCORE_FIELDS + ANSWER_FIELDS + LM_EVAL_FIELDS
    else:
        results = score_many(pairs, workers, Settings.from_options(options),
                             progress=f"score {Path(generations_path).name}", sandbox=sandbox)
        fields = SCORE_FIELDS + (PLUS_FIELDS if any(r.get("plus_test") for r in tasks.values()) else [])
    if any(r.get("kind") in ANSWER_KINDS for r in tasks.values()) and ANSWER_FIELDS[0] not in fields:
        fields = fields + ANSWER_FIELDS
    if any(r.get("subtask") for r in tasks.values()):
        fields = fields + SUBTASK_FIELDS
        results = [{**res, "subtask": tasks[t].get("subtask") or None} for res, t in zip(results, ids)]
    table = generations.drop_columns([n for n, _ in fields if n in generations.column_names])
    for name, dtype in fields:
        table = table.append_column(pa.field(name, dtype),
                                    column([r.get(name) for r in results], dtype))
    atomic_write_parquet(out, table)
