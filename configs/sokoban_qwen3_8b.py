"""Sokoban with Qwen3-8B, the paper's run (settings: atgrpo_jax/train/paper.py; weights: --config.model.hf_path)."""
from atgrpo_jax.train.paper import paper_config


def get_config():
    return paper_config("sokoban", "qwen3-8b")
