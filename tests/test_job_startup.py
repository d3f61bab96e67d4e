"""Model and score jobs start fast (issue 42): what they import, and that the imports they skip
change nothing.

- A generate or time-method job, run as the workflow runs it (``python -m dlmpipe ...``), reaches
  the model's first forward and its end without importing transformers or pandas; a score job
  never imports torch, transformers or pandas. Checked on ``sys.modules`` of the real job
  processes (not on timings: benchmarks/bench_job_startup.py times them).
- The tokenizer the jobs read without transformers (backbones/light_tokenizer.py) gives the ids,
  the text, the chat prompts and the special ids transformers' gives, on every family's test
  checkpoint and the shipped toys; the tables written without pandas (dlmpipe/arrow.py) equal
  ``pa.Table.from_pylist``'s. That they import no pandas is the jobs' check above: the generate
  job writes its rows with ``table_from_rows`` and reads its task file with ``read_rows``, the
  score job reads its two tables with ``read_table`` and ``read_rows``, and neither process ends
  with pandas imported.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from dlmpipe.arrow import column, read_rows, table_from_rows
from dlmpipe.backbones.checkpoint_config import read_config
from dlmpipe.backbones.prompts import ChatPrompt, chat_text
from dlmpipe.backbones.tokenizer import load_tokenizer, resolve_special_ids
from dlmpipe.generate import GENERATION_SCHEMA
from dlmpipe.timing import TIMING_SCHEMA

from .checkpoints import BLOCK_FAMILIES, MOE_FAMILIES, make_tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "dlmpipe" / "shipped"
HEAVY = ("torch", "transformers", "pandas")

# runs `python -m dlmpipe ARGS` and writes the heavy modules imported at the model's first
# forward (if any) and at the end: {"first_forward": [...], "end": [...]}
WRAPPER = r"""
import importlib.abc, importlib.util, json, runpy, sys
OUT, HEAVY, seen = sys.argv[1], %r, {}

def heavy():
    return sorted(m for m in HEAVY if m in sys.modules)

class FirstForward(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "dlmpipe.backbones.model":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            for attr in ("forward", "hidden_states", "hidden_states_storing_kv", "layer"):
                def wrapped(self, *a, _f=getattr(module.Backbone, attr), **k):
                    seen.setdefault("first_forward", heavy())
                    return _f(self, *a, **k)
                setattr(module.Backbone, attr, wrapped)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, FirstForward())
sys.argv = ["dlmpipe", *sys.argv[2:]]
try:
    runpy.run_module("dlmpipe", run_name="__main__", alter_sys=True)
except SystemExit as e:
    if e.code:
        raise
finally:
    seen["end"] = heavy()
    with open(OUT, "w") as f:
        json.dump(seen, f)
""" % (HEAVY,)

METHOD = {"name": "llada-confidence", "sampler": {"name": "llada_confidence"},
          "cache": {"name": "none"}, "gen_length": 32}


def _run(d: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = d / "modules.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(d / "wrapper.py"), str(out), *args], cwd=d, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, dict]:
    """The heavy modules of a generate, a time-method and a score job on the shipped toy (their
    inputs made in this process: what the preparing jobs import is not checked)."""
    from dlmpipe.cli import main

    d = tmp_path_factory.mktemp("jobs")
    (d / "wrapper.py").write_text(WRAPPER)
    assert main(["prepare-backbone", "--path", str(SHIPPED / "toy"), "--name", "toy",
                 "--out", str(d / "manifest.json")]) == 0
    assert main(["prepare-task", "--name", "toy_arith", "--options", '{"n": 3}',
                 "--out", str(d / "task.parquet")]) == 0
    model = ["--manifest", "manifest.json", "--task-file", "task.parquet", "--method",
             json.dumps(METHOD), "--device", "cpu"]
    seen = {
        "generate": _run(d, "generate", *model, "--out", "gen.parquet", "--provenance", "gen.json"),
        "time-method": _run(d, "time-method", *model, "--samples", "2", "--repeats", "1",
                            "--out", "timing.parquet"),
        "score": _run(d, "score", "--generations", "gen.parquet", "--task-file", "task.parquet",
                      "--out", "scores.parquet", "--workers", "1", "--sandbox", "process"),
    }
    scores = read_rows(d / "scores.parquet")
    assert len(scores) == 3 and all(r["completion"] is not None for r in scores)
    assert len(read_rows(d / "timing.parquet")) >= 2
    return seen


@pytest.mark.parametrize("job", ["generate", "time-method"])
def test_a_model_job_imports_neither_transformers_nor_pandas(jobs, job):
    seen = jobs[job]
    assert seen["first_forward"] == ["torch"], seen  # it did reach the model, with torch alone
    assert seen["end"] == ["torch"], seen


def test_a_score_job_imports_no_torch_transformers_or_pandas(jobs):
    assert "first_forward" not in jobs["score"]
    assert jobs["score"]["end"] == [], jobs["score"]


# ---- the tokenizer without transformers ----------------------------------------------------
TEXTS = ["def add(a, b):\n    return a + b\n", "  leading and  double  spaces ", "",
         "naïve café — ünïcödé ✓ 中文", "3+4=7\n12*3=36", "<|endoftext|>x<|mdm_mask|>y<|MASK|>"]
FAMILIES = ["llada", "dream", "diffucoder", *BLOCK_FAMILIES, *MOE_FAMILIES]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    made = {f: make_tiny_checkpoint(root / f, f, d_model=32, n_layers=1, n_heads=2, mlp_hidden=32)
            for f in FAMILIES}
    return {**made, "shipped toy": SHIPPED / "toy", "shipped toy_block": SHIPPED / "toy_block"}


def test_the_light_tokenizer_is_transformers_tokenizer_where_it_applies(checkpoints):
    from dlmpipe.backbones.light_tokenizer import LightTokenizer

    light_ones = []
    for name, path in checkpoints.items():
        cfg = read_config(path)
        full = load_tokenizer(path, cfg.family)
        light = load_tokenizer(path, cfg.family, light=True)
        if not isinstance(light, LightTokenizer):
            assert light.__class__ is full.__class__  # not light: transformers', unchanged
            continue
        light_ones.append(name)
        assert len(light) == len(full), name
        for text in TEXTS:
            ids = full(text, add_special_tokens=False)["input_ids"]
            assert light(text, add_special_tokens=False)["input_ids"] == ids, (name, text)
            for skip in (False, True):
                assert light.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
        every = list(range(len(full)))
        assert light.decode(every, skip_special_tokens=False) == full.decode(every, skip_special_tokens=False)
        assert bool(light.chat_template) == bool(full.chat_template), name
        for p in [ChatPrompt(user="1+2="), ChatPrompt(user="Write f", response_prefix="```python\n",
                                                       system="You are terse.")]:
            assert chat_text(light, cfg.family, p) == chat_text(full, cfg.family, p), (name, p)
        assert resolve_special_ids(replace(cfg), light, path) == resolve_special_ids(replace(cfg), full, path)
        for token in ("<|endoftext|>", "<|mdm_mask|>", "<|MASK|>", "<|mask|>", "not a token"):
            assert light.convert_tokens_to_ids(token) == full.convert_tokens_to_ids(token), (name, token)
    # LLaDA's, the Ling tokenizer's (LLaDA-MoE, LLaDA2.0) and the shipped toys' are read light
    assert {"llada", *MOE_FAMILIES, "shipped toy", "shipped toy_block"} <= set(light_ones), light_ones


# ---- tables without pandas -------------------------------------------------------------------
def _rows(schema: pa.Schema, n: int) -> list[dict]:
    values = {pa.int64(): [0, -3, 2**40, None], pa.float64(): [1.5, math.inf, None, -0.0],
              pa.string(): ["", "ünï ✓", None, "a\nb"], pa.bool_(): [True, False, None, True],
              pa.list_(pa.int64()): [[1, 2], [], None, [7]]}
    return [{f.name: values[f.type][i % 4] for f in schema if (i + len(f.name)) % 5} for i in range(n)]


@pytest.mark.parametrize("schema", [GENERATION_SCHEMA, TIMING_SCHEMA], ids=["generations", "timing"])
def test_tables_without_pandas_equal_pyarrows(schema):
    rows = _rows(schema, 11)
    assert table_from_rows(rows, schema).equals(pa.Table.from_pylist(rows, schema=schema))
    assert table_from_rows([], schema).equals(pa.Table.from_pylist([], schema=schema))
    assert column([None, True, False], pa.bool_()).equals(pa.array([None, True, False], pa.bool_()))


def test_the_recorded_transformers_version_is_the_imported_ones():
    import transformers

    from dlmpipe.environment import environment, provenance_versions

    assert environment()["transformers_version"] == transformers.__version__
    assert provenance_versions()["transformers"] == transformers.__version__
