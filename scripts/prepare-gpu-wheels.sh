#!/usr/bin/env bash
# Run HERE (a machine with PyPI), before a GPU check: puts into .whl/ (ignored by git) the wheels
# that the GPU machine lacks, for its Python 3.12 on manylinux x86-64. That machine has CuPy,
# numpy, click, tqdm, pytest, hypothesis and safetensors, but no jsonschema and no network.
# Then carry .whl to it (device `run` with carry [".whl"]) and run scripts/gpu-check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
# gptqfmt's runtime needs that the GPU image lacks: jsonschema and what it requires.
# attrs and typing_extensions are on that image too; carried so the set is complete anyway.
WHEELS=(jsonschema==4.26.0 referencing==0.37.0 rpds-py==0.30.0 jsonschema-specifications==2025.9.1
        attrs==26.1.0 typing_extensions==4.15.0)
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
ls .whl >&2
du -sh .whl >&2
