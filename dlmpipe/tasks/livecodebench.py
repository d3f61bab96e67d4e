"""LiveCodeBench code generation (code_generation_lite release format) as task rows.

Records: ``question_id``, ``question_content``, ``starter_code``, ``public_test_cases`` (JSON),
``private_test_cases`` (JSON, or upstream's base64 of zlib of a pickled JSON string),
``metadata`` (JSON with ``func_name`` for LeetCode problems); release_v1 has 400 problems.
The prompt is LiveCodeBench's official generation prompt (starter-code or stdin variant). Tests
are a JSON spec ``{"format": "stdin" | "functional", "cases"}`` that the sandboxed driver runs
(``dlmpipe/scoring/harness.py``). Pickled tests are never unpickled: the one string they hold is
read by disassembling the pickle (``pickletools``), and anything else in it is refused.
"""
from __future__ import annotations

import base64
import binascii
import json
import pickletools
import zlib

from .spec import Benchmark, DataFile, counted
from .sources import read_records, require, resolve_source

LCB_INSTRUCTION = ("You will be given a question (problem specification) and will generate a "
                   "correct Python program that matches the specification and passes all tests. "
                   "You will NOT return anything except for the program.\n\n"
                   "Question:\n{question}\n")
LCB_STARTER = ("You will use the following starter code to write the solution to the problem and "
               "enclose your code within delimiters.\n```python\n{starter}\n```\n\n")
LCB_STDIN = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
             "directly test on the sample inputs). Enclose your code within delimiters as follows. "
             "Ensure that when the python program runs, it reads the inputs, runs the algorithm "
             "and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n")


def load_livecodebench(source: str | None = None) -> list[dict]:
    """LiveCodeBench code generation: stdin problems and LeetCode-style functional problems."""
    src = resolve_source("livecodebench", source)
    out = []
    for n, r in enumerate(read_records("livecodebench", src)):
        require("livecodebench", src, r, ("question_id", "question_content", "public_test_cases"), n)
        try:
            cases = decode_lcb_tests(r["public_test_cases"])
            cases += decode_lcb_tests(r.get("private_test_cases") or "[]")
            meta = r.get("metadata") or {}
            meta = json.loads(meta) if isinstance(meta, str) else meta
        except (ValueError, zlib.error, binascii.Error, TypeError) as e:
            raise ValueError(f"livecodebench: malformed data file {src}: record {n}: {e}") from None
        functional = any(c.get("testtype") == "functional" for c in cases)
        starter = r.get("starter_code") or ""
        prompt = LCB_INSTRUCTION.format(question=r["question_content"])
        prompt += LCB_STARTER.format(starter=starter) if starter else LCB_STDIN
        entry = meta.get("func_name", "") if functional else ""
        spec = {"format": "functional" if functional else "stdin", "entry_point": entry,
                "cases": [{"input": c["input"], "output": c["output"]} for c in cases]}
        out.append({"task_id": str(r["question_id"]), "prompt": prompt, "response_prefix": "",
                    "kind": "code", "answer": "", "code_prefix": "", "test": json.dumps(spec),
                    "entry_point": entry})
    return out


def decode_lcb_tests(value) -> list[dict]:
    """Test cases from a JSON list, JSON text, or base64(zlib(pickle(JSON text)))."""
    if isinstance(value, list):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        return json.loads(pickled_string(zlib.decompress(base64.b64decode(value))))


_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_FRAMING_OPS = {"PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT", "STOP"}


def pickled_string(data: bytes) -> str:
    """The string a pickle of one ``str`` holds, read from its opcodes without unpickling; a
    pickle of anything else (a class, a call, a container) is a ``ValueError``."""
    text = None
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in _STRING_OPS and text is None:
                text = arg
            elif op.name not in _FRAMING_OPS:
                raise ValueError(f"refusing a pickle that is not one string (opcode {op.name})")
    except (EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"truncated or malformed pickle ({e})") from None
    if text is None:
        raise ValueError("the pickle holds no string")
    return text


BENCHMARKS = (  # prompt characters estimated from the prompt format
    Benchmark("livecodebench", load_livecodebench, (DataFile("source", "livecodebench"),),
              counted(400), 2000),
)
