"""The summary table: one row per (backbone, task, method), columns per docs/ARCHITECTURE.md.

Every speed figure (speedup against a named reference method on the same backbone and task,
latency, TPS, TTFT, percentiles, throughput) comes from the timing stage's paired, interleaved
measurements, on one clock (``speedup.py``), so the times of a row and its speedup agree. The
generate jobs' own times are their cost (``job_time_s``, decoded in batches beside other jobs),
never a method's speed; summarized without timing files (a quick look outside the workflow) the
speedup is the ratio of those job times, without an interval, and the speed columns are empty. Quality carries its binomial standard error and a
95% Wilson interval. The Pareto flag is computed within each (backbone, task) on the point
estimates; ``overlaps_front`` marks the other methods whose error bars reach the front.
Every row names the environment (dlmpipe/environment.py) its numbers come from: speedups whose
timing mixes environments are refused, qualities whose samples do are flagged
(``fingerprint_warning``).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ..environment import COLUMNS as ENVIRONMENT_COLUMNS
from ..environment import FIELDS as ENVIRONMENT_FIELDS
from ..io import atomic_write
from .isolation import isolation_levels
from .pareto import pareto_mask, reaches_front
from .speedup import SPEED_COLUMNS, timed_measures, timing_fingerprints

KEYS = ["backbone", "task", "method"]
Z95 = 1.959963984540054  # standard normal quantile of 0.975
SUMMARY_COLUMNS = KEYS + ["quality", "quality_se", "quality_ci_low", "quality_ci_high", "n",
                          "job_time_s", "mean_generated_length", "mean_nfe", "mean_steps",
                          "mean_refreshes", "cached_fraction", "mean_recompute_fraction",
                          "mean_revisions", "speedup", "speedup_ci_low", "speedup_ci_high",
                          "timed_samples", "reference",
                          # the timing stage's, on the reference run's clock (speedup.py)
                          *SPEED_COLUMNS, "pareto", "overlaps_front",
                          # the environment (dlmpipe/environment.py) of the generation rows the
                          # quality comes from, the one the speedup was timed in, and a warning
                          # where the generation rows mix environments (empty: none)
                          *ENVIRONMENT_COLUMNS, "timing_fingerprint", "fingerprint_warning"]
# per-sample measurements of the generate job that are not times (docs/METHODS.md §3); scores
# written before they existed lack them, and their means are then empty
MEASUREMENTS = {"generated_length": "mean_generated_length"}
OPTIONAL = [*MEASUREMENTS,
            "plus_passed",  # extended (EvalPlus "+", ET) tests, where the task has them
            "stats",  # per-sample statistics (JSON): mean_recompute_fraction reads them
            "isolation",  # the sandbox level of each score: the summary lists each row's levels
            "subtask", "extraction_rule",  # answer tasks: quality_by_subtask, verdicts_by_rule
            "lm_eval_score", "lm_eval_metric", "dlmpipe_passed",  # lm-eval tasks: by_origin
            *ENVIRONMENT_COLUMNS]  # the environment each sample was decoded in
NEEDED = KEYS + ["sample_index", "score", "job_time_s", "nfe", "steps", "refreshes",
                 "cached_forwards", "revisions"]


def recompute_fraction(stats) -> float:
    """A sample's mean fraction of response rows recomputed per layer (``recompute_fraction``,
    recorded by the selective caches, SPA-Cache and dLLM-Cache); NaN where not recorded."""
    if not isinstance(stats, str) or not stats:
        return math.nan
    value = json.loads(stats).get("recompute_fraction")
    return math.nan if value is None else float(value)


def read_scores(paths: list[str | Path]) -> pd.DataFrame:
    frames = []
    for p in paths:
        df = pd.read_parquet(p)
        if "time_s" in df.columns and "job_time_s" not in df.columns:  # written before the rename
            df = df.rename(columns={"time_s": "job_time_s"})
        missing = [c for c in NEEDED if c not in df.columns]
        if missing:
            raise ValueError(f"{p}: scores table lacks column(s) {', '.join(missing)}")
        frames.append(df[NEEDED + [c for c in OPTIONAL if c in df.columns]])
    if not frames:
        raise ValueError("no scores files given")
    scores = pd.concat(frames, ignore_index=True)
    dup = scores.duplicated(KEYS + ["sample_index"])
    if dup.any():
        first = scores.loc[dup, KEYS + ["sample_index"]].iloc[0].tolist()
        raise ValueError(f"sample scored twice: (backbone, task, method, sample_index) = {first}")
    return scores


def quality_uncertainty(table: pd.DataFrame) -> pd.DataFrame:
    """``quality_se`` = sqrt(p(1-p)/n) (binomial standard error of a mean of 0/1 scores) and
    the 95% Wilson score interval ``quality_ci_low``/``quality_ci_high``, which stays inside
    [0, 1] and does not collapse to a point at p = 0 or 1 as p +- 1.96 SE would."""
    p, n = table["quality"].astype(float), table["n"].astype(float)
    z2 = Z95 ** 2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * np.sqrt(p * (1 - p) / n + z2 / (4 * n ** 2)) / (1 + z2 / n)
    return table.assign(quality_se=np.sqrt(p * (1 - p) / n),
                        quality_ci_low=(centre - half).clip(lower=0.0).where(p > 0, 0.0),
                        quality_ci_high=(centre + half).clip(upper=1.0).where(p < 1, 1.0))


def measurement_means(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (backbone, task, method) the mean over samples of each per-sample measurement
    (``mean_generated_length``); NaN where the scores lack it."""
    g = scores.assign(**{c: scores[c] if c in scores.columns else math.nan for c in MEASUREMENTS}
                      ).groupby(KEYS, sort=False)
    return pd.DataFrame({mean: g[c].mean() for c, mean in MEASUREMENTS.items()}).reset_index()


UNRECORDED = "unrecorded"  # rows written before fingerprints were recorded


def _fingerprints(scores: pd.DataFrame) -> pd.Series:
    """Each row's fingerprint; ``unrecorded`` where the row has none."""
    if "fingerprint" not in scores.columns:
        return pd.Series(UNRECORDED, index=scores.index)
    return scores["fingerprint"].fillna("").replace("", UNRECORDED)


def environments(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (backbone, task, method) the environment its generation rows were decoded in: each
    field's distinct values (`` | ``-joined, in fingerprint order, where shards differ), the
    fingerprints, and ``fingerprint_warning`` where there are several. A quality over samples
    decoded on different machines or software is informative but suspect (their tokens may
    differ for the same sample), so it is flagged, not refused; empty where nothing was
    recorded."""
    scores = scores.assign(_fp=_fingerprints(scores))
    rows = []
    for key, part in scores.groupby(KEYS, sort=False):
        counts = part["_fp"].value_counts().sort_index()
        recorded = part[part["_fp"] != UNRECORDED]
        firsts = recorded.groupby("_fp", sort=True).first()
        row = dict(zip(KEYS, key))
        for f in ENVIRONMENT_FIELDS:
            values = firsts[f].fillna("").astype(str).tolist() if f in firsts.columns else []
            row[f] = " | ".join(dict.fromkeys(values))
        row["fingerprint"] = ", ".join(counts.index) if len(recorded) else ""
        row["fingerprint_warning"] = "" if len(counts) < 2 else (
            f"quality mixes {len(counts)} environments: "
            + ", ".join(f"{fp} ({n} samples)" for fp, n in counts.items()))
        rows.append(row)
    return pd.DataFrame(rows, columns=KEYS + [*ENVIRONMENT_COLUMNS, "fingerprint_warning"])


def check_untimed_environments(scores: pd.DataFrame, reference: str) -> None:
    """Without the timing stage a speedup divides mean times of separate generate jobs: refuse
    it where a method's rows and the reference's were decoded in different environments."""
    if "fingerprint" not in scores.columns:
        return
    scores = scores.assign(_fp=_fingerprints(scores))
    for (backbone, task), part in scores.groupby(["backbone", "task"], sort=False):
        ref = set(part.loc[part["method"] == reference, "_fp"])
        for method, rows in part.groupby("method", sort=False):
            seen = ref | set(rows["_fp"])
            if len(seen) > 1:
                raise ValueError(
                    f"{backbone}/{task}: the speedup of {method!r} over {reference!r} would "
                    f"divide times from different environments ({', '.join(sorted(seen))}); "
                    "time them together (the timing stage) or decode them in one environment")


def timed_speedups(table: pd.DataFrame, timing: pd.DataFrame, reference: str,
                   also_against: list[str] = (), seed: int = 0) -> pd.DataFrame:
    """The speed columns from the timing stage (``speedup.timed_measures``): ``speedup`` (+
    ``_ci_low``/``_ci_high``) over the reference, ``speedup_vs_<other>`` (+ interval) for each of
    ``also_against``, latency, TPS, TTFT and percentiles; every summarized method must have
    been timed."""
    fingerprints = timing_fingerprints(timing)  # raises where a (backbone, task) mixes them
    timed = timing[["backbone", "task", "method"]].drop_duplicates()
    lacking = table[KEYS].merge(timed, on=KEYS, how="left", indicator=True)
    lacking = lacking[lacking["_merge"] == "left_only"]
    if len(lacking):
        names = ", ".join("/".join(r) for r in lacking[KEYS].itertuples(index=False))
        raise ValueError(f"no timing for {names}; the timing stage must time every method")
    measured = timed_measures(timing, reference, also_against, seed).rename(columns={
        "ci_low": "speedup_ci_low", "ci_high": "speedup_ci_high", "samples": "timed_samples"})
    table = table.drop(columns=[c for c in measured.columns if c in table.columns and c not in KEYS])
    return table.merge(measured, on=KEYS, how="left").merge(fingerprints, on=KEYS, how="left")


#: from the timing stage's rows (dlmpipe/timing.py), appended after the speedups when present
THROUGHPUT_COLUMNS = ["batch_size", "throughput_tps", "throughput_sps", "peak_memory_mb_b1",
                      "peak_memory_mb_batch"]


def throughput(timing: pd.DataFrame) -> pd.DataFrame | None:
    """Per (backbone, task, method): the throughput pass's batch size, response tokens (G per
    sample) and samples per second of its wall time (in the method's own run; a batched pass
    has no paired reference, so these are the run's own clock); peak memory at batch 1 and at
    the batch size. None for timing files without the pass (older format)."""
    if "pass" not in timing.columns:
        return None
    rows = []
    for key, g in timing.groupby(KEYS, sort=False):
        lat, thr = g[g["pass"] == "latency"], g[g["pass"] == "throughput"]
        wall = thr["pass_s"].iloc[0] if len(thr) else math.nan
        tokens = thr["token_ids"].map(len).sum() if len(thr) else 0
        rows.append(dict(zip(KEYS, key)) | {
            "batch_size": int(thr["batch_size"].iloc[0]) if len(thr) else pd.NA,
            "throughput_tps": tokens / wall if len(thr) else math.nan,
            "throughput_sps": len(thr) / wall if len(thr) else math.nan,
            "peak_memory_mb_b1": float(lat["peak_memory_mb"].max()) if len(lat) else math.nan,
            "peak_memory_mb_batch": float(thr["peak_memory_mb"].max()) if len(thr) else math.nan})
    out = pd.DataFrame(rows, columns=KEYS + THROUGHPUT_COLUMNS)
    out["batch_size"] = out["batch_size"].astype("Int64")
    return out


def front_flags(table: pd.DataFrame) -> pd.DataFrame:
    """Per (backbone, task): ``pareto`` on (quality, speedup) point estimates, and
    ``overlaps_front`` for the methods off the front whose error bars (quality + SE, the upper
    end of the speedup interval) reach it."""
    table = table.assign(pareto=False, overlaps_front=False)
    for _, idx in table.groupby(["backbone", "task"], sort=False).groups.items():
        part = table.loc[idx]
        on = pareto_mask(part["quality"].tolist(), part["speedup"].tolist())
        q_hi = (part["quality"] + part["quality_se"]).tolist()
        s_hi = part["speedup_ci_high"].fillna(part["speedup"]).tolist()
        near = reaches_front(part["quality"].tolist(), part["speedup"].tolist(), q_hi, s_hi)
        table.loc[idx, "pareto"] = on
        table.loc[idx, "overlaps_front"] = [n and not o for n, o in zip(near, on)]
    table["pareto"] = table["pareto"].astype(bool)
    table["overlaps_front"] = table["overlaps_front"].astype(bool)
    return table


def summary_table(scores: pd.DataFrame, reference: str, also_against: list[str] = (),
                  timing: pd.DataFrame | None = None, seed: int = 0) -> pd.DataFrame:
    """Aggregate per-sample scores; raise when a (backbone, task) lacks the reference method.

    ``also_against`` adds ``speedup_vs_<method>`` columns (empty where that method is absent).
    With ``timing`` (the timing stage's measurements) every speedup column is the paired median
    ratio with its bootstrap interval (seeded by ``seed``); without it, a ratio of mean times.
    """
    scores = scores.assign(recompute_fraction=scores["stats"].map(recompute_fraction)
                           if "stats" in scores.columns else math.nan)
    g = scores.groupby(KEYS, sort=False)
    table = pd.DataFrame({
        "quality": g["score"].mean(),
        "n": g["score"].size(),
        "job_time_s": g["job_time_s"].mean(),  # the generate job's cost per sample, not a speed
        "mean_nfe": g["nfe"].mean(),
        "mean_steps": g["steps"].mean(),
        "mean_refreshes": g["refreshes"].mean(),
        "cached_fraction": g["cached_forwards"].sum() / g["nfe"].sum().where(lambda s: s > 0),
        "mean_recompute_fraction": g["recompute_fraction"].mean(),
        "mean_revisions": g["revisions"].mean(),
    }).reset_index().merge(measurement_means(scores), on=KEYS)
    if "plus_passed" in scores.columns:  # quality on the extended tests (HumanEval+, MBPP+, ET)
        plus = scores.assign(plus=scores["plus_passed"].astype("float")).groupby(KEYS, sort=False)["plus"].mean()
        table = table.merge(plus.rename("quality_plus").reset_index(), on=KEYS, how="left")
    ref = table.loc[table["method"] == reference, ["backbone", "task", "job_time_s"]]
    lacking = (table[["backbone", "task"]].drop_duplicates()
               .merge(ref, on=["backbone", "task"], how="left"))
    lacking = lacking[lacking["job_time_s"].isna()]
    if len(lacking):
        pairs = ", ".join(f"{b}/{t}" for b, t in lacking[["backbone", "task"]].itertuples(index=False))
        raise ValueError(f"reference method {reference!r} has no scores for {pairs}; "
                         f"speedups need it on every backbone and task")
    table = table.merge(ref.rename(columns={"job_time_s": "reference_time_s"}),
                        on=["backbone", "task"])
    table["speedup"] = table["reference_time_s"] / table["job_time_s"]
    table = table.drop(columns="reference_time_s")
    table["reference"] = reference
    extra = ["quality_plus"] if "quality_plus" in table.columns else []
    if "isolation" in scores.columns:  # e.g. "bwrap", "none", "process+landlock+seccomp"
        table = table.merge(isolation_levels(scores, KEYS), on=KEYS, how="left")
        extra.append("isolation")
    for column, per_group in (("quality_by_subtask", quality_by_subtask),
                              ("verdicts_by_rule", verdicts_by_rule)):
        if (values := per_group(scores)) is not None:
            table = table.merge(values.rename(column).reset_index(), on=KEYS, how="left")
            extra.append(column)
    if (origins := verdicts_by_origin(scores)) is not None:
        table = table.merge(origins, on=KEYS, how="left")
        extra += list(origins.columns[len(KEYS):])
    table = table.merge(environments(scores), on=KEYS, how="left")
    if timing is not None:
        table = timed_speedups(table, timing, reference, also_against, seed)
        extra += [f"speedup_vs_{o}{end}" for o in also_against for end in ("", "_ci_low", "_ci_high")]
        if (batched := throughput(timing)) is not None:
            table = table.merge(batched, on=KEYS, how="left")
            extra += THROUGHPUT_COLUMNS
    else:
        check_untimed_environments(scores, reference)
        table = table.assign(speedup_ci_low=math.nan, speedup_ci_high=math.nan, timed_samples=0,
                             timing_fingerprint="", **{c: math.nan for c in SPEED_COLUMNS})
        for other in also_against:
            col = f"speedup_vs_{other}"
            times = table.loc[table["method"] == other, ["backbone", "task", "job_time_s"]]
            table = table.merge(times.rename(columns={"job_time_s": "other_time_s"}),
                                on=["backbone", "task"], how="left")
            table[col] = table["other_time_s"] / table["job_time_s"]
            table = table.drop(columns="other_time_s")
            extra.append(col)
    table = front_flags(quality_uncertainty(table))
    table["n"] = table["n"].astype("int64")
    table["timed_samples"] = table["timed_samples"].fillna(0).astype("int64")
    table["timing_fingerprint"] = table["timing_fingerprint"].fillna("")
    return table[SUMMARY_COLUMNS + extra].sort_values(KEYS[:2], kind="stable").reset_index(drop=True)


def quality_by_subtask(scores: pd.DataFrame) -> pd.Series | None:
    """Per (backbone, task, method), JSON ``{subtask: accuracy}`` (BBH's tasks, MMLU-Pro's
    categories); None when no task has subtasks."""
    if "subtask" not in scores.columns or not scores["subtask"].notna().any():
        return None
    return scores.groupby(KEYS, sort=False).apply(
        lambda g: json.dumps({str(k): round(float(v), 6) for k, v in
                              g.dropna(subset=["subtask"]).groupby("subtask")["score"].mean().items()}),
        include_groups=False)


def verdicts_by_rule(scores: pd.DataFrame) -> pd.Series | None:
    """Per (backbone, task, method), JSON ``{extraction rule: {"passed": n, "failed": m}}``: how
    many verdicts each answer-extraction rule produced; None when no task records rules."""
    if "extraction_rule" not in scores.columns or not scores["extraction_rule"].notna().any():
        return None

    def counts(g: pd.DataFrame) -> str:
        out: dict[str, dict[str, int]] = {}
        for rule, score in zip(g["extraction_rule"].fillna("none"), g["score"]):
            entry = out.setdefault(str(rule), {"passed": 0, "failed": 0})
            entry["passed" if score > 0 else "failed"] += 1
        return json.dumps(out, sort_keys=True)

    return scores.groupby(KEYS, sort=False).apply(counts, include_groups=False)


def verdicts_by_origin(scores: pd.DataFrame) -> pd.DataFrame | None:
    """lm-eval tasks (benchmark lm_eval; docs/SCORING.md): per (backbone, task, method) the
    quality by each origin's verdict, ``quality_lm_eval`` (lm-eval's metric, named in
    ``lm_eval_metric``) and ``quality_dlmpipe`` (dlmpipe's extraction, over the samples it has
    a rule for; empty without one), and ``verdicts_differ``, the samples where both judged and
    disagree; None when no task is an lm-eval task."""
    if "lm_eval_score" not in scores.columns or not scores["lm_eval_score"].notna().any():
        return None
    own = (scores["dlmpipe_passed"].map(lambda v: math.nan if v is None or pd.isna(v) else float(v))
           if "dlmpipe_passed" in scores.columns else pd.Series(math.nan, index=scores.index))
    lm = scores["lm_eval_score"].astype(float)
    frame = scores[KEYS].assign(lm=lm, own=own.astype(float),
                                differ=own.notna() & lm.notna() & (own != (lm == 1.0)))
    g = frame.groupby(KEYS, sort=False)
    out = pd.DataFrame({"quality_lm_eval": g["lm"].mean(),
                        "quality_dlmpipe": g["own"].mean(),
                        "verdicts_differ": g["differ"].sum().astype("int64")}).reset_index()
    metric = scores.groupby(KEYS, sort=False)["lm_eval_metric"].first().rename("lm_eval_metric")
    out = out.merge(metric.reset_index(), on=KEYS, how="left")
    return out[KEYS + ["quality_lm_eval", "lm_eval_metric", "quality_dlmpipe", "verdicts_differ"]]


def summarize(scores: list[str], reference: str, out_parquet: str, out_csv: str,
              also_against: list[str] = (), timing: list[str] = (), seed: int = 0) -> pd.DataFrame:
    from .speedup import read_timing

    table = summary_table(read_scores(scores), reference, also_against,
                          read_timing(timing) if timing else None, seed)
    atomic_write(out_parquet, lambda p: table.to_parquet(p, index=False))
    atomic_write(out_csv, lambda p: table.to_csv(p, index=False, float_format="%.6g"))
    for row in table[table["fingerprint_warning"] != ""].itertuples():
        print(f"warning: {row.backbone}/{row.task}/{row.method}: {row.fingerprint_warning}",
              file=sys.stderr, flush=True)
    return table
