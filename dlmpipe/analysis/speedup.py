"""Paired speedups from the timing stage (``dlmpipe.timing``): median ratio, bootstrap interval.

A method's speedup over a reference is summarized from per-sample ratios on the same samples,
timed interleaved in one process: ratio_i = t_ref(i) / t_method(i), each time the median over
the repeats of that (method, sample). The speedup is the median ratio over samples; its 95%
interval is the percentile bootstrap of that median, resampling samples (seeded, so the
summary is reproducible). Pairing removes what samples share (prompt length, how many steps the
answer needs, the machine's state at that moment) from the comparison.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

GROUP = ["backbone", "task"]
TIMING_NEEDED = GROUP + ["method", "sample_index", "repeat", "time_s"]


def _check_columns(timing: pd.DataFrame) -> None:
    missing = [c for c in TIMING_NEEDED if c not in timing.columns]
    if missing:
        raise ValueError(f"timing table lacks column(s) {', '.join(missing)}")


def latency_rows(timing: pd.DataFrame) -> pd.DataFrame:
    """The batch-1 rows of the papers' protocol (``pass`` "latency"; files without the column
    hold only those); the throughput pass's rows are summarized apart (summary.throughput)."""
    return timing[timing["pass"] == "latency"] if "pass" in timing.columns else timing


def per_sample_times(timing: pd.DataFrame) -> pd.DataFrame:
    """Median time over repeats per (backbone, task, method, sample): one column per method."""
    _check_columns(timing)
    timing = latency_rows(timing)
    med = timing.groupby(GROUP + ["method", "sample_index"], sort=False)["time_s"].median()
    return med.unstack("method")


def bootstrap_median_interval(ratios: np.ndarray, seed: int = 0, resamples: int = 4000,
                              level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``ratios``, resampling its entries."""
    ratios = np.asarray(ratios, dtype=float)
    if ratios.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    medians = np.median(ratios[rng.integers(0, ratios.size, (resamples, ratios.size))], axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(medians, [alpha, 1 - alpha])
    return float(lo), float(hi)


def paired_speedups(timing: pd.DataFrame, against: str, seed: int = 0, resamples: int = 4000,
                    level: float = 0.95, required: bool = True) -> pd.DataFrame:
    """One row per (backbone, task, method): ``speedup`` (median over samples of t_against /
    t_method), ``ci_low``, ``ci_high`` and ``samples`` (the paired samples). Raises when a
    method misses a timed sample, and when a (backbone, task) was timed without ``against``
    unless not ``required`` (then that pair has no rows)."""
    rows = []
    for (backbone, task), times in per_sample_times(timing).groupby(level=GROUP, sort=False):
        times = times.dropna(axis=1, how="all")
        if against not in times.columns:
            if not required:
                continue
            raise ValueError(f"timing of {backbone}/{task} has no method {against!r} to measure "
                             f"speedups against (timed: {', '.join(times.columns)})")
        incomplete = [m for m in times.columns if times[m].isna().any()]
        if incomplete:
            raise ValueError(f"timing of {backbone}/{task}: method(s) {', '.join(incomplete)} "
                             "lack some of the timed samples; speedups must be paired")
        for method in times.columns:
            ratios = (times[against] / times[method]).to_numpy()
            lo, hi = bootstrap_median_interval(ratios, seed, resamples, level)
            rows.append({"backbone": backbone, "task": task, "method": method,
                         "speedup": float(np.median(ratios)), "ci_low": lo, "ci_high": hi,
                         "samples": int(ratios.size)})
    return pd.DataFrame(rows, columns=GROUP + ["method", "speedup", "ci_low", "ci_high", "samples"])


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
                         "rerun the timing job of this backbone and task")
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
    key = GROUP + ["method", "sample_index", "repeat"] + (["pass"] if "pass" in timing.columns else [])
    _check_columns(timing)
    dup = timing.duplicated(key)
    if dup.any():
        raise ValueError(f"timed twice: {timing.loc[dup, key].iloc[0].tolist()}")
    return timing
