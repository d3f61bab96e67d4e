"""Every speed figure of a campaign from its timing stage (``dlmpipe.timing``): one clock.

A timing job times one method and the reference on the same samples, alternating, in one
process: the method's per-sample ratio is ratio_i = t_ref(i) / t_method(i), each time the median
over the repeats of that (method, sample). Pairing removes what samples share (prompt length,
how many steps the answer needs, the machine's state at that moment) from the comparison.

The runs of a (backbone, task)'s methods are separate jobs, perhaps beside different
neighbours, so their raw times are on different clocks. Every time is therefore expressed on one
clock, the reference's own run (the job that times the reference alone): a method's anchored
latency on sample i is T_ref(i) / ratio_i, with T_ref(i) the reference's time in its own run,
which is the method's measured time scaled by how much slower or faster the reference ran in the
method's run than in its own (``reference_drift``, reported beside it). The statistic over samples
is the geometric mean (the mean for ratios: the speedup of a over b times that of b over c is that
of a over c), so for every method ``latency_s`` of the reference / ``latency_s`` = ``speedup``
exactly, and the TPS and TTFT columns follow the same clock. The speedup's 95% interval is the
percentile bootstrap of the geometric mean, resampling samples (seeded, so the summary is
reproducible). A speedup against another method ``o`` chains through the reference on each
sample: ratio_i(method) / ratio_i(o).

Timing files of the earlier format (one job timing every method, no ``run`` column) are one run
on one clock: the same formulas give the same numbers with no drift.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

GROUP = ["backbone", "task"]
TIMING_NEEDED = GROUP + ["method", "sample_index", "repeat", "time_s"]
#: the per-method speed figures ``timed_measures`` returns (besides the speedups)
SPEED_COLUMNS = ["latency_s", "tps", "ttft_s", "latency_p50_s", "latency_p90_s",
                 "latency_measured_s", "reference_drift"]


def _check_columns(timing: pd.DataFrame) -> None:
    missing = [c for c in TIMING_NEEDED if c not in timing.columns]
    if missing:
        raise ValueError(f"timing table lacks column(s) {', '.join(missing)}")


def latency_rows(timing: pd.DataFrame) -> pd.DataFrame:
    """The batch-1 rows of the papers' protocol (``pass`` "latency"; files without the column
    hold only those), with ``run`` ("" for files of one run of every method); the throughput
    pass's rows are summarized apart (summary.throughput)."""
    _check_columns(timing)
    rows = timing[timing["pass"] == "latency"] if "pass" in timing.columns else timing
    run = rows["run"].fillna("") if "run" in rows.columns else pd.Series("", index=rows.index)
    return rows.assign(run=run, ttft_s=rows["ttft_s"] if "ttft_s" in rows.columns else np.nan)


def geometric_mean(values) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.exp(np.log(values).mean())) if values.size else float("nan")


def bootstrap_geomean_interval(ratios: np.ndarray, seed: int = 0, resamples: int = 4000,
                               level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the geometric mean of ``ratios``, resampling entries."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = logs[rng.integers(0, logs.size, (resamples, logs.size))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.exp(np.quantile(means, [alpha, 1 - alpha]))
    return float(lo), float(hi)


def paired_times(timing: pd.DataFrame, reference: str) -> pd.DataFrame:
    """One row per (backbone, task, method, sample) of every timed method: ``time_s`` and
    ``ttft_s`` (medians over repeats) in the method's run, ``reference_s`` (the reference's time
    in that run), ``anchor_s`` (the reference's in its own run), ``ratio`` (reference_s /
    time_s) and ``tokens`` (the response length G). Raises where a run lacks the reference or
    some of the anchor's samples: speedups must be paired."""
    rows = latency_rows(timing).assign(tokens=lambda t: t["token_ids"].map(len)
                                       if "token_ids" in t.columns else np.nan)
    med = (rows.groupby(GROUP + ["run", "method", "sample_index"], sort=False)
           [["time_s", "ttft_s", "tokens"]].median().reset_index())
    out = []
    for (backbone, task), part in med.groupby(GROUP, sort=False):
        subjects = part[(part["method"] == part["run"]) | (part["run"] == "")]
        if reference not in set(subjects["method"]):
            raise ValueError(f"timing of {backbone}/{task} has no method {reference!r} to measure "
                             f"speedups against (timed: {', '.join(dict.fromkeys(part['method']))})")
        ref_rows = part[part["method"] == reference]
        anchor_run = subjects.loc[subjects["method"] == reference, "run"].iloc[0]
        anchor = ref_rows[ref_rows["run"] == anchor_run].set_index("sample_index")["time_s"]
        for method, mine in subjects.groupby("method", sort=False):
            run = mine["run"].iloc[0]
            ref_here = ref_rows[ref_rows["run"] == run].set_index("sample_index")["time_s"]
            mine = mine.set_index("sample_index")
            if ref_here.empty:
                raise ValueError(f"timing of {backbone}/{task}/{method} has no run of the "
                                 f"reference {reference!r}: rerun its timing job")
            if set(mine.index) != set(anchor.index) or set(ref_here.index) != set(anchor.index):
                raise ValueError(f"timing of {backbone}/{task}: method {method} and the reference "
                                 "lack some of each other's timed samples; speedups must be "
                                 "paired (timing.samples changed? rerun the timing jobs)")
            ref_here = ref_here.loc[mine.index]
            out.append(pd.DataFrame({
                "backbone": backbone, "task": task, "method": method,
                "sample_index": mine.index, "time_s": mine["time_s"].to_numpy(),
                "ttft_s": mine["ttft_s"].to_numpy(), "tokens": mine["tokens"].to_numpy(),
                "reference_s": ref_here.to_numpy(), "anchor_s": anchor.loc[mine.index].to_numpy(),
                "ratio": (ref_here / mine["time_s"]).to_numpy()}))
    if not out:
        return pd.DataFrame(columns=GROUP + ["method", "sample_index", "time_s", "ttft_s", "tokens",
                                             "reference_s", "anchor_s", "ratio"])
    return pd.concat(out, ignore_index=True)


def timed_measures(timing: pd.DataFrame, reference: str, also_against: list[str] = (),
                   seed: int = 0, resamples: int = 4000, level: float = 0.95) -> pd.DataFrame:
    """One row per (backbone, task, method): ``speedup`` over the reference (geometric mean over
    samples of the paired ratios) with ``ci_low``/``ci_high`` and ``samples``;
    ``speedup_vs_<o>`` (+ interval) for each of ``also_against`` where ``o`` was timed; and the
    speed figures on the reference run's clock (module docstring): ``latency_s`` (geometric mean
    per-sample batch-1 latency), ``tps`` (response positions G per second at that latency),
    ``ttft_s`` (geometric mean time to first token), ``latency_p50_s``/``latency_p90_s`` (over
    samples), and, for the record, ``latency_measured_s`` (the same mean of the raw times) and
    ``reference_drift`` (the reference's time in this method's run over its own run's)."""
    paired = paired_times(timing, reference)
    rows = []
    for (backbone, task), part in paired.groupby(GROUP, sort=False):
        ratios = {m: g.set_index("sample_index")["ratio"] for m, g in part.groupby("method", sort=False)}
        for method, g in part.groupby("method", sort=False):
            clock = g["anchor_s"] / g["reference_s"]  # this run's times on the anchor's clock
            latency = g["time_s"] * clock
            lo, hi = bootstrap_geomean_interval(g["ratio"], seed, resamples, level)
            row = {"backbone": backbone, "task": task, "method": method,
                   "speedup": geometric_mean(g["ratio"]), "ci_low": lo, "ci_high": hi,
                   "samples": len(g), "latency_s": geometric_mean(latency),
                   "tps": float(g["tokens"].iloc[0]) / geometric_mean(latency),
                   "ttft_s": geometric_mean(g["ttft_s"] * clock),
                   "latency_p50_s": float(latency.quantile(0.5)),
                   "latency_p90_s": float(latency.quantile(0.9)),
                   "latency_measured_s": geometric_mean(g["time_s"]),
                   "reference_drift": geometric_mean(g["reference_s"] / g["anchor_s"])}
            mine = ratios[method]
            for other in also_against:
                col = f"speedup_vs_{other}"
                if other not in ratios:
                    row.update({col: np.nan, f"{col}_ci_low": np.nan, f"{col}_ci_high": np.nan})
                    continue
                chained = mine / ratios[other].loc[mine.index]
                lo, hi = bootstrap_geomean_interval(chained, seed, resamples, level)
                row.update({col: geometric_mean(chained), f"{col}_ci_low": lo, f"{col}_ci_high": hi})
            rows.append(row)
    columns = GROUP + ["method", "speedup", "ci_low", "ci_high", "samples", *SPEED_COLUMNS,
                       *(f"speedup_vs_{o}{e}" for o in also_against for e in ("", "_ci_low", "_ci_high"))]
    return pd.DataFrame(rows, columns=columns)


def timing_fingerprints(timing: pd.DataFrame) -> pd.DataFrame:
    """Per (backbone, task, method) the environment fingerprint it was timed in
    (``timing_fingerprint``; empty for timing written before fingerprints were recorded).

    Raises when the timing of one (backbone, task) mixes fingerprints: the timing stage times
    every method of a (backbone, task) in one process, so a mix means timing files of different
    runs (other machines, versions or thread counts), and a speedup of a method timed in one
    environment over a reference timed in another measures the environments, not the methods.
    The error names each fingerprint with its files (``source_file``, set by ``read_timing``)
    or methods."""
    fp = (timing["fingerprint"].fillna("") if "fingerprint" in timing.columns
          else pd.Series("", index=timing.index))
    timing = timing.assign(timing_fingerprint=fp.replace("", "unrecorded"))
    for (backbone, task), part in timing.groupby(GROUP, sort=False):
        seen = part.groupby("timing_fingerprint", sort=True)
        if len(seen) < 2:
            continue
        where = "source_file" if "source_file" in part.columns else "method"
        listed = "; ".join(f"{f}: {', '.join(map(str, dict.fromkeys(g[where])))}"
                           for f, g in seen)
        raise ValueError(f"timing of {backbone}/{task} mixes environment fingerprints ({listed}): "
                         "speedups need the reference and each method timed in one environment; "
                         "rerun the timing jobs of this backbone and task (snakemake --forcerun "
                         "time_method, or delete their files under timing/); on a cluster, "
                         "resources.generate.gpu_model keeps them on one kind of GPU")
    out = timing.groupby(GROUP + ["method"], sort=False)["timing_fingerprint"].first().reset_index()
    out["timing_fingerprint"] = out["timing_fingerprint"].replace("unrecorded", "")
    return out


def read_timing(paths) -> pd.DataFrame:
    """The timing files of a campaign, one table (each row's file in ``source_file``); a
    (backbone, task, method, sample, repeat) measured twice is an error (two files for one
    pair)."""
    frames = [pd.read_parquet(p).assign(source_file=str(p)) for p in paths]
    if not frames:
        raise ValueError("no timing files given")
    timing = pd.concat(frames, ignore_index=True)
    key = GROUP + [c for c in ("run", "pass") if c in timing.columns] + ["method", "sample_index", "repeat"]
    _check_columns(timing)
    dup = timing.duplicated(key)
    if dup.any():
        raise ValueError(f"timed twice: {timing.loc[dup, key].iloc[0].tolist()}")
    return timing
