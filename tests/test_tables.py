"""Paper-style tables (dlmpipe/analysis/tables.py) rendered from a hand-made summary whose
numbers are chosen so every cell can be checked by hand."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from dlmpipe.analysis.table_spec import table_problems, table_rows
from dlmpipe.analysis.tables import archer_table, display_frame, spa_table, write_tables

BACKBONES = ["llada", "dream"]
TASKS = ["mbpp", "livecodebench", "humaneval"]
ORIGIN = {"llada-confidence": "llada-confidence", "saber": "saber", "archer-k8": "archer",
          "archer-k10": "archer", "archer-k11": "archer", "spa-r128": "spa"}
TIME = {"llada-confidence": 8.0, "saber": 4.0, "archer-k8": 2.0, "archer-k10": 1.6,
        "archer-k11": 1.0, "spa-r128": 4.0}
QUALITY = {"llada-confidence": 0.40, "saber": 0.42, "archer-k8": 0.44, "archer-k10": 0.46,
           "archer-k11": 0.48, "spa-r128": 0.40}
TOKENS = 100  # every sample generates 100 tokens: tps = 100 / latency_s


def hand_summary(intervals: bool = False) -> pd.DataFrame:
    rows = []
    for b_i, b in enumerate(BACKBONES):
        for t in TASKS:
            for m in ORIGIN:
                slow = 2.0 if b == "dream" else 1.0  # dream twice as slow everywhere
                q = QUALITY[m] + 0.1 * b_i
                rows.append({
                    "backbone": b, "task": t, "method": m, "quality": q, "n": 100,
                    "quality_se": math.sqrt(q * (1 - q) / 100),
                    "latency_s": TIME[m] * slow, "tps": TOKENS / (TIME[m] * slow),
                    "ttft_s": 0.028 * slow, "reference": "llada-confidence",
                    "speedup": 8.0 / TIME[m], "speedup_vs_saber": 4.0 / TIME[m],
                    # extended tests on the two EvalPlus-style tasks only, 10 points below base
                    "quality_plus": q - 0.1 if t != "livecodebench" else math.nan})
                if intervals:
                    rows[-1].update(speedup_ci_low=8.0 / TIME[m] - 0.5, speedup_ci_high=8.0 / TIME[m] + 0.5)
    return pd.DataFrame(rows)


ARCHER_POINTS = {"mbpp": "archer-k11", "livecodebench": "archer-k10", "humaneval": "archer-k8"}


def test_archer_table_operating_points_extended_tests_and_overall():
    spec = {"style": "archer", "extended_label": "ET", "operating_points": ARCHER_POINTS,
            "methods": ["llada-confidence", "saber", "archer"]}
    numbers, notes = archer_table(hand_summary(), spec, ORIGIN, BACKBONES, TASKS)
    assert numbers[["backbone", "method"]].values.tolist() == [
        [b, m] for b in BACKBONES for m in ("llada-confidence", "saber", "archer")]
    row = numbers.set_index(["backbone", "method"]).loc[("llada", "archer")]
    # each task shows its own point of the sweep
    assert row["mbpp base (%)"] == pytest.approx(48) and row["mbpp ET (%)"] == pytest.approx(38)
    assert row["livecodebench base (%)"] == pytest.approx(46)
    assert "livecodebench ET (%)" not in numbers.columns  # no extended tests there
    assert row["humaneval base (%)"] == pytest.approx(44) and row["humaneval ET (%)"] == pytest.approx(34)
    assert row["mbpp latency (s)"] == 1.0 and row["livecodebench latency (s)"] == 1.6
    assert row["mbpp speedup vs llada-confidence (x)"] == 8.0
    assert row["livecodebench speedup vs saber (x)"] == pytest.approx(2.5)
    # Overall: the mean of the five quality scores and of the three speedups
    assert row["overall quality (%)"] == pytest.approx((48 + 38 + 46 + 44 + 34) / 5)
    assert row["overall speedup vs llada-confidence (x)"] == pytest.approx((8 + 5 + 4) / 3)
    assert row["overall speedup vs saber (x)"] == pytest.approx((4 + 2.5 + 2) / 3)
    ref = numbers.set_index(["backbone", "method"]).loc[("dream", "llada-confidence")]
    assert ref["overall speedup vs llada-confidence (x)"] == 1.0 and ref["mbpp latency (s)"] == 16.0
    assert notes == [f"archer on {b}: mbpp: archer-k11, livecodebench: archer-k10, "
                     "humaneval: archer-k8" for b in BACKBONES]
    shown = display_frame(numbers, "archer").set_index(["backbone", "method"])
    assert shown.loc[("llada", "archer"), "mbpp speedup vs llada-confidence"] == "8.00×"
    assert shown.loc[("llada", "archer"), "overall quality (%)"] == "42.00"


def test_archer_table_without_points_lists_every_sweep_point():
    numbers, notes = archer_table(hand_summary(), {"style": "archer", "backbones": ["dream"],
                                                   "tasks": ["humaneval"]}, ORIGIN, BACKBONES, TASKS)
    assert numbers["method"].tolist() == list(ORIGIN) and set(numbers["backbone"]) == {"dream"}
    assert notes == [] and "mbpp base (%)" not in numbers.columns
    k10 = numbers.set_index("method").loc["archer-k10"]
    assert k10["humaneval latency (s)"] == pytest.approx(3.2)
    assert k10["overall quality (%)"] == pytest.approx((56 + 46) / 2)


def test_per_backbone_points_and_speedup_choice():
    """Archer's cross-backbone table: K per backbone and task, speedup against Saber only."""
    spec = {"style": "archer", "tasks": ["mbpp", "humaneval"], "methods": ["saber", "archer"],
            "speedup_against": ["saber"],
            "operating_points": {"mbpp": {"llada": "archer-k11", "dream": "archer-k10"},
                                 "humaneval": "archer-k8"}}
    numbers, notes = archer_table(hand_summary(), spec, ORIGIN, BACKBONES, TASKS)
    rows = numbers.set_index(["backbone", "method"])
    assert rows.loc[("dream", "archer"), "mbpp latency (s)"] == pytest.approx(3.2)
    assert rows.loc[("llada", "archer"), "mbpp latency (s)"] == 1.0
    assert not any("llada-confidence" in c for c in numbers.columns)
    assert rows.loc[("dream", "archer"), "overall speedup vs saber (x)"] == pytest.approx((2.5 + 2) / 2)
    assert notes[1] == "archer on dream: mbpp: archer-k10, humaneval: archer-k8"


def test_speedup_intervals_are_kept_and_shown_when_the_summary_has_them():
    numbers, _ = archer_table(hand_summary(intervals=True),
                              {"style": "archer", "tasks": ["mbpp"], "methods": ["archer-k8"]},
                              ORIGIN, BACKBONES, TASKS)
    assert numbers.loc[0, "mbpp speedup vs llada-confidence (x) ci_low"] == 3.5
    shown = display_frame(numbers, "archer")
    assert shown.loc[0, "mbpp speedup vs llada-confidence"] == "4.00× [3.50, 4.50]"
    assert shown.loc[0, "mbpp speedup vs saber"] == "2.00×"  # no interval for that column


def test_spa_table_tps_ttft_and_accuracy_with_standard_error():
    spec = {"style": "spa", "methods": ["llada-confidence", "spa-r128", "archer-k11"],
            "tasks": ["humaneval"]}
    numbers, notes = spa_table(hand_summary(), spec, ORIGIN, BACKBONES, TASKS)
    assert numbers[["task", "method"]].values.tolist() == [
        ["humaneval", m] for m in ("llada-confidence", "spa-r128", "archer-k11")]
    row = numbers.set_index("method").loc["archer-k11"]
    assert row["llada TPS"] == 100.0 and row["dream TPS"] == 50.0
    assert row["llada TPS vs llada-confidence (x)"] == 8.0
    assert row["dream TTFT (ms)"] == pytest.approx(56.0)
    assert row["llada accuracy (%)"] == pytest.approx(48)
    assert row["llada SE (%)"] == pytest.approx(100 * math.sqrt(0.48 * 0.52 / 100))
    shown = display_frame(numbers, "spa").set_index("method")
    assert shown.loc["archer-k11", "llada TPS"] == "100.00 (8.0×)"
    assert shown.loc["archer-k11", "llada accuracy (%)"] == "48.00 ± 5.00"
    assert shown.loc["llada-confidence", "dream TTFT (ms)"] == "56.0"
    assert not any("SE" in c or " vs " in c for c in shown.columns) and notes == []
    # TPS against another method (SPA-Cache's Dream rows: Dream's own vanilla decoding)
    numbers, _ = spa_table(hand_summary(), {**spec, "tps_against": "saber"}, ORIGIN, BACKBONES, TASKS)
    assert numbers.set_index("method").loc["archer-k11", "dream TPS vs saber (x)"] == 4.0



def test_spa_table_shows_throughput_and_batch_size_when_the_summary_has_them():
    summary = hand_summary().assign(throughput_tps=lambda d: 8 * d["tps"], batch_size=8)
    spec = {"style": "spa", "methods": ["llada-confidence", "archer-k11"], "tasks": ["humaneval"]}
    numbers, _ = spa_table(summary, spec, ORIGIN, BACKBONES, TASKS)
    row = numbers.set_index("method").loc["archer-k11"]
    assert row["llada throughput (tok/s)"] == 800.0 and row["llada batch"] == 8
    shown = display_frame(numbers, "spa").set_index("method")
    assert shown.loc["archer-k11", "dream batch"] == "8"
    assert shown.loc["archer-k11", "llada throughput (tok/s)"] == "800.00"
    assert "llada throughput (tok/s)" not in spa_table(hand_summary(), spec, ORIGIN, BACKBONES, TASKS)[0]


def test_write_tables_writes_csv_markdown_and_html(tmp_path):
    summary = tmp_path / "summary.parquet"
    hand_summary().to_parquet(summary)
    tables = {"archer": {"style": "archer", "extended_label": "ET",
                         "operating_points": ARCHER_POINTS, "methods": ["saber", "archer"]},
              "spa": {"style": "spa"}}
    written = write_tables(summary, tables, ORIGIN, BACKBONES, TASKS, tmp_path / "tables")
    assert sorted(p.name for p in written) == sorted(
        f"{n}.{s}" for n in tables for s in ("csv", "md", "html"))
    csv = pd.read_csv(tmp_path / "tables" / "archer.csv")
    assert len(csv) == 4 and csv.loc[1, "mbpp base (%)"] == pytest.approx(48)
    md = (tmp_path / "tables" / "archer.md").read_text()
    assert "| llada      | archer   |" in md and "archer on llada: mbpp: archer-k11" in md
    assert "| 48.00 " in md and "| 8.00× " in md  # formatted as printed, not re-parsed
    spa = (tmp_path / "tables" / "spa.md").read_text()
    assert len([line for line in spa.splitlines() if line.startswith("| ")]) == 1 + 3 * 6
    assert "| 28.0 " in spa and "| 48.00 ± 5.00 " in spa
    assert "<table" in (tmp_path / "tables" / "spa.html").read_text()


def test_a_row_missing_from_the_summary_is_named():
    summary = hand_summary()
    summary = summary[~((summary["method"] == "archer-k10") & (summary["backbone"] == "dream"))]
    with pytest.raises(ValueError, match="backbone 'dream', task 'livecodebench', method 'archer-k10'"):
        archer_table(summary, {"style": "archer", "operating_points": ARCHER_POINTS},
                     ORIGIN, BACKBONES, TASKS)


def test_rows_follow_methods_and_points():
    labels = [r.label for r in table_rows({"methods": ["archer", "saber", "archer-k8"]},
                                          ORIGIN, BACKBONES, TASKS)]
    assert labels == ["archer-k8", "archer-k10", "archer-k11", "saber", "archer-k8"]
    (row,) = table_rows({"methods": ["archer"], "operating_points": ARCHER_POINTS}, ORIGIN,
                        BACKBONES, TASKS)
    assert row.methods[("dream", "livecodebench")] == "archer-k10"


@pytest.mark.parametrize("spec, problem", [
    ({"methods": ["archer", "nope"]}, r"tables.t.methods\[1\]: 'nope' is neither a method"),
    ({"tasks": ["gsm8k"]}, r"tables.t.tasks\[0\]: 'gsm8k' is not one of the campaign's tasks"),
    ({"speedup_against": ["archer-k8"]}, r"tables.t.speedup_against\[0\]: 'archer-k8' has no speedup"),
    ({"operating_points": {"mbpp": "archer-k11"}},
     r"tables.t.operating_points.livecodebench: missing"),
    ({"operating_points": {**ARCHER_POINTS, "humaneval": {"llada": "archer-k8"}}},
     r"tables.t.operating_points.humaneval.dream: missing"),
    ({"operating_points": {**ARCHER_POINTS, "humaneval": "spa-r128"}},
     r"points of one swept base method per table, not of archer, spa"),
    ({"operating_points": {**ARCHER_POINTS, "gsm8k": "archer-k8"}},
     r"operating_points.gsm8k: 'gsm8k' is not a task of this table"),
    ({"operating_points": ARCHER_POINTS, "methods": ["saber", "archer-k8"]},
     r"not listed in tables.t.methods"),
    ({"operating_points": {**ARCHER_POINTS, "mbpp": "archer-k12"}},
     r"operating_points.mbpp: 'archer-k12' is not a method"),
    ({"tps_against": "archer"}, r"tables.t.tps_against: 'archer' is not a method"),
])
def test_spec_problems_name_their_key(spec, problem):
    problems = table_problems("t", {"style": "archer", **spec}, ORIGIN, BACKBONES, TASKS,
                              ["llada-confidence", "saber"])
    assert any(__import__("re").search(problem, p) for p in problems), problems


def test_a_valid_spec_has_no_problems():
    assert table_problems("t", {"style": "archer", "operating_points": ARCHER_POINTS,
                                "speedup_against": ["saber"]},
                          ORIGIN, BACKBONES, TASKS, ["llada-confidence", "saber"]) == []


def test_methods_that_do_not_run_everywhere_show_dashes_and_skip_empty_rows():
    # spa-r128 runs only on llada (its backbones:), and only on mbpp there (its tasks:)
    summary = hand_summary()
    summary = summary[(summary["method"] != "spa-r128")
                      | ((summary["backbone"] == "llada") & (summary["task"] == "mbpp"))]
    scope = {"spa": {"backbones": ["llada"], "tasks": ["mbpp"]}}
    spec = {"style": "archer", "methods": ["llada-confidence", "spa"]}
    numbers, _ = archer_table(summary, spec, ORIGIN, BACKBONES, TASKS, scope)
    assert numbers[["backbone", "method"]].values.tolist() == [
        ["llada", "llada-confidence"], ["llada", "spa-r128"], ["dream", "llada-confidence"]]
    spa = numbers.set_index(["backbone", "method"]).loc[("llada", "spa-r128")]
    assert spa["mbpp base (%)"] == pytest.approx(40) and math.isnan(spa["humaneval base (%)"])
    assert math.isnan(spa["overall quality (%)"])  # an Overall over fewer tasks would mislead
    shown = display_frame(numbers, "archer")
    assert shown.loc[1, "humaneval base (%)"] == "–" and shown.loc[1, "mbpp base (%)"] == "40.00"

    numbers, _ = spa_table(summary, {"style": "spa", "methods": ["llada-confidence", "spa"]},
                           ORIGIN, BACKBONES, TASKS, scope)
    assert numbers[["task", "method"]].values.tolist() == (
        [["mbpp", "llada-confidence"], ["mbpp", "spa-r128"]]
        + [[t, "llada-confidence"] for t in TASKS[1:]])
    row = numbers.set_index(["task", "method"]).loc[("mbpp", "spa-r128")]
    assert row["llada TPS"] == 25.0 and math.isnan(row["dream TPS"])
    assert row["llada TPS vs llada-confidence (x)"] == 2.0
    # where the scope says it runs, a missing row is still an error
    with pytest.raises(ValueError, match="backbone 'llada', task 'mbpp', method 'spa-r128'"):
        archer_table(summary[summary["method"] != "spa-r128"], spec, ORIGIN, BACKBONES, TASKS, scope)


# ---- the papers' reported numbers beside the measured ones ---------------------------------------
REPORTED = {  # row -> column -> the "paper's" value, chosen against hand_summary's numbers
    "llada": {"archer": {"mbpp base (%)": 47.0,           # measured 48: +1.00, within 2 points
                         "humaneval ET (%)": 37.5,         # measured 34: -3.50, outside
                         "mbpp latency (s)": 1.1,             # measured 1.0: -0.10, within 20%
                         "mbpp speedup vs saber (x)": 3.0,  # measured 4.0: +1.00, outside 15%
                         "overall quality (%)": 42.5},     # measured 42: -0.50, within
              "saber": {"livecodebench latency (s)": 4.0}},  # measured 4.0: 0, within
    "dream": {"archer": {"mbpp": {"base (%)": 58.0}}},     # nested column; measured 58: within
}
TOLERANCE = {"%": {"absolute": 2}, "s": {"relative": 0.2}, "x": {"relative": 0.15}}
REPORTED_SPEC = {"style": "archer", "extended_label": "ET", "operating_points": ARCHER_POINTS,
                 "methods": ["saber", "archer"], "speedup_against": ["llada-confidence", "saber"],
                 "reported": REPORTED, "tolerance": TOLERANCE}


def test_reported_cells_get_their_difference_and_a_flag_beyond_the_tolerance():
    from dlmpipe.analysis.tables import compare_reported, reproduction_summary

    numbers, _ = archer_table(hand_summary(), REPORTED_SPEC, ORIGIN, BACKBONES, TASKS)
    numbers, counts = compare_reported(numbers, REPORTED_SPEC)
    rows = numbers.set_index(["backbone", "method"])
    archer = rows.loc[("llada", "archer")]
    expect = {"mbpp base (%)": (47.0, 1.0, False), "humaneval ET (%)": (37.5, -3.5, True),
              "mbpp latency (s)": (1.1, -0.1, False), "mbpp speedup vs saber (x)": (3.0, 1.0, True),
              "overall quality (%)": (42.5, -0.5, False)}
    for col, (rep, diff, flag) in expect.items():
        assert archer[f"{col} reported"] == rep and archer[f"{col} diff"] == pytest.approx(diff), col
        assert archer[f"{col} flag"] is flag, col
    assert rows.loc[("dream", "archer"), "mbpp base (%) flag"] is False
    assert rows.loc[("llada", "saber"), "livecodebench latency (s) diff"] == 0
    # rows without a reported value in a reported column: empty, not flagged
    assert math.isnan(rows.loc[("dream", "saber"), "mbpp base (%) reported"])
    assert rows.loc[("dream", "saber"), "mbpp base (%) flag"] is None
    # the three columns follow the measured one
    cols = list(numbers.columns)
    i = cols.index("mbpp base (%)")
    assert cols[i + 1:i + 4] == ["mbpp base (%) reported", "mbpp base (%) diff", "mbpp base (%) flag"]
    assert counts == {"reported": 7, "compared": 7, "within": 5, "outside": 2, "unmeasured": 0}
    text = reproduction_summary(counts, REPORTED_SPEC)
    assert text.startswith("Reproduction: 7 of 7 reported cells compared, 5 within tolerance ✓, "
                           "2 outside ✗.")
    assert "±2 points" in text and "±20%" in text and "±15%" in text
    shown = display_frame(numbers, "archer").set_index(["backbone", "method"])
    assert shown.loc[("llada", "archer"), "mbpp base (%)"] == "48.00 (paper 47.00, +1.00 ✓)"
    assert shown.loc[("llada", "archer"), "humaneval ET (%)"] == "34.00 (paper 37.50, -3.50 ✗)"
    assert shown.loc[("llada", "archer"), "mbpp speedup vs saber"] == "4.00× (paper 3.00×, +1.00 ✗)"
    assert shown.loc[("dream", "saber"), "mbpp base (%)"] == "52.00"
    assert not any(c.endswith(("reported", "diff", "flag")) for c in shown.columns)


def test_reported_cells_without_a_measurement_are_counted_not_compared():
    from dlmpipe.analysis.tables import compare_reported

    summary = hand_summary().assign(quality_plus=math.nan)  # a run without extended tests
    spec = {**REPORTED_SPEC, "backbones": ["llada"]}
    numbers, _ = archer_table(summary, spec, ORIGIN, BACKBONES, TASKS)
    numbers, counts = compare_reported(numbers, spec)
    row = numbers.set_index(["backbone", "method"]).loc[("llada", "archer")]
    assert math.isnan(row["humaneval ET (%)"]) and row["humaneval ET (%) flag"] is None
    # the ET cell has no measurement; dream's row is not in this table; Overall is now the
    # mean of the three base scores, 46, beyond 2 points of 42.5
    assert counts == {"reported": 7, "compared": 5, "within": 3, "outside": 2, "unmeasured": 2}
    shown = display_frame(numbers, "archer")
    assert shown.loc[1, "humaneval ET (%)"] == "– (paper 37.50)"


def test_spa_tables_show_reported_tps_ratio_and_accuracy(tmp_path):
    spec = {"style": "spa", "methods": ["llada-confidence", "archer-k11"], "tasks": ["humaneval"],
            "backbones": ["llada"],
            "reported": {"humaneval": {"archer-k11": {"llada": {
                "TPS": 90.0, "TPS vs llada-confidence (x)": 6.4, "TTFT (ms)": 28.0,
                "accuracy (%)": 48.5}}}},
            "tolerance": {"%": {"absolute": 2}, "x": {"relative": 0.2}, "TPS": {"relative": 0.2},
                          "ms": {"relative": 0.2}}}
    summary = tmp_path / "summary.parquet"
    hand_summary().to_parquet(summary)
    write_tables(summary, {"t": spec}, ORIGIN, BACKBONES, TASKS, tmp_path)
    csv = pd.read_csv(tmp_path / "t.csv").set_index("method").loc["archer-k11"]
    assert csv["llada TPS diff"] == pytest.approx(10.0) and csv["llada TPS flag"] == False  # noqa: E712
    assert csv["llada TPS vs llada-confidence (x) diff"] == pytest.approx(1.6)
    assert csv["llada TPS vs llada-confidence (x) flag"] == True  # noqa: E712  8.0 vs 6.4: 25%
    assert csv["llada accuracy (%) diff"] == pytest.approx(-0.5)
    md = (tmp_path / "t.md").read_text()
    assert "100.00 (8.0×) (paper 90.00, +10.00 ✓) (paper 6.4×, +1.6 ✗)" in md
    assert "48.00 ± 5.00 (paper 48.50, -0.50 ✓)" in md and "28.0 (paper 28.0, +0.0 ✓)" in md
    assert "Reproduction: 4 of 4 reported cells compared, 3 within tolerance ✓, 1 outside ✗." in md
    assert "(paper 6.4×, +1.6 ✗)" in (tmp_path / "t.html").read_text()


@pytest.mark.parametrize("change, problem", [
    ({"reported": {"llada": {"archr": {"mbpp base (%)": 40}}}},
     r"tables.t.reported.llada.archr: 'archr' is not a row of this table \(its rows: saber, archer\)"),
    ({"reported": {"llama": {"archer": {"mbpp base (%)": 40}}}},
     r"tables.t.reported.llama: 'llama' is not a backbone of this table"),
    ({"reported": {"llada": {"archer": {"mbpp bse (%)": 40}}}},
     r"tables.t.reported.llada.archer.mbpp bse \(%\): 'mbpp bse \(%\)' is not a column of this table"),
    ({"reported": {"llada": {"archer": {"mbpp": {"speedup vs dkv (x)": 2}}}}},
     r"reported.llada.archer.mbpp speedup vs dkv \(x\): .* is not a column"),
    ({"tolerance": {"%": {"absolute": 2}}},
     r"tables.t.reported.llada.archer.mbpp latency \(s\): no tolerance for this column; give "
     r"tables.t.tolerance.s"),
    ({"tolerance": {**TOLERANCE, "secs": {"relative": 0.1}}},
     r"tables.t.tolerance.secs: neither a unit"),
])
def test_a_typo_in_reported_rows_columns_or_tolerances_is_named(change, problem):
    spec = {**REPORTED_SPEC, **change}
    problems = table_problems("t", spec, ORIGIN, BACKBONES, TASKS, ["llada-confidence", "saber"])
    assert any(__import__("re").search(problem, p) for p in problems), problems


def test_spa_reported_rows_are_keyed_by_task_and_validated():
    spec = {"style": "spa", "methods": ["llada-confidence", "spa"], "tasks": ["mbpp"],
            "reported": {"mbpp": {"spa-r128": {"dream": {"TPS": 1.0, "TTFT (ms)": 2.0}}}},
            "tolerance": {"TPS": {"relative": 0.2}, "ms": {"relative": 0.2}}}
    assert table_problems("t", spec, ORIGIN, BACKBONES, TASKS, ["llada-confidence"]) == []
    spec["reported"] = {"humaneval": spec["reported"]["mbpp"]}
    assert table_problems("t", spec, ORIGIN, BACKBONES, TASKS, ["llada-confidence"]) == [
        "tables.t.reported.humaneval: 'humaneval' is not a task of this table (mbpp)"]


def test_rows_whose_numbers_mix_environments_are_marked(tmp_path):
    summary = hand_summary().assign(fingerprint_warning="")
    mixed = (summary["method"] == "archer-k11") & (summary["backbone"] == "llada")
    summary.loc[mixed, "fingerprint_warning"] = "quality mixes 2 environments: a (1 samples), b (1 samples)"
    spec = {"style": "archer", "operating_points": ARCHER_POINTS, "methods": ["saber", "archer"]}
    numbers, _ = archer_table(summary, spec, ORIGIN, BACKBONES, TASKS)
    assert numbers.set_index(["backbone", "method"]).loc[("llada", "archer"), "environment warning"] \
        == "llada/mbpp/archer-k11: quality mixes 2 environments: a (1 samples), b (1 samples)"
    shown = display_frame(numbers, "archer")
    assert shown["method"].tolist() == ["saber", "archer ⚠", "saber", "archer"]
    path = tmp_path / "summary.parquet"
    summary.to_parquet(path)
    write_tables(path, {"t": spec, "s": {"style": "spa", "methods": ["archer-k8"]}}, ORIGIN,
                 BACKBONES, TASKS, tmp_path)
    md = (tmp_path / "t.md").read_text()
    assert "| archer ⚠ " in md and "- llada/mbpp/archer-k11: quality mixes 2 environments" in md
    assert "⚠" in (tmp_path / "t.html").read_text()
    # a table none of whose rows mix environments has neither the column nor the note
    assert "⚠" not in (tmp_path / "s.md").read_text()
    assert "environment warning" not in pd.read_csv(tmp_path / "s.csv").columns
