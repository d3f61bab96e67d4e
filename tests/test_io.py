"""The one atomic-write helper every pipeline output goes through (dlmpipe/io.py)."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlmpipe.io import atomic_write, atomic_write_json, atomic_write_parquet, atomic_write_text


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "table.parquet"
    atomic_write_text(out, "old")

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(out, broken)
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.parquet"]


def test_writers_create_parents_and_round_trip(tmp_path):
    table = pa.table({"a": [1, 2]})
    atomic_write_parquet(tmp_path / "x" / "t.parquet", table)
    assert pq.read_table(tmp_path / "x" / "t.parquet").equals(table)
    atomic_write_json(tmp_path / "y" / "v.json", {"k": [1]})
    assert (tmp_path / "y" / "v.json").read_text().startswith("{")


def test_temporaries_of_dead_writers_are_swept_and_live_ones_kept(tmp_path):
    out = tmp_path / "f.txt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".f.txt.{dead}.deadbeef.tmp"
    live = tmp_path / f".f.txt.{1}.cafecafe.tmp"  # pid 1 is alive
    stale.write_text("left by a killed job")
    live.write_text("being written")
    atomic_write_text(out, "new", fsync=False)
    assert not stale.exists() and live.exists() and out.read_text() == "new"
