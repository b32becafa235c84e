#!/usr/bin/env bash
# Compile a config's training step for an H100 or H200 here, without a GPU: `python -m atgrpo_jax.plan
# --compile=h100` in a venv that adds the CUDA plugin of the installed jax to this environment
# (.gpu_aot/venv, ~4 GB installed, made once; nothing runs on a GPU).
#   bash tools/gpu_aot.sh --config=configs/plan_path_qwen3_1p7b.py [--compile=h200x8] [--config.k=v ...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.gpu_aot/venv
if [ ! -x "$venv/bin/python" ]; then
  version=$(python -c 'import jax; print(jax.__version__)')
  python -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q "jax[cuda13]==$version"
fi
args=("$@")
[[ " ${args[*]} " == *" --compile="* ]] || args+=(--compile=h100)
JAX_PLATFORMS=cpu "$venv/bin/python" -m atgrpo_jax.plan "${args[@]}"
