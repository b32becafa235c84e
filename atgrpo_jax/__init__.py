"""atgrpo-jax: AT-GRPO in JAX/Flax."""
