#!/usr/bin/env bash
# The newest end of setup.py's version range: a Python 3.12 venv with the newest jax (or JAX=0.11.2
# for another release), this checkout and the test tools, then the suite (extra arguments go to
# pytest). PyPI's torch for Python 3.12 is a multi-GB CUDA build, so the tests that need PyTorch
# (parity with transformers, the PyTorch baselines) are left out here: CI runs them on Python 3.11.
#   tools/compat.sh                 # newest jax, whole suite without the PyTorch tests
#   JAX=0.11.2 tools/compat.sh -x   # the jax a lent GPU machine ships
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/python312.sh
python312="$(find_python312)" || { echo "compat.sh: no Python 3.12 (set PYTHON312=/path/to/python3.12)" >&2; exit 2; }
venv="${VENV:-/tmp/atgrpo-compat-py312-jax${JAX:-newest}}"
[ -x "$venv/bin/python" ] || "$python312" -m venv "$venv"
pins=()
[ -n "${JAX:-}" ] && pins=("jax==$JAX" "jaxlib==$JAX")
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[test-no-torch]" "${pins[@]}"
"$venv/bin/python" -c 'import jax, flax, optax; print("compat:", jax.__version__, "flax", flax.__version__, "optax", optax.__version__)'
mapfile -t needs_torch < <(grep -rlE '^\s*(import|from)\s+(torch|peft|hf_fixtures)\b|torch_baseline' tests --include='*.py' | sort)
needs_torch+=(tests/bench/test_bench_device.py tests/bench/test_bench_longtail.py)  # they time the PyTorch sides too
echo "compat: leaving out (they need PyTorch): ${needs_torch[*]}"
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -n 2 "${needs_torch[@]/#/--ignore=}" "$@"
