"""The analyses' tables (dlmpipe/analysis/shadow.py, intervention.py, drift.py): invariants of
the binning, the partial Spearman correlation against its regression definition, the paired
counts, the drift shares, and the reproduction check. No model involved."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dlmpipe.analysis.drift import drift_analysis, drift_layers
from dlmpipe.analysis.intervention import intervention_tables
from dlmpipe.analysis.shadow import (bin_label, correlations, distance_bins, partial_spearman,
                                     reproduction, spearman)


def _residual_partial(x, y, z) -> float:
    """Partial correlation by its definition: correlate the residuals of rank(x) and rank(y)
    after a least-squares fit on rank(z)."""
    r = [pd.Series(v).rank().to_numpy() for v in (x, y, z)]
    design = np.column_stack([np.ones_like(r[2]), r[2]])
    res = [v - design @ np.linalg.lstsq(design, v, rcond=None)[0] for v in r[:2]]
    return float(np.corrcoef(*res)[0, 1])


def test_partial_spearman_is_the_partial_correlation_of_ranks():
    rng = np.random.default_rng(0)
    for _ in range(20):
        z = rng.integers(0, 6, 200)
        x = z + rng.integers(0, 4, 200)
        y = (x + rng.normal(0, 2, 200) > 4).astype(int)  # ties, like action disagreement
        assert partial_spearman(x, y, z) == pytest.approx(_residual_partial(x, y, z), abs=1e-9)
    x = rng.normal(size=100)
    assert partial_spearman(x, x ** 3, rng.normal(size=100)) == pytest.approx(1, abs=0.02)
    assert spearman(x, np.exp(x)) == pytest.approx(1)
    assert math.isnan(partial_spearman(x, np.ones(100), rng.normal(size=100)))


def _probes(rows) -> pd.DataFrame:
    cols = ["sample_index", "cached", "anchor_distance", "cache_age", "action_differs",
            "accepted_differs", "tokens_differ", "remasked_differs", "next_state_distance",
            "logit_drift_max"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_distance_bins_count_every_probe_once():
    rng = np.random.default_rng(1)
    rows = []
    for i in range(300):
        d = int(rng.integers(0, 12))
        differs = bool(rng.random() < d / 12)
        rows.append((i % 7, bool(rng.random() < 0.8), d, int(rng.integers(1, 9)), differs,
                     differs, False, False, int(differs) * 2, 0.1 * d))
    probes = _probes(rows)
    bins = distance_bins(probes, [0, 1, 2, 4, 8])
    assert list(bins["distance_bin"]) == ["0", "1", "2-3", "4-7", ">=8"]
    assert bins["probes"].sum() == len(probes) and bins["cached"].sum() == probes["cached"].sum()
    top = probes[probes["anchor_distance"] >= 8]
    assert bins.iloc[-1]["action_disagreement"] == pytest.approx(top["action_differs"].mean())
    assert bins.iloc[2]["probes"] == probes["anchor_distance"].between(2, 3).sum()
    # edges need not start at 0: distance 0 still has its bin
    assert distance_bins(probes, [2, 4]).iloc[0]["distance_bin"] == "0-1"
    assert bin_label(4, None) == ">=4" and bin_label(3, 4) == "3"


def test_empty_bins_in_the_middle_count_zero_and_no_probes_gives_one_empty_bin():
    probes = _probes([(0, True, 0, 1, False, False, False, False, 0, 0.0),
                      (0, True, 9, 1, True, True, False, False, 3, 0.5)])
    bins = distance_bins(probes, [0, 1, 2, 4, 8])
    assert list(bins["probes"]) == [1, 0, 0, 0, 1]
    none = distance_bins(probes.iloc[:0])
    assert len(none) == 1 and none["probes"].iloc[0] == 0


def test_correlations_name_each_outcome():
    rng = np.random.default_rng(2)
    rows = [(0, i % 5 != 0, int(d), int(a), bool(d > 3), bool(d > 3), False, False, int(d // 2), a * 0.1)
            for i, (d, a) in enumerate(zip(rng.integers(0, 8, 200), rng.integers(1, 9, 200)))]
    table = correlations(_probes(rows))
    assert list(table["outcome"]) == ["action_differs", "next_state_distance", "logit_drift_max"]
    assert (table["probes"] == 200).all()
    row = table.set_index("outcome").loc["action_differs"]
    assert row["partial_distance_given_age"] > 0.5 and abs(row["partial_age_given_distance"]) < 0.2


def test_reproduction_flags_any_difference():
    main = pd.DataFrame({"sample_index": [0, 1], "task_id": ["a", "b"],
                         "token_ids": [[1, 2], [3, 4]], "completion": ["x", "y"], "steps": [2, 2],
                         "nfe": [2, 2], "refreshes": [0, 1], "cached_forwards": [1, 0],
                         "revisions": [0, 0]})
    same = reproduction(main.iloc[:1], main)
    assert same["reproduced"].all()
    changed = main.copy()
    changed.at[1, "nfe"] = 3
    table = reproduction(changed, main)
    assert list(table["reproduced"]) == [True, False] and not table.loc[1, "nfe"]
    assert not reproduction(main.assign(sample_index=[5, 6]), main)["reproduced"].any()


def test_intervention_tables_pair_the_branches():
    pairs = pd.DataFrame({
        "sample_index": range(6), "task_id": list("abcdef"),
        "branched": [True, True, True, True, True, False],
        "revised_at_fresh": [1, 1, None, 2, 1, None], "revised_at_cached": [1, 3, 1, None, 1, None],
        "steps_fresh": [5] * 6, "steps_cached": [6] * 6, "nfe_fresh": [5] * 6, "nfe_cached": [6] * 6,
        "confidence": [0.95] * 6, "same_completion": [True, False, False, False, False, None]})
    fresh = pd.DataFrame({"sample_index": range(5), "passed": [True, True, False, False, True],
                          "plus_passed": [True, False, False, False, True]})
    cached = pd.DataFrame({"sample_index": range(5), "passed": [True, False, True, False, True],
                           "plus_passed": [True, False, True, False, False]})
    table, paired = intervention_tables(pairs, fresh, cached)
    p = paired.iloc[0]
    assert (p["both_pass"], p["only_fresh"], p["only_cached"], p["neither"]) == (2, 1, 1, 1)
    assert p["both_pass"] + p["only_fresh"] + p["only_cached"] + p["neither"] == p["pairs"] == 5
    assert p["unbranched"] == 1 and p["same_completion"] == 1
    t = table.set_index("branch")
    assert t.loc["Fresh", "pass_at_1"] == pytest.approx(3 / 5)
    assert t.loc["Cached", "pass_at_1_plus"] == pytest.approx(2 / 5)
    assert t.loc["Fresh", "rev_at_follow"] == pytest.approx(4 / 5)
    assert t.loc["Cached", "mean_revision_update"] == pytest.approx(6 / 4)
    assert t.loc["Fresh", "only_pass"] == 1 and t.loc["Cached", "only_pass_plus"] == 1
    with pytest.raises(ValueError, match="cached branch scores lack samples"):
        intervention_tables(pairs, fresh, cached.iloc[:3])


def test_drift_layers_pool_tokens_and_the_figures_are_written(tmp_path):
    rows = []
    for update in (1, 2):
        for layer in range(3):
            for series in ("input", "proxy", "value", "ffn_output"):
                rows.append({"sample_index": 0, "task_id": "t", "update": update, "layer": layer,
                             "series": series, "mean_similarity": 0.9 - 0.1 * layer,
                             "min_similarity": 0.5, "drifting": layer + update, "tokens": 10})
    records = pd.DataFrame(rows)
    layers = drift_layers(records)
    assert len(layers) == 12 and list(layers["series"][:4]) == ["input", "proxy", "value", "ffn_output"]
    row = layers[(layers["layer"] == 2) & (layers["series"] == "value")].iloc[0]
    assert row["drifting_share"] == pytest.approx((3 + 4) / 20) and row["tokens"] == 20
    assert row["mean_similarity"] == pytest.approx(0.7)
    path = tmp_path / "records.parquet"
    records.to_parquet(path)
    out = [tmp_path / n for n in ("layers.csv", "similarity.png", "share.png")]
    drift_analysis(path, *out, label="toy")
    assert pd.read_csv(out[0]).shape[0] == 12
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out[1:])
