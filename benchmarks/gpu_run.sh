#!/usr/bin/env bash
# ONE device call for every GPU figure of docs/benchmarks.md: run tool, command "bash benchmarks/gpu_run.sh",
# carry [".whl"] (cp312 wheels the GPU image lacks; docs/benchmarks.md "GPU suite" says how to fetch them).
# The repo goes in editable (its finder maps wsi.models etc. to the top folders; a plain install is
# shadowed by ./wsi); PYTHONPATH reads no .pth, so a sitecustomize runs the editable one.
set -u
OUT=${OUT:-gpu-suite-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl || { echo "wheel install failed: is .whl carried?" >&2; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site -e . \
  || { echo "editable install of the repo failed (setuptools >= 68 and wheel needed)" >&2; exit 3; }
echo 'import site; site.addsitedir("/tmp/site")  # runs the editable .pth' >/tmp/site/sitecustomize.py
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import wsi.models, wsi.pipelines.embed, tiffslide, openslide, zarr, pydantic, distributed" || exit 3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.csv" 2>&1
# the gpu-marked tests first (hard limit 90 s); the suite reads their JUnit report
timeout -k 5 90 python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" \
  >"$OUT/gpu-tests.log" 2>&1
echo "pytest -m gpu: exit $?"; tail -5 "$OUT/gpu-tests.log"
# SECTIONS=feed,decoders (say) runs only those (the docs' gpu-suite table then holds only them)
python3 benchmarks/gpu_suite.py --out "$OUT" --docs docs/benchmarks.md --gpu-tests-junit "$OUT/gpu-tests.xml" \
  ${SECTIONS:+--sections "$SECTIONS"} 2>&1 | tee "$OUT/gpu_suite.log"
rc=${PIPESTATUS[0]}
cp docs/benchmarks.md "$OUT/benchmarks.md"
# EXTRA_SECTIONS=long-1m (issue 34: 1,000,000 tiles end to end in one process) runs after the suite, into
# $OUT/extra, without touching the docs; EXTRA_BUDGET_S seconds (default 420)
if [ -n "${EXTRA_SECTIONS:-}" ]; then
  python3 benchmarks/gpu_suite.py --sections "$EXTRA_SECTIONS" --out "$OUT/extra" \
    --budget-s "${EXTRA_BUDGET_S:-420}" 2>&1 | tee "$OUT/gpu_suite_extra.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
exit "$rc"
