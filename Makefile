# FusionLens: two commands do all the set-up on a fresh machine.
#   make run   - create .venv, install, start the dashboard on 127.0.0.1
#   make test  - create .venv, install (test deps and Debian's chromium too), run every test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev

# Wheels the GPU machine's image lacks (it has torch 2.11+cu130, triton, pandas, pyarrow, nvidia-ml-py,
# cuda-bindings and nvidia-cuda-cupti 13.0); carried as .whl/. cupti-python 13.0.1 matches that CUDA 13.0
# CUPTI (13.4 needs nvidia-cuda-cupti~=13.4 and pyelftools, which the image lacks: `import cupti` fails).
# liger-kernel (pure Python; needs only torch and triton) is the baseline issue 5 names for the GPU
# kernel benchmarks, which add a "liger" variant when it imports.
GPU_WHEELS := msgspec==0.23.0 orjson==3.13.0 cupti-python==13.0.1 liger-kernel==0.8.5

.PHONY: gpu-wheels run test fuzz fuzz-triton fuzz-trace fuzz-capture install install-dev chromium bench bench-ingest bench-analyses bench-kernels bench-capture bench-build bench-compiled bench-dispatch triton-aot clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): requirements.txt | $(PY)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(DEVSTAMP): requirements.txt requirements-dev.txt $(STAMP)
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

install: $(STAMP)
install-dev: $(DEVSTAMP)

# Debian's chromium for the end-to-end browser tests (never `playwright install`).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium fonts-dejavu-core fonts-noto-color-emoji >/dev/null; }

run: $(STAMP)
	$(PY) -m streamlit run app.py --server.address 127.0.0.1

test: $(DEVSTAMP) chromium
	FUSIONLENS_STRICT=1 $(PY) -m pytest -q -n 2 --timeout 900 tests

# Differential fuzzing of the kernels against eager and float64 (10 minutes; FUZZ_SECONDS, FUZZ_SEED).
fuzz: $(DEVSTAMP)
	$(PY) -m tests.kernels.fuzz --seconds $${FUZZ_SECONDS:-600} $${FUZZ_SEED:+--seed $$FUZZ_SEED}

# The same fuzzer on the Triton kernels alone: compiled on a GPU, else through Triton's CPU
# interpreter (~6 cases a second here; 10 minutes; FUZZ_SECONDS, FUZZ_SEED, and FUZZ_ARGS, e.g.
# --approximate-math).
fuzz-triton: $(DEVSTAMP)
	$(PY) -m tests.kernels.fuzz --provider triton --seconds $${FUZZ_SECONDS:-600} $${FUZZ_SEED:+--seed $$FUZZ_SEED} $${FUZZ_ARGS}

# Mutation fuzzing of trace ingestion and every analysis on the mutated traces (5 minutes;
# FUZZ_SECONDS, FUZZ_SEED).
fuzz-trace: $(DEVSTAMP)
	$(PY) -m tests.profiler.trace.fuzz_ingest --seconds $${FUZZ_SECONDS:-300} $${FUZZ_SEED:+--seed $$FUZZ_SEED}

# Random small models (layers of images and sequences, a loss, train or infer) through a real
# capture: every op counted and joined (5 minutes; FUZZ_SECONDS, FUZZ_SEED).
fuzz-capture: $(DEVSTAMP)
	$(PY) -m tests.profiler.capture.fuzz_capture --seconds $${FUZZ_SECONDS:-300} $${FUZZ_SEED:+--seed $$FUZZ_SEED}

bench: bench-ingest bench-analyses bench-kernels bench-capture

bench-ingest: $(DEVSTAMP)
	$(PY) benchmarks/bench_ingest.py

bench-analyses: $(DEVSTAMP)
	$(PY) benchmarks/bench_analyses.py

bench-kernels: $(DEVSTAMP)
	$(PY) benchmarks/bench_kernels.py

bench-capture: $(DEVSTAMP)
	$(PY) benchmarks/bench_capture.py

bench-build: $(DEVSTAMP)
	$(PY) benchmarks/bench_build.py

bench-compiled: $(DEVSTAMP)
	$(PY) benchmarks/bench_compiled_modules.py

bench-dispatch: $(DEVSTAMP)
	$(PY) benchmarks/bench_dispatch.py

# Every Triton kernel variant compiled for H100/H200 (sm_90) and A100 (sm_80) without a GPU:
# registers, spills, shared memory and load widths per variant (tests/kernels/triton_aot.py).
triton-aot: $(DEVSTAMP)
	$(PY) -m tests.kernels.triton_aot --full --arch 90 --csv benchmarks/results/triton_aot_sm90.csv --md benchmarks/results/triton_aot_sm90.md
	$(PY) -m tests.kernels.triton_aot --full --arch 80 --csv benchmarks/results/triton_aot_sm80.csv --md benchmarks/results/triton_aot_sm80.md

clean:
	rm -rf $(VENV) .fusionlens .pytest_cache

gpu-wheels: $(PY)
	rm -rf .whl && mkdir -p .whl  # one version of each: two stop the whole install there
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_WHEELS)
