#!/bin/bash
# The independent release checks (issue 40), end to end: tiny checkpoints (main venv), each
# release's own code (RELEASE_PYTHON: a release venv, see docs/METHODS.md "The decode trace"),
# dlmpipe's side (main venv), then the table (compare.py).
#   scripts/release_check/run.sh RELEASE_PYTHON RELEASES_DIR [fast_dllm_v2|sdar|dinfer|all] [OUT]
# RELEASES_DIR holds the checkouts as owner+name folders (JetAstra+SDAR, inclusionAI+dInfer,
# Satgoy152+DualDiffusion, ydshi0+Fast-dLLM). Overrides: FAST_DLLM_GF (generation_functions.py at
# upstream 8292f3c; default RELEASES_DIR/ydshi0+Fast-dLLM/v2/generation_functions.py), V2_HUB (the
# folder with the hub's modeling.py and configuration.py), STUBS (the stand-ins' folder),
# VLLM_STUB_MAKER (make_vllm_stub.py), SHARED_RELEASES (default ../shared/releases). OUT (default results/release_check): checkpoints, runs, tables.
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n 2,10p "$0"; exit 2; }
RPY=$1 REL=$(realpath "$2") WHICH=${3:-all}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${4:-$REPO/results/release_check}" && realpath "${4:-$REPO/results/release_check}")
PY=${MAIN_PYTHON:-$REPO/.venv/bin/python}
SHARED=${SHARED_RELEASES:-$REPO/../shared/releases}  # the stand-ins beside the checkout
STUBS=${STUBS:-$SHARED/stubs}
FAST_DLLM_GF=${FAST_DLLM_GF:-$REL/ydshi0+Fast-dLLM/v2/generation_functions.py}
V2_HUB=${V2_HUB:-$REL/Satgoy152+DualDiffusion/FastDLLM_inferencing/Fast_dLLM_v2_7B}
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
cd "$REPO"
main() { PYTHONPATH=$REPO nice -n 10 "$PY" -m "scripts.release_check.$@"; }
release() { local path=$1; shift; PYTHONPATH=$REPO:$path nice -n 10 "$RPY" -m "scripts.release_check.$@"; }

# the stand-ins, as ../shared/releases/README.md says: flash_attn and sitecustomize.py on the
# path, triton only while SDAR's remote code is imported, the vLLM stand-in for dInfer
mkdir -p "$OUT/stubs/path" "$OUT/stubs/triton"
ln -sfn "$STUBS/flash_attn" "$OUT/stubs/path/flash_attn"
ln -sfn "$STUBS/sitecustomize.py" "$OUT/stubs/path/sitecustomize.py"
ln -sfn "$STUBS/triton" "$OUT/stubs/triton/triton"

check() {
  local r=$1 t0=$SECONDS
  echo "== $r" >&2
  case $r in
    fast_dllm_v2) main checkpoints "$OUT/ckpt" $r --v2-hub "$V2_HUB" ;;
    sdar) main checkpoints "$OUT/ckpt" $r --sdar "$REL/JetAstra+SDAR" ;;
    dinfer) main checkpoints "$OUT/ckpt" $r --dinfer "$REL/inclusionAI+dInfer"
            [[ -d "$OUT/stubs/vllm/vllm" ]] || "$RPY" "${VLLM_STUB_MAKER:-$SHARED/make_vllm_stub.py}" "$OUT/stubs/vllm" >/dev/null ;;
  esac
  for dt in float32 float64; do
    case $r in
      fast_dllm_v2) release "$OUT/stubs/path" release_v2 "$FAST_DLLM_GF" "$OUT/ckpt" $dt "$OUT/${r}_release_$dt.json" ;;
      sdar) release "$OUT/stubs/path" release_sdar "$REL/JetAstra+SDAR" "$OUT/stubs/triton" "$OUT/ckpt" $dt "$OUT/${r}_release_$dt.json" ;;
      dinfer) release "$OUT/stubs/vllm" release_dinfer "$REL/inclusionAI+dInfer" "$OUT/ckpt" $dt "$OUT/${r}_release_$dt.json" ;;
    esac 2> >(grep -v -e store_kv -e torch_dtype -e unused_keys -e not_inited_keys >&2)
  done
  main dlm_side $r "$OUT/ckpt" "$OUT/${r}_dlmpipe.json" --release-json "$OUT/${r}_release_float64.json"
  main compare $r "$OUT/${r}_release_float32.json" "$OUT/${r}_release_float64.json" \
    "$OUT/${r}_dlmpipe.json" | tee "$OUT/${r}_table.txt"
  echo "($r: $((SECONDS - t0)) s)" >&2
}
if [[ $WHICH == all ]]; then for r in fast_dllm_v2 sdar dinfer; do check $r; done; else check "$WHICH"; fi
