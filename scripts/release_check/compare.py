"""The table: a release's run against dlmpipe's, per forward (kind, rows computed, full or
cached), per step (positions committed and their tokens; confidences within 1e-5 where both
record one) and the final tokens; the cases kept where the release's float32 and float64 runs
agree (no tie decided by rounding), compared in float64. Per setting: equal/total (everything),
steps+tokens (commits and final tokens, rows aside), dropped, release errors; then the first
differing record of each mismatch. No release code needed (tests/test_release_check.py).
Usage: python -m scripts.release_check.compare RELEASE REL_F32.json REL_F64.json DLM.json"""
from __future__ import annotations

import collections
import json
import sys

from .cases import label

TOL = 1e-5


def view(rec: dict) -> tuple:
    """A record as compared: (kind, rows, full, ((pos, token), ...))."""
    com = rec.get("committed")
    return (rec["kind"], None if rec.get("rows") is None else tuple(map(tuple, rec["rows"])),
            rec.get("full"),
            None if com is None else tuple(sorted((e["pos"], e["token"]) for e in com)))


def same(a: dict, b: dict, rows: bool = True) -> bool:
    """Two records equal: kind, committed (pos, token) and, with `rows`, the rows computed and
    full/cached (each only where both sides record it), confidences within TOL."""
    va, vb = view(a), view(b)
    if va[0] != vb[0] or va[3] != vb[3]:
        return False
    if rows and (va[1] != vb[1] or (va[2] is not None and vb[2] is not None and va[2] != vb[2])):
        return False
    conf = {e["pos"]: e.get("confidence") for e in a.get("committed") or []}
    return all(abs(conf[e["pos"]] - e["confidence"]) <= TOL for e in b.get("committed") or []
               if conf.get(e["pos"]) is not None and e.get("confidence") is not None)


def first_diff(rel: list, dlm: list, rows: bool = True):
    """None where the record lists are equal, else (index, release record, dlmpipe record)."""
    for i, (a, b) in enumerate(zip(rel, dlm)):
        if not same(a, b, rows):
            return i, a, b
    if len(rel) != len(dlm):
        i = min(len(rel), len(dlm))
        return i, rel[i] if i < len(rel) else None, dlm[i] if i < len(dlm) else None
    return None


def _truncate(records: list, last_pos: int) -> list:
    if not records:
        return records
    last = dict(records[-1], committed=[e for e in records[-1]["committed"] or []
                                        if e["pos"] <= last_pos])
    return records[:-1] + [last]


def normalize(release: str, rel: dict, dlm: dict):
    """(release records, dlmpipe records, release final, dlmpipe final) with the documented
    differences of form set aside (docs/METHODS.md): the release's store forward of the last block
    (nothing follows it; dlmpipe skips it); Fast-dLLM v2's pad written over the last block after a
    stop; dInfer's forwards outside its decode steps (only steps compared)."""
    R, D = list(rel["records"]), list(dlm["records"])
    fr, fd = rel["final"], dlm["final"]
    P = len(rel["prompt"])
    if release == "fast_dllm_v2":
        c = rel["case"]
        end = (P // 16 + c["G"] // 16) * 16
        R = [r for r in R if not (r["kind"] != "step" and r["rows"][-1][1] == end)]

        def cut(t):
            t = t[:end - P]
            i = next((i for i, v in enumerate(t) if v in rel["stop"]), None)
            return t if i is None else t[:i + 1]
        if fr is not None and rel["stop"][0] in fr[:end - P] and R:
            s = P + fr.index(rel["stop"][0])
            if R[-1]["rows"][0][0] // 16 == s // 16:  # the stop in the release's last block
                R, D = _truncate(R, s), _truncate(D, s)
        fr, fd = cut(fr) if fr else fr, cut(fd) if fd else fd
    elif release == "sdar":
        if len(R) == len(D) + 1 and R[-1]["kind"] == "commit":
            R = R[:-1]
    else:
        R = [r for r in R if r["kind"] == "step"]
        D = [r for r in D if r["kind"] == "step"]
        if fr is not None and fd is not None:
            n = min(len(fr), len(fd))
            fr, fd = fr[:n], fd[:n]
    return R, D, fr, fd


def cause(rel: dict, rec: dict | None) -> str:
    """What the release's differing record does that dlmpipe never does, where it is one of the
    documented two: rewrite a prompt row, or rewrite a decoded (not masked) row."""
    com = (rec or {}).get("committed") or []
    if any(e["pos"] < len(rel["prompt"]) for e in com):
        return "release rewrites a prompt row"
    if any(e.get("prev", rel["mask"]) != rel["mask"] for e in com):
        return "release rewrites a decoded row"
    return ""


def compare_case(release: str, rel: dict, dlm: dict) -> dict:
    """{"status": equal | differs | release error, "steps_tokens": bool, "first": str | None}"""
    if rel.get("error"):
        return {"status": "release error", "steps_tokens": False, "first": rel["error"][-200:]}
    if dlm.get("error"):
        return {"status": "differs", "steps_tokens": False, "first": "dlmpipe: " + dlm["error"]}
    R, D, fr, fd = normalize(release, rel, dlm)
    d, d_steps = first_diff(R, D), first_diff(R, D, rows=False)
    first = None
    if d is not None:
        i, a, b = d
        first = (f"record {i}: release {a and view(a)} | dlmpipe {b and view(b)}"
                 + (f" [{cause(rel, a)}]" if cause(rel, a) else ""))
    elif fr != fd:
        first = f"final tokens: release {fr} | dlmpipe {fd}"
    return {"status": "equal" if first is None else "differs",
            "steps_tokens": d_steps is None and fr == fd, "first": first}


def agree(release: str, a: dict, b: dict) -> bool:
    """The release's float32 and float64 runs take the same steps."""
    if bool(a.get("error")) != bool(b.get("error")):
        return False
    ra, _, fa, _ = normalize(release, a, {"records": [], "final": None})
    rb, _, fb, _ = normalize(release, b, {"records": [], "final": None})
    return first_diff(ra, rb) is None and fa == fb


def table(release: str, rel32: list, rel64: list, dlm: list, out=sys.stdout) -> dict:
    """Prints the table; returns {setting: Counter} (the test reads it)."""
    key = lambda c: json.dumps(c, sort_keys=True)
    r32 = {key(r["case"]): r for r in rel32}
    r64 = {key(r["case"]): r for r in rel64}
    rows, diffs = collections.defaultdict(collections.Counter), []
    for d in dlm:
        k = key(d["case"])
        setting = label(release, d["case"]) + (f"  dlmpipe {d['variant']}" if d["variant"] else "")
        t = rows[setting]
        if k not in r64 or not agree(release, r32.get(k, r64[k]), r64[k]):
            t["dropped"] += 1
            continue
        res = compare_case(release, r64[k], d)
        if res["status"] == "release error":
            t["release error"] += 1
            continue
        t["total"] += 1
        t["equal"] += res["status"] == "equal"
        t["steps+tokens"] += res["steps_tokens"]
        if res["first"]:
            c = d["case"]
            diffs.append(f"{setting} | P={c['P']} seed={c.get('seed', c.get('mseed'))}: "
                         f"{res['first']}")
    w = max(len(s) for s in rows) if rows else 10
    print(f"{'setting':{w}}  {'equal':>9} {'steps+tokens':>12} {'dropped':>7} {'rel.err':>7}",
          file=out)
    tot = collections.Counter()
    for s in sorted(rows):
        t = rows[s]
        tot.update(t)
        print(f"{s:{w}}  {t['equal']:>4}/{t['total']:<4} {t['steps+tokens']:>7}/{t['total']:<4}"
              f" {t['dropped']:>7} {t['release error']:>7}", file=out)
    print(f"{'all':{w}}  {tot['equal']:>4}/{tot['total']:<4} {tot['steps+tokens']:>7}/"
          f"{tot['total']:<4} {tot['dropped']:>7} {tot['release error']:>7}", file=out)
    print(f"\n{len(diffs)} mismatches, the first differing record of each:", file=out)
    for line in diffs:
        print("  " + line, file=out)
    return rows


if __name__ == "__main__":
    rel, a, b, c = sys.argv[1:5]
    table(rel, *(json.load(open(p)) for p in (a, b, c)))
