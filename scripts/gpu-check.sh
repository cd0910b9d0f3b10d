#!/usr/bin/env bash
# One call on a GPU machine (under 5 minutes): the GPU tests, GPU-vs-CPU equality on every fixture,
# and the kernel benchmark. Run from the repository root; installs what it needs first.
set -uo pipefail
cd "$(dirname "$0")/.."
export GPTQFMT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
python3 -c "import cupy" 2>/dev/null || python3 -m pip install -q cupy-cuda12x || exit 2
python3 -m pip install -q -e '.[test]' || exit 2
python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_kernel_host.py
rc=$?
python3 bench/kernel_bench.py || rc=1
exit $rc
