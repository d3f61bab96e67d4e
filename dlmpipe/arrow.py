"""Parquet rows in and out without pandas: the jobs' tables.

pyarrow imports pandas (0.1-0.3 s) the first time ``pa.array`` converts anything (a list or a
NumPy array: it asks pandas whether the object is one of its own), and ``pq.read_table`` imports
pyarrow.dataset, which imports pandas too. A model or score job writes and reads a few small
tables, so that import was a noticeable part of its start-up (issue 42). Here columns are built
from their buffers (``pa.Array.from_buffers``; no conversion, so no pandas) for the types the jobs
write: int64, float64, bool, string and lists of int64/float64; any other type goes through
``pa.array`` (and imports pandas). Files are read with ``pq.ParquetFile(...).read()``, which
needs no dataset layer. The tables equal ``pa.Table.from_pylist``'s (tests/test_job_startup.py).
"""
from __future__ import annotations

import array
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

_NUMERIC = {pa.int64(): ("q", 0), pa.float64(): ("d", 0.0)}


def _validity(values: list) -> tuple[pa.Buffer | None, int]:
    nulls = sum(v is None for v in values)
    if not nulls:
        return None, 0
    bits = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return pa.py_buffer(bytes(bits)), nulls


def column(values: list, type: pa.DataType) -> pa.Array:
    """``values`` (Python objects, None for null) as an array of ``type``, like
    ``pa.array(values, type=type)`` but without importing pandas for the types above."""
    n = len(values)
    valid, nulls = _validity(values)
    if type in _NUMERIC:
        code, zero = _NUMERIC[type]
        data = array.array(code, (zero if v is None else v for v in values))
        return pa.Array.from_buffers(type, n, [valid, pa.py_buffer(data.tobytes())], nulls)
    if type == pa.bool_():
        bits = bytearray((n + 7) // 8)
        for i, v in enumerate(values):
            if v:
                bits[i >> 3] |= 1 << (i & 7)
        return pa.Array.from_buffers(type, n, [valid, pa.py_buffer(bytes(bits))], nulls)
    if type == pa.string():
        encoded = [b"" if v is None else v.encode("utf-8") for v in values]
        offsets = array.array("i", [0])
        for b in encoded:
            offsets.append(offsets[-1] + len(b))
        return pa.Array.from_buffers(type, n, [valid, pa.py_buffer(offsets.tobytes()),
                                               pa.py_buffer(b"".join(encoded))], nulls)
    if pa.types.is_list(type) and type.value_type in _NUMERIC:
        offsets = array.array("i", [0])
        flat: list = []
        for v in values:
            flat.extend(v or ())
            offsets.append(len(flat))
        child = column(flat, type.value_type)
        return pa.Array.from_buffers(type, n, [valid, pa.py_buffer(offsets.tobytes())], nulls,
                                     children=[child])
    return pa.array(values, type=type)  # any other type: pyarrow's conversion (imports pandas)


def table_from_rows(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pylist(rows, schema=schema)`` without pandas (missing keys are null)."""
    return pa.Table.from_arrays([column([r.get(f.name) for r in rows], f.type) for f in schema],
                                schema=schema)


def read_table(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """A parquet file as one table, without pyarrow.dataset (and so without pandas)."""
    return pq.ParquetFile(path).read(columns=columns)


def read_rows(path: str | Path) -> list[dict]:
    """A parquet file's rows as dicts (a task table: ``tasks.read_task_table``'s rows)."""
    return read_table(path).to_pylist()


#: a task table's metadata key recording the dataset ids it was read from, with their commits
#: (dlmpipe/tasks/registry.py, ``dataset_sources``)
SOURCES_KEY = "dlmpipe.sources"


def task_sources(path: str | Path) -> dict | None:
    """The dataset ids a task table was read from, with their commits (None: local files)."""
    import json

    raw = (pq.ParquetFile(path).schema_arrow.metadata or {}).get(SOURCES_KEY.encode())
    return json.loads(raw) if raw else None
