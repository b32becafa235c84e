"""The paper runs, the CPU demo and the recipes, installed as `atgrpo_jax.configs` (a regular package, so
setuptools' editable installs find it and a config may name its own functions, e.g. a reward)."""
