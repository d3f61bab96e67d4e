#!/usr/bin/env bash
# Write scripts/constraints.txt: the version of every package dlmpipe[test,lm-eval] needs, torch
# aside (setup installs TORCH_SPEC), as pip resolves them today in a fresh venv of the interpreter
# setup chooses (scripts/venv-python.sh). scripts/setup.sh installs with it as constraints, so each
# setup gets the same versions, whichever installer it runs (uv or pip), and a new release upstream
# changes nothing until this runs again. Run it after changing pyproject.toml's dependencies
# (`make lock`; tests/test_environment.py fails while the file no longer satisfies them) and
# commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PYTHON=$(bash scripts/venv-python.sh)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install -q --no-compile)
"${pip[@]}" "pip>=26"
"${pip[@]}" "$TORCH_SPEC"
"${pip[@]}" -e ".[test,lm-eval]"  # pip's own resolution: the newest versions that fit together
{
  echo "# The versions scripts/setup.sh installs dlmpipe[test,lm-eval] with, torch aside: made by"
  echo "# scripts/lock.sh (make lock) on $(date -u +%F) with $("$work/venv/bin/python" -c 'import platform; print("Python", platform.python_version(), "on", platform.system(), platform.machine())') from"
  echo "# pyproject.toml's requirements. Constraints, not requirements: a package another platform or"
  echo "# Python needs that is not named here installs at what its installer resolves."
  "$work/venv/bin/python" -m pip freeze --exclude-editable --exclude torch
} > scripts/constraints.txt
echo "lock: wrote scripts/constraints.txt ($(grep -vc '^#' scripts/constraints.txt) packages)"
