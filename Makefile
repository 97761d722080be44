# Two entry points a fresh machine needs: `make demo` and `make test`.
# Both create (or reuse) .venv and install the package into it first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-heavy lint clean-demo gpu-check gpu-smoke

# TORCH=cpu: torch and torchvision from PyTorch's CPU-only wheel index first (on Linux, PyPI's torch brings
# NVIDIA's CUDA libraries, several GB, also to a machine without a GPU; docs/benchmarks.md "Install size").
# TORCH_INDEX names another index (e.g. https://download.pytorch.org/whl/cu126 for an older driver).
TORCH ?=
TORCH_INDEX ?= $(if $(filter cpu,$(TORCH)),https://download.pytorch.org/whl/cpu,)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(PY) -m pip install -q torch torchvision --index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/wsi demo --out demo-out

# one pytest worker per core, at most 4 (pytest-xdist; each worker keeps torch on one thread:
# tests/conftest.py); more would only add memory (a worker peaks near 3 GiB in the streaming tests)
# `make test` keeps to about 8 minutes on two cores: the tests marked `slow` (each 10-70 s: whole CLI
# runs in subprocesses, dask clusters, benchmark smoke runs, published-size slide encoders) and `heavy`
# (million-scale: a 4 GB bag predicted in bounded memory, 1,000,000 tokens in fp16/bf16) run in
# `make test-heavy`; CI (.ci/run) runs both, so every test runs there.
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 -m "not heavy and not slow"

test-heavy: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 -m "heavy or slow"

# mypy cannot follow setup.py's folder -> wsi.* mapping, so it checks a tree of links laid out as the
# wheel installs it (build/typecheck/wsi/{models,pipelines,configs,...}); paths in its messages read
# wsi/models/... for models/... (mypy is called by its absolute path: VENV may be relative or absolute)
TYPECHECK := build/typecheck
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/wsi
	for f in wsi/*; do ln -s ../../../$$f $(TYPECHECK)/wsi/; done
	for d in models pipelines configs; do ln -s ../../../$$d $(TYPECHECK)/wsi/$$d; done
	cd $(TYPECHECK) && $(abspath $(VENV))/bin/mypy --config-file ../../pyproject.toml

# Every GPU figure of docs/benchmarks.md on this machine's GPU in under 8 minutes: the gpu-marked tests,
# then benchmarks/gpu_suite.py, which rewrites the gpu-suite part of docs/benchmarks.md. On a lent GPU
# machine without this venv or a network, use `bash benchmarks/gpu_run.sh` (it installs carried wheels).
gpu-check: $(STAMP)
	mkdir -p gpu-suite-out
	-timeout -k 5 90 $(PY) -m pytest -m gpu -q -p no:cacheprovider --junitxml=gpu-suite-out/gpu-tests.xml
	$(PY) benchmarks/gpu_suite.py --out gpu-suite-out --docs docs/benchmarks.md \
		--gpu-tests-junit gpu-suite-out/gpu-tests.xml

# The same sections, each tiny, on the CPU: checks the suite itself (no figures written to the docs).
gpu-smoke: $(STAMP)
	$(PY) benchmarks/gpu_suite.py --smoke --out gpu-suite-smoke
