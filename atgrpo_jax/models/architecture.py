"""The one mapping from a run's `model` section to the decoder's config: the architecture (a preset, or a
checkpoint's config.json in any family) with the run's settings of how it runs. A resolved config reads
it once (`Config.architecture`), and the trainer and the planner both build their model from that."""
from __future__ import annotations

from atgrpo_jax.models.model_config import Qwen3Config, get_preset
from atgrpo_jax.models.hf_io import read_config
from atgrpo_jax.models.hub_ids import local_model_dir


def run_fields(model, attention: str = "auto") -> dict:
    """The Qwen3Config fields the `model` section sets beside the architecture (dtypes, how the layers run,
    the attention backends)."""
    return dict(param_dtype=model.param_dtype, compute_dtype=model.compute_dtype, remat=bool(model.remat),
                recompute_elementwise=bool(model.recompute_elementwise), attention=attention,
                attention_block=int(model.attention_block), decode_attention=model.decode_attention,
                decode_unroll=int(model.decode_unroll), decode_gather=bool(model.decode_gather),
                sequence_unroll=int(model.sequence_unroll))


def model_architecture(model, attention: str = "auto") -> Qwen3Config:
    """The model the `model` section names: model.hf_path's config.json (Qwen3, Llama or Qwen2), else the
    preset (model.vocab_size rows when set), with `run_fields`."""
    fields = run_fields(model, attention)
    if model.hf_path:
        return read_config(local_model_dir(model.hf_path), **fields)
    if model.vocab_size:
        fields["vocab_size"] = model.vocab_size
    return get_preset(model.preset, **fields)
