#!/usr/bin/env bash
# The one device call that measures every GPU figure of docs/benchmarks.md (issue 22), from the repo root:
#   run tool: command "bash benchmarks/gpu_run.sh", carry [".whl"], timeout_s 600
# .whl holds the cp312 manylinux wheels the GPU image lacks (pydantic, zarr, tiffslide, openslide,
# imagecodecs, dask/distributed, ...; how to fetch them: the "gpu-check" part of docs/benchmarks.md).
# The repo is imported from this source tree (PYTHONPATH), so no install of it is needed there.
# Writes into $OUT (./gpu-suite-out without it): gpu-tests.xml/.log, gpu_suite.csv/.md/.log, benchmarks.md.
set -u
OUT=${OUT:-gpu-suite-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl || { echo "wheel install failed: is .whl carried?" >&2; exit 3; }
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.csv" 2>&1
# the gpu-marked tests first (hard limit 90 s); the suite reads their JUnit report
timeout -k 5 90 python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" \
  >"$OUT/gpu-tests.log" 2>&1
echo "pytest -m gpu: exit $?"; tail -5 "$OUT/gpu-tests.log"
python3 benchmarks/gpu_suite.py --out "$OUT" --docs docs/benchmarks.md --gpu-tests-junit "$OUT/gpu-tests.xml" \
  2>&1 | tee "$OUT/gpu_suite.log"
rc=${PIPESTATUS[0]}
cp docs/benchmarks.md "$OUT/benchmarks.md"
exit "$rc"
