#!/usr/bin/env bash
# Fetch everything benchmarks/gpu_check.sh needs, on a machine that can reach PyPI, for a GPU
# machine that cannot: a tilescope wheel and wheels of its dependencies except torch (the GPU
# machine keeps its own torch). Copy the output directory next to the repository there.
#
# Usage: benchmarks/gpu_wheels.sh [OUT_DIR] [PYTHON_VERSION] [PLATFORM]
#   defaults: gpu_wheels  3.12  manylinux2014_x86_64
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_wheels}
pyver=${2:-3.12}
platform=${3:-manylinux2014_x86_64}
pip=${PIP:-.venv/bin/pip}
mkdir -p "$out"
"$pip" wheel --no-deps --wheel-dir "$out" .
# runtime dependencies of tilescope besides torch (numpy usually comes with torch; fetch it anyway)
"$pip" download --dest "$out" --only-binary=:all: --python-version "$pyver" --platform "$platform" \
    --implementation cp numpy ml_dtypes rich markdown-it-py mdurl pygments duckdb pyarrow
ls -1 "$out"
echo "copy $out/ to the GPU machine, then run: benchmarks/gpu_check.sh $out"
