#!/usr/bin/env bash
# Make `snakemake --profile slurm` use this checkout's profiles/slurm (docs/CLUSTER.md). `make
# setup` runs this on every machine, so that the command finds the profile everywhere; where
# SLURM's commands are not on PATH the workflow then stops before any job and says how to run
# the campaign locally (dlmpipe/preflight.py).
#
# Snakemake looks a profile name up in the working directory, then in the user's profile
# directory ($XDG_CONFIG_HOME/snakemake, usually ~/.config/snakemake), then in the site's
# (/etc/xdg/snakemake). This links profiles/slurm into the user's directory, the conventional
# place for one's own profiles, unless a profile named `slurm` is already found: a user's or the
# site's own profile is never replaced, nor shadowed by a user link; this then says how to use
# dlmpipe's profile instead; a dangling link to a moved or deleted checkout's profiles/slurm is
# re-pointed here. Idempotent. The interpreter asked where Snakemake looks: $PYTHON
# (default .venv/bin/python). Exit status 0 unless the link cannot be written.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
ours="$PWD/profiles/slurm"

# where Snakemake itself finds `--profile slurm` now (empty: nowhere), and the user's directory
lookup=$("$PYTHON" -c '
from snakemake.cli import get_profile_dir
from snakemake.common import get_appdirs
found = get_profile_dir("slurm")
print(found[0] if found else "")
print(get_appdirs().user_config_dir)')
found=$(sed -n 1p <<<"$lookup")
user_dir=$(sed -n 2p <<<"$lookup")
link="$user_dir/slurm"

if [ -n "$found" ]; then
  if [ "$(realpath "$found")" = "$(realpath "$ours")" ]; then
    echo "slurm-profile: 'snakemake --profile slurm' uses dlmpipe's profile ($found -> $ours)"
  else
    echo "slurm-profile: a Snakemake profile named 'slurm' already exists ($found) and is left" \
         "as it is; 'snakemake --profile slurm' uses it. For dlmpipe's profile, from the" \
         "repository root: snakemake --cores N --profile profiles/slurm"
  fi
elif [ -L "$link" ] && [ ! -e "$link" ] && [[ "$(readlink "$link")" == */profiles/slurm ]]; then
  # a dangling link to the profile of a dlmpipe checkout that has moved or gone: ours to mend
  ln -sfn "$ours" "$link"
  echo "slurm-profile: re-linked $link -> $ours (it pointed to a missing checkout):" \
       "'snakemake --profile slurm' uses dlmpipe's profile"
elif [ -e "$link" ] || [ -L "$link" ]; then
  # something Snakemake does not read as a profile (no config.yaml, a dangling link): not ours
  echo "slurm-profile: $link exists but is not a usable profile; left as it is. For dlmpipe's" \
       "profile, from the repository root: snakemake --cores N --profile profiles/slurm"
else
  mkdir -p "$user_dir"
  ln -s "$ours" "$link"
  echo "slurm-profile: linked $link -> $ours: 'snakemake --profile slurm' uses dlmpipe's profile"
fi
