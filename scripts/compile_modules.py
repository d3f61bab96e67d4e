"""Byte-compile the modules dlmpipe's jobs and tests import, on every core (scripts/setup.sh
says why it compiles at all).

``python -m compileall -j N`` hands its workers one file at a time: on a 2-core VM that cost
more CPU than the compiling itself (~8,700 files of the packages beside torch: 38-41 CPU s and
21-23 s wall, where workers given chunks of files take 19-22 CPU s and 10-15 s; issue 46).
compileall's own ``compile_file`` does each file here, so what is written is what compileall
writes, and like pip's install this skips what this Python cannot compile (torch's
py312_intrinsics.py on 3.11).

    python scripts/compile_modules.py FOLDER...
"""
from __future__ import annotations

import compileall
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial

#: left out: packages' own test suites, pip (setup alone runs it), and transformers' model
#: families other than the ones its tokenizer and config classes import (a module imported from
#: there anyway is compiled in memory, correct but slower)
SKIP = re.compile(r"/tests?/|/pip/|/transformers/models/(?!(auto|llama|qwen2|qwen3|olmoe)/)[^/]+/")


def sources(folders: list[str]) -> list[str]:
    """The ``.py`` files under ``folders`` that ``SKIP`` leaves in, sorted (chunks of neighbours:
    a package's files share their folders)."""
    out = []
    for top in folders:
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            out += [path for name in files if name.endswith(".py")
                    and not SKIP.search(path := os.path.join(folder, name))]
    return sorted(out)


def main(folders: list[str]) -> int:
    files = sources(folders)
    with ProcessPoolExecutor() as pool:  # one worker per core
        compiled = list(pool.map(partial(compileall.compile_file, quiet=2), files, chunksize=32))
    print(f"compile_modules: {sum(compiled)} of {len(files)} modules compiled or up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
