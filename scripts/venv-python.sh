#!/usr/bin/env bash
# Print the interpreter scripts/setup.sh makes .venv with: PYTHON if given; else the
# distribution's python3 (DISTRO_PYTHON, default /usr/bin/python3) where it is 3.10+ and can make
# a venv; else python3 on PATH. Distributions build theirs with PGO and LTO, linked statically:
# this project's Python (pytest, Snakemake's DAG, pip, the decode loop's glue around each torch
# call) runs ~25% faster on it than on an unoptimized shared build such as pyenv's default
# (issue 46: a pure-Python loop 1.07 -> 0.80 s; decode-bound test files 8% faster).
set -euo pipefail
if [ -n "${PYTHON:-}" ]; then
  echo "$PYTHON"
elif "${DISTRO_PYTHON:-/usr/bin/python3}" -c \
    'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
  echo "${DISTRO_PYTHON:-/usr/bin/python3}"
else
  echo python3
fi
