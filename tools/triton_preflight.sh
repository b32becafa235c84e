#!/usr/bin/env bash
# Compile the Pallas decode attention for an H100 here, without a GPU (tools/triton_preflight.py):
# the project's Python lowers it to Triton IR, a venv with pip's triton (.triton/venv, ~1 GB installed,
# made once) compiles that to PTX and ptxas reports registers, spills and shared memory.
#   bash tools/triton_preflight.sh [--block N] [--warps N] [--stages N]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.triton/venv
if [ ! -x "$venv/bin/python" ]; then
  python -m venv "$venv"
  "$venv/bin/pip" install -q "triton>=3.4"
fi
rm -rf .triton/ir
JAX_PLATFORMS=cpu python tools/triton_preflight.py lower --out .triton/ir "$@"
TRITON_DEFAULT_FP_FUSION=1 "$venv/bin/python" tools/triton_preflight.py compile --out .triton/ir
