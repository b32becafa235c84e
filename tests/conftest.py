"""Test-wide setup: 8 simulated CPU devices, offline Hugging Face."""
import os

# Must happen before jax creates its backends (XLA reads XLA_FLAGS then, not at import).
from atgrpo_jax.distributed import CPU_COLLECTIVES_FLAG  # noqa: E402

for _flag in ("--xla_force_host_platform_device_count=8", CPU_COLLECTIVES_FLAG):
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys

# Shared test helpers (hf_fixtures.py, ...) import by plain name under importlib mode.
sys.path.insert(0, os.path.dirname(__file__))
