# dsv4bench: `make test` checks everything a CPU can check; `make bench` runs the main sweep.
PYTHON ?= python3
ARCH ?=
OUT ?=
RUNS ?= runs
GPUS ?=
SHARD ?=
SPECS ?=

.PHONY: install ensure test test-slow bench report lint gpu-test kernels

# A CPU-only machine gets the CPU build of torch first, so pip never pulls CUDA wheels.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e ".[dev]"

# GPU machines without a registry already have what the suite needs: install only if missing.
ensure:
	@$(PYPATH) $(PYTHON) -c "import torch, yaml, matplotlib, dsv4bench" 2>/dev/null || $(MAKE) install

# benchmarks/ runs once per case as a test (--benchmark-disable: no timing table). Two test
# processes (pytest-xdist), each taking whole files, so module fixtures are built once. Target:
# under 3 minutes on 2 quiet cores (about 2; one process: about 3.5).
test: install
	$(PYTHON) -m pytest -q -rs --benchmark-disable -n 2 --dist loadfile -m "not slow and not gpu"

# The tests marked `slow`, at full size: the oracle's memory bound at FlashMLA's prefill
# benchmark shape (32768 tokens x 64 heads x top-640) on the CPU, and the serving model's
# sampled cases on the oracle. About 2 minutes on 2 cores; CI runs it after `make test`.
test-slow: install
	$(PYTHON) -m pytest -q -rs -m slow

# Kernels found without extra environment: PYTHONPATH is prepended to (never replaced, so
# FlashInfer or DeepGEMM put on it stay visible); the backends find the builds that
# `dsv4bench kernels fetch` (make kernels) put in .kernels/, and a checkout carrying packed
# builds (.kpack/*.tar.xz, from `dsv4bench kernels pack`) unpacks them there first.
KERNELS = $(if $(wildcard .kpack/*.tar.xz),$(PYPATH) $(PYTHON) -m dsv4bench.cli kernels unpack &&)
PYPATH = PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH}

# the kernel builds engines ship (vLLM 0.33.0/0.26.0, sgl-flash-mla 1.0.0, FlashInfer
# 0.7.2.post1/0.6.18) into .kernels/ (needs a package registry; SPECS=vllm==0.33.0 for fewer)
kernels: ensure
	$(PYPATH) $(PYTHON) -m dsv4bench.cli kernels fetch $(SPECS)

# without a CUDA GPU every test marked gpu skips and the run exits 5 ("no CUDA GPU: 0 tests ran")
gpu-test: ensure
	$(KERNELS) $(PYPATH) $(PYTHON) -m pytest -q -rs -m gpu

# every visible GPU (one worker each) unless GPUS=0,1 names some; SHARD=I/N runs one shard
bench: ensure
	$(KERNELS) $(PYPATH) $(PYTHON) -m dsv4bench.cli bench $(if $(ARCH),--arch $(ARCH)) $(if $(OUT),--out $(OUT)) $(if $(GPUS),--gpus $(GPUS)) $(if $(SHARD),--shard $(SHARD)) --runs $(RUNS)

# the run `make bench` made (OUT, else the newest of runs/) reported beside its rows; a committed
# run is reported elsewhere: `python -m dsv4bench.cli report RUN_DIR` writes reports/<name>/
report: ensure
	$(PYPATH) $(PYTHON) -m dsv4bench.cli report --in-place $(if $(OUT),$(OUT),$$(ls -d $(RUNS)/*/ | tail -n 1))

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
