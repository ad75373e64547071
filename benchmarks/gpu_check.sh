#!/usr/bin/env bash
# One short, prepared GPU check for a lent NVIDIA machine (see README "GPU check").
# Installs nothing from the network. Pure-Python/binary wheels the image lacks (msgspec, orjson,
# cupti-python) travel in ./.whl (git-ignored; fill it with `make gpu-wheels` here, carry `.whl`)
# and are unpacked into the scratch dir. Budget: under 5 minutes (each step has a hard timeout).
#
# $OUT (default ./out/gpu) gets at most 8 plain files, the only ones that come back from a lent
# machine: env.txt, gpu_check.log, kernels_gpu.{csv,md}, capture_check.{csv,md,json}, extras.tar.gz
# (small side files). Every CSV row and markdown table carries the date and the GPU name.
# Everything else (run dirs, raw traces, caches) stays in $SCRATCH. A failed step does not stop
# the next; the exit status is 1 if any step failed, 2 without a usable CUDA GPU.
# To commit: append the rows of kernels_gpu.csv to benchmarks/results/kernels_gpu.csv and those of
# capture_check.csv to benchmarks/results/capture_gpu.csv (same columns), and keep the .md tables
# as benchmarks/results/{kernels,capture}_gpu_<gpu>.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out/gpu}"
SCRATCH="${GPU_CHECK_SCRATCH:-/tmp/fusionlens-gpu-check}"
TOTAL_S="${GPU_CHECK_TOTAL_S:-285}"  # the whole script's budget: under 5 minutes
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FUSIONLENS_DATA_DIR="$SCRATCH/data"

step() {  # step NAME TIMEOUT_S CMD...: run one part under a hard timeout, keep going on failure
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  [ "$rc" = 124 ] && echo "=== $name TIMED OUT after ${limit}s"
  echo "=== $name rc=$rc in $((SECONDS - t0))s"
  [ "$rc" = 0 ] || status=1
}

main() {
  status=0
  if ls .whl/*.whl >/dev/null 2>&1; then
    if timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SCRATCH/site" .whl/*.whl; then
      export PYTHONPATH="$PYTHONPATH:$SCRATCH/site"
      echo "gpu_check: installed $(ls .whl | tr '\n' ' ')"
    else
      echo "gpu_check: WARNING: installing .whl failed (pip says why above; wheels are for the image's Python 3.12): msgspec/orjson/cupti imports will fail"
    fi
  else
    echo "gpu_check: WARNING: no .whl/ carried (run 'make gpu-wheels' and carry .whl): msgspec/orjson/cupti imports will fail"
  fi
  {
    echo "date_utc $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit \
      --format=csv 2>&1 || echo "nvidia-smi: not available"
    timeout 60 "$PY" - <<'EOF'
import importlib.metadata as md, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "triton", "numpy", "pandas", "pyarrow", "msgspec", "orjson", "nvidia-ml-py", "cupti-python",
             "cuda-bindings", "nvidia-cuda-cupti", "pytest", "pytest-xdist", "pytest-timeout", "transformers",
             "liger-kernel", "apex"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} (not installed)")
import torch
print("torch.version.cuda", torch.version.cuda, "cuda_available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs",
          f"{p.total_memory / 2**30:.1f} GiB", f"L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB")
EOF
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
  if ! timeout 60 "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "gpu_check: no CUDA GPU usable from $PY (torch missing, a CPU build, or no driver): nothing to check here"
    return 2
  fi
  # Triton tests at real sizes: 8 workers compile the ~200 kernel variants in parallel (one GPU).
  step kernel_tests 110 "$PY" -m pytest -q -p no:cacheprovider -o addopts= -n 8 --timeout 100 -rfE \
    tests/kernels -k cuda
  step capture_check 100 "$PY" benchmarks/gpu/capture_check.py --out "$OUT" --scratch "$SCRATCH/capture" \
    --worker-timeout-s 40
  # Decode-size calls (one row, hidden 4096): the launch rate of ours against eager, with and
  # without the provider-choice memo, then 24 greedy tokens of a small Llama (transformers, if the
  # image has it); rows (written per case) go into extras.tar.gz as capture/dispatch_gpu.csv.
  # Only when it leaves the kernel benchmarks their 80 s: the worst case stays under 5 minutes.
  if [ $((TOTAL_S - SECONDS)) -ge 110 ]; then
    step dispatch 30 "$PY" benchmarks/bench_dispatch.py --device cuda --hidden 4096 --rounds 5 --inner 500 \
      --generate 24 --csv "$SCRATCH/capture/dispatch_gpu.csv"
  else
    echo "=== dispatch skipped: $((TOTAL_S - SECONDS))s left of ${TOTAL_S}s, the kernel benchmarks come first"
  fi
  # The kernel benchmarks get what the earlier steps left of the 5 minutes (at least 80 s): they
  # stop at their budget, families in order, so a quick start buys the later families and the sweep.
  local left=$((TOTAL_S - SECONDS))
  [ "$left" -lt 80 ] && left=80
  step kernels_check "$left" "$PY" benchmarks/gpu/kernels_check.py --out "$OUT" --budget-s $((left - 25)) --skip-checks
  # Small side files (per-kernel CSVs, NVML samples, worker summaries, ceilings JSON) in one archive.
  if [ -d "$SCRATCH/capture" ]; then
    (cd "$SCRATCH" && find capture data -type f -size -4M ! -name '*.pt.trace.json' -print0 2>/dev/null \
      | tar -czf "$OUT/extras.tar.gz" --null -T - 2>/dev/null)
    [ "$(stat -c %s "$OUT/extras.tar.gz" 2>/dev/null || echo 0)" -lt $((15 * 1024 * 1024)) ] || rm -f "$OUT/extras.tar.gz"
  fi
  echo "gpu_check status=$status; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return $status
}

main "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
