#!/usr/bin/env bash
# One call on a GPU machine (a few minutes): the GPU tests, GPU-vs-CPU equality on every fixture,
# and the kernel benchmark. Run from the repository root. The GPU machine has no network: first
# run scripts/prepare-gpu-wheels.sh on a machine with PyPI, and carry .whl/ along. Nothing is
# downloaded here; the package itself runs from this tree (PYTHONPATH), so no build either.
set -uo pipefail
cd "$(dirname "$0")/.."
export GPTQFMT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
python3 -c "import cupy" || { echo "gpu-check: CuPy does not import here" >&2; exit 2; }
site=$(mktemp -d)
if ! python3 -c "import jsonschema, referencing" 2>/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || {
        echo "gpu-check: jsonschema is missing and .whl/ holds no wheels: run" \
             "scripts/prepare-gpu-wheels.sh where PyPI is reachable, and carry .whl" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl || exit 2
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import gptqfmt, jsonschema; print('gptqfmt', gptqfmt.__version__, 'from', gptqfmt.__file__)" || exit 2
python3 -m pytest -q -p no:cacheprovider -o addopts=--strict-markers -m gpu tests/unit/test_cupy_backend_gpu.py tests/unit/test_gptq_dequant.py
rc=$?
python3 bench/kernel_bench.py || rc=1
exit $rc
