#!/usr/bin/env bash
# The accelerator check on a lent GPU machine (docs/device.md): the carried wheels
# (tools/device_wheels.sh) and this checkout go in, then `python -m atgrpo_jax.bench device`.
# Results land in $OUT (the device tool's folder) or ./device_out; extra flags go to the bench.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${OUT:-device_out}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# One compilation cache for every part's process: a second call on the still-warm machine (a part
# rerun after its limit, --parts decode) reads back what the first compiled.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/atgrpo_jax_cache}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$out/pip.log" 2>&1 || { tail -n 5 "$out/pip.log"; echo "carried wheels did not install"; exit 3; }
# No pip install of the project: the image's setuptools builds editables in an isolated env, which
# needs a registry. The layout an install makes (envs/ as atgrpo_jax.envs, configs/ beside) is copied.
rm -rf /tmp/pkg && mkdir -p /tmp/pkg && cp -r atgrpo_jax configs /tmp/pkg/ && cp -r envs /tmp/pkg/atgrpo_jax/envs || exit 4
export PYTHONPATH=/tmp/pkg:/tmp/site
cd /tmp/pkg || exit 4  # python puts the working directory first on sys.path: not the checkout's atgrpo_jax
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null || true
python3 -c "import jax, flax, torch, transformers, atgrpo_jax.envs; print('jax', jax.__version__, jax.devices(), \
'flax', flax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" || exit 5
python3 -m atgrpo_jax.bench device --out "$out" "$@" 2>&1 | tee "$out/log.txt"
