"""The independent release checks' own machinery (scripts/release_check/, docs/METHODS.md "The
decode trace"), without any release code: the tiny checkpoints build, dlmpipe's side decodes
them into trace records, and the comparison finds a changed token or row range in otherwise
identical records (and reports identical ones equal: it is not a no-op)."""
from __future__ import annotations

import copy
import io

import pytest
import torch

from scripts.release_check import cases as rc_cases
from scripts.release_check.checkpoints import build
from scripts.release_check.compare import compare_case, first_diff, table
from scripts.release_check.dlm_side import run


@pytest.fixture(scope="module")
def dlm_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("release_check")
    build(out, "fast_dllm_v2")
    build(out, "dinfer")
    v2 = [c for c in rc_cases.v2_cases() if c["ckpt"] == "v2_s0" and c["P"] == 21
          and c["sub"] == 4 and c["thr"] == 0.3]
    di = [c for c in rc_cases.dinfer_cases() if c["family"] == "llada_moe" and c["n"] == 8 and c["mseed"] == 0
          and c["P"] == 5 and c["decoder"] == "threshold" and c["cache"] in ("none", "dual")]
    assert len(v2) == 2 and len(di) == 2
    return {"fast_dllm_v2": run("fast_dllm_v2", out, v2, dtype=torch.float32),
            "dinfer": run("dinfer", out, di, dtype=torch.float32)}


def as_release(release, d):
    """dlmpipe's run dressed as a release's (the fields a release runner adds)."""
    r = copy.deepcopy({k: d[k] for k in ("case", "records", "final", "error")})
    r.update(prompt=rc_cases.prompt_of(release, d["case"]), mask=-1, stop=[-2])
    for rec in r["records"]:
        for e in rec["committed"] or []:
            e["prev"] = -1
    return r


@pytest.mark.parametrize("release", ["fast_dllm_v2", "dinfer"])
def test_dlmpipe_side_decodes_into_trace_records(dlm_runs, release):
    for d in dlm_runs[release]:
        assert d["error"] is None, d["error"]
        steps = [r for r in d["records"] if r["kind"] == "step"]
        assert steps and all(r["rows"] for r in steps)
        assert sum(len(r["committed"]) for r in d["records"]) >= len(d["final"])


@pytest.mark.parametrize("release", ["fast_dllm_v2", "dinfer"])
def test_comparison_finds_a_changed_token_or_row_range(dlm_runs, release):
    for d in dlm_runs[release]:
        rel = as_release(release, d)
        assert compare_case(release, rel, d) == {"status": "equal", "steps_tokens": True,
                                                 "first": None}
        # one committed token changed
        bad = copy.deepcopy(rel)
        compared = [r for r in bad["records"] if r["kind"] == "step" or release != "dinfer"]
        k = next(i for i, r in enumerate(compared) if r["kind"] == "step" and r["committed"])
        compared[k]["committed"][-1]["token"] += 1
        res = compare_case(release, bad, d)
        assert res["status"] == "differs" and not res["steps_tokens"]
        assert res["first"].startswith(f"record {k}:")  # (dInfer: steps only)
        # one row range changed: the records differ, the steps and tokens do not
        bad = copy.deepcopy(rel)
        rec = next(r for r in bad["records"] if r["kind"] == "step")
        rec["rows"] = [[rec["rows"][0][0] + 1, rec["rows"][-1][1]]]
        res = compare_case(release, bad, d)
        assert res["status"] == "differs" and res["steps_tokens"]
        # a final token changed
        bad = copy.deepcopy(rel)
        bad["final"][0] += 1
        assert compare_case(release, bad, d)["status"] == "differs"


def test_first_diff_and_the_table(dlm_runs):
    d = dlm_runs["dinfer"][0]
    recs = d["records"]
    assert first_diff(recs, copy.deepcopy(recs)) is None
    assert first_diff(recs, recs[:-1])[0] == len(recs) - 1  # a missing record
    rels = [as_release("dinfer", x) for x in dlm_runs["dinfer"]]
    rels[1]["records"][-1]["committed"] = []  # the second case differs
    buf = io.StringIO()
    rows = table("dinfer", rels, rels, dlm_runs["dinfer"], out=buf)
    assert sorted((t["equal"], t["total"]) for t in rows.values()) == [(0, 1), (1, 1)]
    assert "1 mismatches" in buf.getvalue()
    # release float32 and float64 disagreeing: the case is dropped, not compared
    other = copy.deepcopy(rels)
    other[0]["records"][0]["committed"][0]["token"] += 1
    rows = table("dinfer", other, rels, dlm_runs["dinfer"], out=io.StringIO())
    assert sum(t["dropped"] for t in rows.values()) == 1
