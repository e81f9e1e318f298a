#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, no network, and a Python that already has
# its own torch (e.g. torch 2.11 on Python 3.12), install tilescope from the wheels that
# benchmarks/gpu_wheels.sh fetched, run the RMSNorm study on CUDA (profiled with tilescope's
# profiler; torch.compile uses Inductor), ingest the three profiles with the analysis engine
# and print the comparison. Meant to finish in under 5 minutes.
#
# Usage: benchmarks/gpu_check.sh [WHEEL_DIR] [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${1:-gpu_wheels}
python=${2:-python3}
start=$(date +%s)
env_dir=${GPU_CHECK_VENV:-.venv-gpu}
# reuse the machine's torch: a virtualenv that sees the system site-packages
"$python" -m venv --system-site-packages "$env_dir"
py="$env_dir/bin/python"
"$py" -c "import torch, sys; assert torch.cuda.is_available(), 'no CUDA device visible'; \
print('torch', torch.__version__, 'on', torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
missing=$("$py" - <<'PY'
import importlib.util
need = {"numpy": "numpy", "ml_dtypes": "ml_dtypes", "rich": "rich", "duckdb": "duckdb", "pyarrow": "pyarrow"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PY
)
if [ -n "$missing" ]; then
    "$py" -m pip install --no-index --find-links "$wheels" $missing
fi
"$py" -m pip install --no-index --no-deps --find-links "$wheels" tilescope
out=$(mktemp -d)/rmsnorm_cuda
"$py" -m tilescope demo --device cuda --out "$out"
for dir in "$out"/*/*/*; do
    echo "== analysis of $dir"
    "$py" -m tilescope report "$dir" --top 8
done
echo "gpu check finished in $(( $(date +%s) - start )) s"
