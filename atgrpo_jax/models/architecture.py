"""The one mapping from a run's `model` section to the decoder's config: the architecture (a preset, or a
checkpoint's config.json in any family) with the run's settings of how it runs. The trainer
(train/setup.py) and the planner (plan/architecture.py) both build their model from it."""
from __future__ import annotations

from atgrpo_jax.models.config import Qwen3Config, get_preset
from atgrpo_jax.models.hf_io import read_config
from atgrpo_jax.models.hub_ids import local_model_dir


def run_fields(model, attention: str = "auto", lora=None) -> dict:
    """The Qwen3Config fields the `model` section sets beside the architecture (dtypes, how the layers run,
    the attention backends), and with `lora` (a `lora` section) its adapters' rank and scale."""
    fields = dict(param_dtype=model.param_dtype, compute_dtype=model.compute_dtype, remat=bool(model.remat),
                  recompute_elementwise=bool(model.recompute_elementwise), attention=attention,
                  attention_block=int(model.attention_block), decode_attention=model.decode_attention,
                  decode_unroll=int(model.decode_unroll), decode_gather=bool(model.decode_gather),
                  sequence_unroll=int(model.sequence_unroll))
    if lora is not None:
        fields.update(lora_rank=lora.rank, lora_alpha=lora.alpha)
    return fields


def model_architecture(model, attention: str = "auto", lora=None) -> Qwen3Config:
    """The model the `model` section names: model.hf_path's config.json (Qwen3, Llama or Qwen2), else the
    preset (model.vocab_size rows when set), with `run_fields`."""
    fields = run_fields(model, attention, lora)
    if model.hf_path:
        return read_config(local_model_dir(model.hf_path), **fields)
    if model.vocab_size:
        fields["vocab_size"] = model.vocab_size
    return get_preset(model.preset, **fields)
