"""atgrpo-jax: AT-GRPO in JAX/Flax."""
import os

# transformers serves this project tokenizers and configs only; without PyTorch it would announce at
# import that its models are unavailable, which is true and beside the point here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

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
