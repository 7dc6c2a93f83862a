#!/usr/bin/env bash
# Wheels for the GPU machine, whose image has torch and transformers but reaches no package index:
# the packages Palestra needs that the image lacks, at the versions of this checkout's .venv, for its
# Python 3.12, plus Palestra's own wheel (its domains are entry points, found through its metadata).
# Written to .whl/ (ignored by git); the device command then starts with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
# and runs bench/gpu_check.sh with PYTHON=python3 (docs/gpu.md). About 9 MiB; with trl 12 MiB.
# Usage: bench/gpu_wheels.sh [--trl]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# what the image lacks (read from its package list, docs/gpu.md): the store, configs, verifiers
names=(SQLAlchemy pydantic pydantic_core annotated-types typing-inspection hydra-core omegaconf math-verify
       latex2sympy2_extended jsonschema jsonschema-specifications referencing rpds-py)
[ "${1:-}" = "--trl" ] && names+=(trl datasets dill multiprocess)
pins=()
for name in "${names[@]}"; do
    pin=$("$PY" -m pip freeze 2>/dev/null | grep -i -E "^${name//[-_]/[-_]}==" || true)
    [ -n "$pin" ] || { echo "gpu wheels: $name is not installed in $PY's environment" >&2; exit 1; }
    pins+=("$pin")
done
rm -rf .whl && mkdir -p .whl
platforms=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_34; do
    platforms+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "${pins[@]}"
# hydra-core 1.3 needs antlr4 4.9.3, published as source only: built here, pure Python
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl .
rm -rf build
du -sh .whl
