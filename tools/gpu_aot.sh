#!/usr/bin/env bash
# Compile the device check's update and decode step for an H100 here, without a GPU
# (tools/gpu_aot.py), in a venv with the device image's jax and its CUDA plugin and this checkout
# (.gpu_aot/venv: Python 3.12, ~5 GB installed, made once).
#   bash tools/gpu_aot.sh [--parts update,decode]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/python312.sh
venv=.gpu_aot/venv
if [ ! -x "$venv/bin/python" ]; then
  python312="$(find_python312)" || { echo "gpu_aot.sh: no Python 3.12 (set PYTHON312=/path/to/python3.12)" >&2; exit 2; }
  "$python312" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "jax[cuda13]==0.11.2" -e .
fi
JAX_PLATFORMS=cpu "$venv/bin/python" tools/gpu_aot.py "$@"
