#!/usr/bin/env bash
# Set up dlmpipe in ./.venv: PyTorch, the package with its test extras, and the sandbox tool;
# on a SLURM login node (sbatch on PATH) also the Snakemake profile `slurm`
# (scripts/slurm-profile.sh). Idempotent: reruns only do what is missing. Override the interpreter with PYTHON=...,
# the PyTorch requirement with TORCH_SPEC=... (default torch==2.13.0: the CPU build where the
# machine provides it, the CUDA build from PyPI on a GPU node).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=.venv
stamp=$VENV/.dlmpipe-installed
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) $TORCH_SPEC"

# System packages: bubblewrap (sandboxed scoring) and a system python3 the sandbox's
# unprivileged uid can execute. Without them scoring falls back to a weaker, recorded mode.
if ! command -v bwrap >/dev/null 2>&1 || [ ! -x /usr/bin/python3 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap and python3 with apt-get"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap python3 >/dev/null) \
      || echo "setup: warning: apt-get failed; scoring will use the weaker 'process' isolation"
  else
    echo "setup: bubblewrap not found and not root: install it (e.g. 'sudo apt-get install bubblewrap')" \
         "for full sandboxing; scoring falls back to the weaker 'process' isolation meanwhile"
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
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x $VENV/bin/python ] || "$PYTHON" -m venv $VENV
  echo "setup: installing $TORCH_SPEC and dlmpipe into $VENV"
  pip_install "$TORCH_SPEC"
  pip_install -e ".[test]"
  $VENV/bin/python -c "import torch, snakemake, dlmpipe; print('setup: torch', torch.__version__, '| cuda:', torch.cuda.is_available())"
  echo "$want" > "$stamp"
fi

# SLURM login node: `snakemake --profile slurm` finds profiles/slurm (an existing profile named
# slurm, the user's or the site's, is left as it is; the script then says how to use ours)
if command -v sbatch >/dev/null 2>&1; then
  PYTHON=$VENV/bin/python bash scripts/slurm-profile.sh
fi
