"""atgrpo-jax: AT-GRPO in JAX/Flax."""
import glob
import importlib.util
import os

# transformers serves this project tokenizers and configs only; without PyTorch it would announce at
# import that its models are unavailable, which is true and beside the point here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")



def _no_tpu_here() -> bool:
    """libtpu is installed (jax[tpu], the test extra's) but this machine has no TPU chip (no PCI device of
    Google's vendor id, the check jax itself makes) and no GPU plugin: jax would start libtpu anyway, and it
    prints warnings and an INVALID_ARGUMENT line before falling back to the CPU."""
    if importlib.util.find_spec("libtpu") is None:
        return False
    if any(importlib.util.find_spec(p) for p in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin")):
        return False  # a GPU machine's platforms are jax's to choose
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == "0x1ae0":  # Google: a TPU chip
                    return False
        except OSError:
            continue
    return True


# Quiet CPU runs: no libtpu lines on a machine without a TPU (JAX_PLATFORMS set by the user wins; compiling
# for a TPU topology on a CPU, `plan --compile`, needs no TPU platform).
if "JAX_PLATFORMS" not in os.environ and _no_tpu_here():
    os.environ["JAX_PLATFORMS"] = "cpu"

__all__ = ["Trainer", "Episode"]


def __getattr__(name: str):
    """`from atgrpo_jax import Trainer` (api.py) and `Episode` (envs/episode.py), imported when first asked
    for: `import atgrpo_jax` itself stays light (no jax)."""
    if name == "Trainer":
        from atgrpo_jax.api import Trainer
        return Trainer
    if name == "Episode":
        from atgrpo_jax.envs.episode import Episode
        return Episode
    raise AttributeError(f"module 'atgrpo_jax' has no attribute {name!r}")
