#!/usr/bin/env bash
# Set up dlmpipe in ./.venv: PyTorch, the package with its test and lm-eval extras, the sandbox tool and
# (as root) headless chromium for the report's browser test;
# on every machine also the Snakemake profile `slurm`
# (scripts/slurm-profile.sh). Idempotent: reruns only do what is missing. Override the
# interpreter with PYTHON=..., the PyTorch requirement with TORCH_SPEC=... (default
# torch==2.13.0: the CPU build where the machine provides it, the CUDA build from PyPI on a GPU
# node).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=.venv
stamp=$VENV/.dlmpipe-installed
want="$(cat pyproject.toml scripts/constraints.txt scripts/setup.sh | sha256sum | cut -c1-16) $TORCH_SPEC"

# System packages: bubblewrap (sandboxed scoring), a system python3 the sandbox's unprivileged
# uid can execute, and libseccomp (the seccomp layer of the opt-in process level). Scoring
# requires bubblewrap: without it `make campaign` and every score job stop before running any
# generated code, unless the campaign opts in to the weaker process level (docs/SCORING.md).
if ! command -v bwrap >/dev/null 2>&1 || [ ! -x /usr/bin/python3 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap, python3 and libseccomp2 with apt-get"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap python3 libseccomp2 >/dev/null) \
      || echo "setup: warning: apt-get could not install bubblewrap; scoring will refuse to run" \
              "until it is installed ('sudo apt-get install bubblewrap') or the campaign opts in to" \
              "the weaker isolation ('sandbox: process' in config.yaml, docs/SCORING.md)"
  else
    echo "setup: warning: bubblewrap not found and not root: install it ('sudo apt-get install" \
         "bubblewrap'); until then scoring refuses to run unless the campaign opts in to the" \
         "weaker isolation ('sandbox: process' in config.yaml, docs/SCORING.md)"
  fi
fi

# Chromium, headless: only the test that opens the `snakemake --report` page in a browser
# (tests/test_report_browser.py) uses it; it skips, saying why, where chromium is missing.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium with apt-get (the report's browser test)"
  log=$(mktemp)
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >"$log" 2>&1 \
    || { tail -n 5 "$log" >&2; echo "setup: warning: apt-get could not install chromium; the report's browser test will skip"; }
  rm -f "$log"
fi

# The venv's interpreter: PYTHON, else the distribution's python3 (scripts/venv-python.sh says why)
PYTHON=$(bash scripts/venv-python.sh)
# A venv cannot change its interpreter: one made with another (an earlier setup's choice, or
# another PYTHON) is made again, and everything installed anew
if [ -x $VENV/bin/python ]; then
  real='import os, sys; print(os.path.realpath(sys.executable))'
  made=$($VENV/bin/python -c "$real" 2>/dev/null || true)
  chosen=$("$PYTHON" -c "$real" 2>/dev/null || true)
  if [ -n "$chosen" ] && [ "$made" != "$chosen" ]; then
    echo "setup: making $VENV again with $PYTHON (it runs on ${made:-an interpreter that is gone})"
    rm -rf $VENV
  fi
fi

pip_install() {
  local log
  log=$(mktemp)
  if ! $VENV/bin/python -m pip install -q "$@" >"$log" 2>&1; then
    grep -v "is ignored" "$log" >&2 || true
    echo "setup: 'pip install $*' failed" >&2
    exit 1
  fi
  rm -f "$log"
}
# dlmpipe with its test and lm-eval extras (lm-eval: an optional extra the tests use,
# dlmpipe/lmeval/), each package at the version scripts/constraints.txt pins (scripts/lock.sh
# writes it), torch kept as installed. With uv where pip can install it: uv installs the ~140
# packages in 2-8 s where pip takes 25-35 CPU s, most of it reading index pages and unpacking
# (issue 46); the pins make it install what pip would. uv reads no pip configuration: torch,
# which pip may take from a file or an index the machine's pip configuration names, is installed
# by pip before this, and where uv cannot install (a site whose packages come only through
# pip's configured mirror) pip installs the rest, with the same pins.
install_project() {
  local pins
  pins=$(mktemp)
  $VENV/bin/python -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > "$pins"
  if ! { $VENV/bin/python -m pip install -q --no-compile "uv>=0.9" >/dev/null 2>&1 &&
         $VENV/bin/uv pip install -q --python $VENV/bin/python -c scripts/constraints.txt -c "$pins" \
           -e ".[test,lm-eval]"; }; then
    echo "setup: note: uv could not install dlmpipe's packages; installing them with pip (slower)"
    pip_install --no-compile -c scripts/constraints.txt -c "$pins" -e ".[test,lm-eval]"
  fi
  rm -f "$pins"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  started=$(date +%s.%N) times_at_start=$(mktemp)
  times > "$times_at_start"  # a builtin: this shell's CPU and its children's (not a subshell's)
  if [ ! -x $VENV/bin/python ]; then
    echo "setup: creating $VENV with $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
    "$PYTHON" -m venv $VENV
  fi
  echo "setup: installing $TORCH_SPEC and dlmpipe into $VENV"
  # A recent pip first: resolving this project's ~150 packages is mostly parsing index pages,
  # which pip 26 does in about a third of the CPU time of the pip a venv bundles (Python 3.11's
  # 23.2: 25 -> 10 CPU s here; issue 46). Where it cannot be fetched the bundled pip still works.
  $VENV/bin/python -m pip install -q --no-compile "pip>=26" >/dev/null 2>&1 \
    || echo "setup: note: could not upgrade pip in $VENV; installing with its bundled pip (slower)"
  pip_install --no-compile "$TORCH_SPEC"
  install_project
  # Byte-compile here, on every core, what dlmpipe's jobs and tests import: pip would compile
  # every module of every package on one core (half the install: ~300 MB of source), and where
  # PYTHONDONTWRITEBYTECODE is set (CI's environment) Python caches nothing it compiles later,
  # so a module left uncompiled is compiled again by every process that imports it. Left out
  # (scripts/compile_modules.py): packages' own test suites, pip, and transformers' model
  # families other than the ones dlmpipe reads. dlmpipe's own modules too (an editable install,
  # which no installer compiles). Issue 46: compiling every module took ~45 s here; compiling
  # these, handed to each core in chunks, takes 17 s (33 CPU s).
  purelib=$($VENV/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  $VENV/bin/python scripts/compile_modules.py "$purelib" dlmpipe >/dev/null
  $VENV/bin/python -c "import torch, snakemake, dlmpipe; print('setup: torch', torch.__version__, '| cuda:', torch.cuda.is_available())"
  echo "$want" > "$stamp"
  # what this install took (wall and CPU seconds, its commands' included), for the suite's cost
  # estimate (benchmarks/cost_by_part.py suite: make test from a fresh clone is setup + tests)
  times_at_end=$(mktemp); times > "$times_at_end"
  awk -v start="$started" -v end="$(date +%s.%N)" -v first="$times_at_start" '
    function s(t) { split(t, a, /[ms]/); return a[1] * 60 + a[2] }
    { cpu += (FILENAME == first ? -1 : 1) * (s($1) + s($2)) }
    END { printf "{\"wall_s\": %.1f, \"cpu_s\": %.1f}\n", end - start, cpu }' \
    "$times_at_start" "$times_at_end" > $VENV/.dlmpipe-setup-time.json
  rm -f "$times_at_start" "$times_at_end"
fi

# On every machine, `snakemake --profile slurm` finds profiles/slurm (an existing profile named
# slurm, the user's or the site's, is left as it is; the script then says how to use ours). Where
# SLURM's commands are missing, a run with it stops before any job, saying how to run here.
PYTHON=$VENV/bin/python bash scripts/slurm-profile.sh
