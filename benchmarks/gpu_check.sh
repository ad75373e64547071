#!/usr/bin/env bash
# One short, prepared GPU check for a lent NVIDIA machine (see README "GPU check").
# Installs nothing from the network. Pure-Python wheels the image lacks (msgspec, orjson, duckdb,
# ...) travel in ./.whl (git-ignored; fill it with `make gpu-wheels` here) and are unpacked into
# /tmp/site. Writes everything under $OUT (default ./out/gpu). Budget: under 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FUSIONLENS_DATA_DIR="${FUSIONLENS_DATA_DIR:-/tmp/fusionlens}"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
status=0
step() {  # step NAME TIMEOUT_S CMD...: run one part, keep going on failure, log to $OUT
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc"
  [ "$rc" = 0 ] || status=1
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step kernel_tests 100 "$PY" -m pytest -q -x --timeout 90 -p no:cacheprovider tests/kernels -k "cuda or triton or gpu" -o "addopts="
step kernels_bench 90 "$PY" benchmarks/gpu/kernels_check.py --out "$OUT"
step capture_check 90 "$PY" benchmarks/gpu/capture_check.py --out "$OUT"
echo "gpu_check status=$status; results in $OUT"
exit $status
