"""Turning a decoded completion into what gets scored: a program, or a final answer.

Diffusion models fill the whole response budget, so a completion often carries prose, a second
code block, self-tests or a truncated tail after the code that answers the task. Extraction is
cheap and linear on purpose (EvalPlus's ``sanitize`` grows roughly cubically with line count):
cut at the stop token, take the fenced code, then make it entry-point aware.

Code (``program_for``):
1. cut at the first special stop string (``<|endoftext|>``, ``<|im_end|>``, ``<|eot_id|>``...);
2. when the task's ``response_prefix`` left a code fence open (Saber's "Here is the completed
   function:\n```python\n<prompt>"), the completion continues that block and the code ends at
   its closing (bare) fence, unless the completion opens a block of its own (```python);
   otherwise take the fenced block that defines the entry point (else the first block), or the
   raw text when there is no fence;
3. if that code defines the entry point it is a whole program (the task's ``code_prefix`` still
   goes first, when it parses on its own, for imports and helper functions the prompt defined);
   otherwise it continues ``code_prefix`` (the program is ``code_prefix + code``);
4. for function tasks, top-level self-tests are dropped (``assert``, ``if __name__ ==
   "__main__"``, bare calls to ``print``/``input`` or to functions the program defines) and a
   truncated tail that does not parse is cut back to the longest prefix that does.

Final answers of math, choice and label tasks: ``dlmpipe/scoring/extraction.py``.
"""
from __future__ import annotations

import ast
import re
import warnings

# parsing model output must not spam the scorer's log with its invalid escape sequences
for _category in (DeprecationWarning, SyntaxWarning):
    warnings.filterwarnings("ignore", message="invalid escape sequence", category=_category)

STOP_STRINGS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|EOT|>",
                "<|end|>", "</s>", "<eos>", "<|eos|>")
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n`]*$", re.M)
_MAX_TRIMS = 400


def cut_at_stop(text: str, stops: tuple[str, ...] = STOP_STRINGS) -> str:
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def leaves_fence_open(prefix: str) -> bool:
    return len(_FENCE.findall(prefix)) % 2 == 1


def fenced_blocks(text: str) -> list[str]:
    """Code inside ``` fences, in order; an unclosed last block runs to the end of the text."""
    blocks, fences = [], list(_FENCE.finditer(text))
    for i in range(0, len(fences), 2):
        start = fences[i].end() + 1
        end = fences[i + 1].start() if i + 1 < len(fences) else len(text)
        blocks.append(text[start:end] if start <= end else "")
    return blocks


def defines(code: str, entry_point: str) -> bool:
    """Top-level ``def entry_point(`` (or LiveCodeBench's ``class Solution``)."""
    if not entry_point:
        return False
    pattern = rf"^(async\s+)?def\s+{re.escape(entry_point)}\s*\(|^class\s+Solution\b"
    return re.search(pattern, code, re.M) is not None


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def code_from_completion(completion: str, entry_point: str = "", response_prefix: str = "") -> str:
    """The code the model wrote (steps 1-2 above), before assembly with ``code_prefix``."""
    text = cut_at_stop(completion)
    if leaves_fence_open(response_prefix):
        first = _FENCE.search(text)
        if not (first and first.group(1)):
            # a bare ``` closes the block the prefix opened: the code ends there (an opening
            # fence carries a language tag: the model started a block of its own, e.g. when the
            # prefix was not given to it)
            return text[: first.start()] if first else text
    blocks = fenced_blocks(text)
    if not blocks:
        return text
    for block in blocks:
        if defines(block, entry_point):
            return block
    return blocks[0]


def program_for(completion: str, *, entry_point: str = "", code_prefix: str = "",
                response_prefix: str = "", sanitize_program: bool = True) -> str:
    """The program to execute for one completion of a code task (steps 1-4 above)."""
    code = code_from_completion(completion, entry_point, response_prefix)
    if defines(code, entry_point):
        program = f"{code_prefix.rstrip()}\n\n\n{code}" if code_prefix and parses(code_prefix) else code
    else:
        program = code_prefix + code
    if entry_point and sanitize_program:
        program = sanitize(program, entry_point)
    return program


def _longest_parsable(code: str) -> str | None:
    lines = code.splitlines(keepends=True)
    for n in range(len(lines) - 1, max(len(lines) - 1 - _MAX_TRIMS, 0), -1):
        candidate = "".join(lines[:n])
        if parses(candidate):
            return candidate
    return None


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
    consts = [n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant)]
    return "__name__" in names and "__main__" in consts


def sanitize(program: str, entry_point: str) -> str:
    """Drop top-level self-tests and an unparsable tail; keep everything else verbatim."""
    if not parses(program):
        program = _longest_parsable(program) or program
        if not parses(program):
            return program
    tree = ast.parse(program)
    defined = {n.name for n in tree.body
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    drop_calls = {"print", "input", "exit", "quit"} | defined
    drop = []
    for node in tree.body:
        if isinstance(node, ast.Assert) or _is_main_guard(node):
            drop.append(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Name) and func.id in drop_calls:
                drop.append(node)
    if not drop:
        return program
    lines = program.splitlines(keepends=True)
    for node in reversed(drop):
        lines[node.lineno - 1:node.end_lineno] = []
    return "".join(lines)
