"""Low-rank adapters on a frozen Qwen3 base (policy.sharing = "lora": one adapter per agent)."""
from __future__ import annotations

import math

import jax
from flax import nnx

from atgrpo_jax.models.qwen3 import LoRAParam, Qwen3


A_INITS = ("normal", "peft")  # how LoRA's A starts: N(0, 1/d_in), or peft's kaiming-uniform U(-1/sqrt(d), 1/sqrt(d))


def attach_lora(model: Qwen3, rank: int, alpha: float, seed: int = 0, a_init: str = "normal") -> Qwen3:
    """A model sharing `model`'s base weights (no copy) with fresh adapters.

    B starts at zero, so the adapted model computes exactly what the base does. A is drawn as `a_init`
    says (A_INITS): "peft" is peft's default, `kaiming_uniform_(a=sqrt(5))` of an [r, d_in] weight.
    """
    if a_init not in A_INITS:
        raise ValueError(f"a_init: unknown {a_init!r}; known: {', '.join(A_INITS)}")
    cfg = model.cfg.replace(lora_rank=rank, lora_alpha=alpha)
    fresh = nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(seed)))
    graphdef, _, _ = nnx.split(fresh, LoRAParam, ...)
    lora_state = _init_lora(cfg, seed)
    if a_init == "peft":
        lora_state = _peft_a(lora_state, seed)
    base = nnx.state(model, nnx.Param)
    return nnx.merge(graphdef, lora_state, base)


def _init_lora(cfg, seed: int):
    """Concrete adapter weights for cfg (built without materializing a base)."""
    def build():
        return nnx.state(Qwen3(cfg, rngs=nnx.Rngs(seed)), LoRAParam)

    # jit + eval of only the LoRA leaves: XLA drops the unused base initializers.
    return jax.jit(build)()


def _peft_a(lora_state, seed: int):
    """The adapters with every A [L, d_in, r] redrawn as peft draws it: uniform on +-1/sqrt(d_in)."""
    leaves = nnx.to_flat_state(lora_state)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = []
    for key_i, (path, var) in zip(keys, leaves):
        if str(path[-1]).startswith("lora_a_"):
            shape, bound = var[...].shape, 1.0 / math.sqrt(var[...].shape[1])
            var = var.replace(jax.random.uniform(key_i, shape, var[...].dtype, -bound, bound))
        out.append((path, var))
    return nnx.from_flat_state(out)


def split_lora(model: Qwen3):
    """(graphdef, adapters, frozen base) for a LoRA model: train the adapters only."""
    return nnx.split(model, LoRAParam, ...)


def merge_lora(model: Qwen3) -> Qwen3:
    """A plain model whose weights are W + scale * A @ B (for fast sampling)."""
    cfg = model.cfg.replace(lora_rank=0)
    plain = nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(plain)
    merged = model.layers.weights()
    ours = nnx.state(model, nnx.Param)

    def pick(path, var):
        names = tuple(str(p) for p in path)
        if names[0] == "layers" and names[-1] in merged:
            return merged[names[-1]]
        return _get(ours, names)

    flat = [(path, var.replace(pick(path, var))) for path, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _get(state, names):
    node = state
    for n in names:
        node = node[n]
    return node[...]
