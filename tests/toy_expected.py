"""What the default campaign (config.yaml) gives on the shipped toys (the full-attention ``toy``
and the block-diffusion ``toy_block``): per (backbone, task, method) its quality and, per sample,
whether it passed and the sha256 of its token ids; stored in tests/data/toy_expected.json, which
tests/test_toy_expectations.py compares runs against. Keys: ``task/method`` on ``toy``,
``backbone/task/method`` on another shipped backbone.

The run goes through the workflow's own job functions (manifest with the pinned hashes, task
preparation, the SVD proxies, ``run_generation_job``, ``score_generations`` in the sandbox), in
this process, on one thread, so its files are a real campaign's.

Bit-identical tokens across machines are not what any BLAS promises (vendors' and instruction
sets' kernels round differently), so the stored tokens hold by the near-tie rule: a sample's
tokens are the same on every machine unless the sample hangs on a near tie, i.e. unless decoding
it with every projection's output perturbed by relative noise of ``NEAR_TIE["eps"]`` (far above
the last-bit differences between kernels) changes its tokens under one of ``NEAR_TIE["seeds"]``
(dlmpipe/backbones/rowwise.py ``perturbed``). Regenerating finds those samples and stores them
per entry (``near_tie``); a check accepts a different token or verdict there only, naming it.

Regenerate the file after adding or changing a method in config.yaml, or after shipping another
toy (one command from the repository root, ~12 CPU minutes for the full 40 samples per task and
the three perturbed runs):

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m tests.toy_expected

``--backbone toy_block`` regenerates one backbone's entries and keeps the others' (a change that
concerns one toy only).

Compare a finished default campaign (``make campaign``) against it, sample for sample:

    PYTHONPATH=$PWD python -m tests.toy_expected --check results
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .workflow import REPO

EXPECTED = Path(__file__).resolve().parent / "data" / "toy_expected.json"
BACKBONE = "toy"
#: the near-tie rule (module docstring): relative noise on every projection, its seeds
NEAR_TIE = {"eps": 1e-5, "seeds": [1, 2, 3]}
#: at most this share of a run's samples may hang on near ties: beyond it the stored tokens would
#: check little, and the toy's evidence would hang on rounding (tests/test_toy_expectations.py)
NEAR_TIE_SHARE = 0.05


def key(backbone: str, task: str, method: str) -> str:
    """The stored entry's key: ``task/method`` on the toy (as before the block toy), else
    ``backbone/task/method``."""
    return f"{task}/{method}" if backbone == BACKBONE else f"{backbone}/{task}/{method}"


def shipped_backbones(campaign) -> list[str]:
    """The default campaign's backbones, every one a shipped toy."""
    return [b for b, spec in campaign.config["backbones"].items() if "shipped" in spec]


def token_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16]


def summarize(rows: list[dict]) -> dict:
    """One (task, method)'s entry: quality, and per sample passed and token hash."""
    rows = sorted(rows, key=lambda r: r["sample_index"])
    return {"quality": sum(r["score"] for r in rows) / len(rows), "n": len(rows),
            "passed": [bool(r["passed"]) for r in rows],
            "tokens": [token_hash(r["token_ids"]) for r in rows]}


def default_campaign():
    from dlmpipe.campaign import load_campaign

    return load_campaign([REPO / "config.yaml"])


def run(root: Path, limit: int | None = None, methods: list[str] | None = None,
        backbones: list[str] | None = None, perturb: int | None = None) -> dict[str, dict]:
    """Decode and score the default campaign's methods (all, or ``methods``) on its shipped
    toys (all, or ``backbones``), the first ``limit`` samples of each task (None: all), under
    ``root``; returns ``{key: entry}``. Files are laid out as a campaign's results directory.
    Decoded at the campaign's batch size (auto: 8 samples together on the CPU, a third faster
    than one at a time), so the stored per-sample hashes also check batched decoding.
    ``perturb``: a seed of the near-tie rule's perturbation (module docstring), else none."""
    from contextlib import nullcontext

    from dlmpipe.backbones.rowwise import perturbed

    campaign = default_campaign()
    out = {}
    with nullcontext() if perturb is None else perturbed(NEAR_TIE["eps"], perturb), scored_once():
        for backbone in backbones or shipped_backbones(campaign):
            out.update(_run(campaign, backbone, root, limit, methods))
    return out


@contextmanager
def scored_once():
    """Inside the block, ``score_generations`` scores each distinct (task row, completion,
    settings, isolation) once and reuses its verdict: many methods decode a sample alike (every
    exact one as the reference), and a program's verdict is a function of those alone (its
    sandbox runs it afresh), so the score files are those of scoring every row; the sandbox's
    own behaviour is tests/test_scoring.py's and tests/test_sandbox.py's. The toy run's scoring:
    ~9 -> ~1 CPU s."""
    from dlmpipe.scoring import score

    plain, verdicts = score.score_sample, {}

    def once(task_row, completion, settings, iso=None, share=True):
        # share (reference outputs kept for later samples) changes no verdict: not in the key
        key = (task_row["task_id"], completion, repr(settings), repr(iso))
        if key not in verdicts:
            verdicts[key] = plain(task_row, completion, settings, iso, share)
        return dict(verdicts[key])

    score.score_sample = once
    try:
        yield
    finally:
        score.score_sample = plain


def near_ties(results: dict[str, dict], perturbed_runs: list[dict[str, dict]]) -> None:
    """Mark in each entry of ``results`` (``near_tie``: sample indices) the samples whose tokens
    one of the perturbed runs changed."""
    for k, entry in results.items():
        entry["near_tie"] = sorted({i for other in perturbed_runs
                                    for i, (a, b) in enumerate(zip(entry["tokens"], other[k]["tokens"]))
                                    if a != b})


def _run(campaign, backbone: str, root: Path, limit: int | None, methods: list[str] | None):
    """``run`` on one backbone."""
    import pyarrow.parquet as pq

    from dlmpipe.backbones.manifest import write_manifest
    from dlmpipe.engine.proxies import write_proxies
    from dlmpipe.generate import run_generation_job
    from dlmpipe.scoring.score import score_generations
    from dlmpipe.tasks import load_task, write_task_table

    manifest = root / "backbones" / backbone / "manifest.json"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    write_manifest(campaign.checkpoint_path(backbone), manifest, name=backbone,
                   dtype=campaign.config["backbones"][backbone]["dtype"],
                   sha256=campaign.weight_sha256(backbone))
    proxies = None
    out = {}
    for task in campaign.tasks:
        task_file = root / "tasks" / f"{task}.parquet"
        if not task_file.is_file():
            write_task_table(load_task(campaign.benchmark(task), **campaign.task_options(task)), task_file)
        for name in campaign.methods_on(backbone, task):
            if methods is not None and name not in methods:
                continue
            if campaign.needs_proxies(name, backbone, task) and proxies is None:
                proxies = root / "backbones" / backbone / "proxies.safetensors"
                write_proxies(manifest, proxies)
            gen = root / "generations" / backbone / task / f"{name}.parquet"  # the campaign's layout
            run_generation_job(str(manifest), str(task_file), campaign.method(name, task, backbone),
                               str(gen), str(gen.with_suffix(".json")), seed=campaign.config["seed"],
                               device="cpu", warmup=False, limit=limit, batch_size="auto",
                               proxies=str(proxies) if campaign.needs_proxies(name, backbone, task) else None)
            scores = root / "scores" / backbone / task / f"{name}.parquet"
            score_generations(gen, task_file, scores, workers=1,
                              sandbox=campaign.config.get("sandbox"))
            out[key(backbone, task, name)] = summarize(pq.read_table(scores).to_pylist())
    return out


def from_results(results: Path) -> dict[str, dict]:
    """The entries of a finished campaign's score files
    (results/scores/<backbone>/<task>/<method>, every shipped toy of the default campaign)."""
    import pyarrow.parquet as pq

    return {key(b, f.parent.name, f.stem): summarize(pq.read_table(f).to_pylist())
            for b in shipped_backbones(default_campaign())
            for f in sorted((results / "scores" / b).glob("*/*.parquet"))}


def differences(measured: dict[str, dict], expected: dict[str, dict],
                accepted: list[str] | None = None) -> list[str]:
    """Where ``measured`` (possibly the first samples only) differs from ``expected``: token
    hashes and verdicts sample by sample, and the quality when every sample was measured; a
    difference at a stored near-tie sample is no problem (module docstring) and goes to
    ``accepted``, named."""
    out = []
    for key, got in sorted(measured.items()):
        want = expected.get(key)
        if want is None:
            out.append(f"{key}: not in {EXPECTED.name} (regenerate it: python -m tests.toy_expected)")
            continue
        n, ties = got["n"], set(want.get("near_tie", []))
        differ = {i for i in range(n) for field in ("tokens", "passed") if got[field][i] != want[field][i]}
        for field in ("tokens", "passed"):
            bad = [i for i in range(n) if got[field][i] != want[field][i] and i not in ties]
            if bad:
                out.append(f"{key}: {field} differ at samples {bad[:8]}{' ...' if len(bad) > 8 else ''}")
        if accepted is not None and differ & ties:
            accepted.append(f"{key}: samples {sorted(differ & ties)} differ, each a stored near tie")
        if n == want["n"] and got["quality"] != want["quality"] and not any(
                got["passed"][i] != want["passed"][i] for i in ties):
            out.append(f"{key}: quality {got['quality']:.3f}, expected {want['quality']:.3f}")
    return out


def kernels() -> dict:
    """The CPU and kernels the results were computed with, for the record: other machines
    reproduce them by the near-tie rule (module docstring), not bit for bit."""
    import torch

    from dlmpipe.environment import cpu_model

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "computed_on": cpu_model()}


def read_expected() -> dict:
    return json.loads(EXPECTED.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.toy_expected", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", metavar="RESULTS_DIR", help="compare a finished default campaign "
                   "against the stored file instead of regenerating it")
    p.add_argument("--backbone", action="append", default=None, help="regenerate only this "
                   "backbone's entries (repeatable), keeping the others' stored ones")
    p.add_argument("--jobs", type=int, default=1, help="the plain and perturbed runs in this many "
                   "processes side by side (one thread each)")
    a = p.parse_args(argv)
    if a.check:
        accepted: list[str] = []
        problems = differences(from_results(Path(a.check)), read_expected()["results"], accepted)
        print("\n".join(problems + [f"accepted (near-tie rule): {x}" for x in accepted])
              or f"{a.check}: every (task, method) as in {EXPECTED}")
        return 1 if problems else 0
    import torch

    from dlmpipe.backbones.shipped import read_record

    torch.set_num_threads(1)
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(
            a.jobs, mp_context=get_context("spawn"), initializer=torch.set_num_threads, initargs=(1,)) as pool:
        runs = [pool.submit(run, Path(tmp) / f"run-{seed}", None, None, a.backbone, seed)
                for seed in [None, *NEAR_TIE["seeds"]]]
        results = runs[0].result()
        near_ties(results, [r.result() for r in runs[1:]])
    campaign = default_campaign()
    if a.backbone:  # the other backbones' entries as stored
        kept = {k: e for k, e in read_expected()["results"].items()
                if not any(k == key(b, *k.split("/")[-2:]) for b in a.backbone)}
        results = {**kept, **results}
    weights = {b: read_record(campaign.config["backbones"][b]["shipped"])["sha256"]
               for b in shipped_backbones(campaign)}
    EXPECTED.write_text(json.dumps({
        "about": "tests/toy_expected.py: the default campaign on the shipped toys; regenerate with "
                 "`PYTHONPATH=$PWD OMP_NUM_THREADS=1 python -m tests.toy_expected`",
        "weights_sha256": weights[BACKBONE], "block_weights_sha256":
            {b: w for b, w in weights.items() if b != BACKBONE},
        "kernels": kernels(), "near_tie_rule": NEAR_TIE, "results": results}, indent=1) + "\n")
    for name, entry in results.items():
        print(f"{name:50s} {100 * entry['quality']:6.1f}%  near ties: {entry.get('near_tie', [])}")
    print(f"wrote {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
