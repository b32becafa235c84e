"""The config's `model` and `lora` sections (atgrpo_jax/typed_config.py): which model (a preset, or a Qwen3,
Llama or Qwen2 checkpoint), in which dtypes, run how; and the adapters of LoRA policies."""
from __future__ import annotations

import dataclasses

from atgrpo_jax.models.attention import BACKENDS
from atgrpo_jax.models.model_config import DTYPES, PRESETS
from atgrpo_jax.models.decode_kernel import DECODE_ATTENTION
from atgrpo_jax.registry import closest
from atgrpo_jax.typed_config import Section, key, non_negative, positive

MODEL_INITS = ("auto", "random")


@dataclasses.dataclass(frozen=True)
class ModelSettings(Section):
    PATH = "model"

    preset: str = key("qwen3-1.7b", 'architecture, a name in atgrpo_jax.models.model_config.PRESETS; a checkpoint in '
                      'model.hf_path must match it ("" = whatever the checkpoint\'s config.json says)')
    hf_path: str = key("", "the checkpoint to start from (Qwen3, Llama or Qwen2): a Hugging Face directory (config.json, "
                       "*.safetensors, tokenizer) or a hub id org/name[@revision] (downloaded into the Hugging Face "
                       "cache; offline: from it)")
    init: str = key("auto", '"auto": the weights of model.hf_path (random only for presets under 250M parameters); '
                    '"random": random on purpose', choices=MODEL_INITS)
    param_dtype: str = key("float32", "storage dtype of the weights: float32, bfloat16 or float16", choices=DTYPES)
    compute_dtype: str = key("float32", "dtype of matmul inputs, activations and the KV cache", choices=DTYPES)
    remat: bool = key(False, "recompute each layer in the backward pass (less memory, ~30% more compute)")
    recompute_elementwise: bool = key(
        True, "without remat: the backward recomputes norms, RoPE and SwiGLU instead of keeping their "
        "intermediates: 9 of a layer's 20 sequence-sized tensors kept, no matmul run twice (models/qwen3.py)",
        resumable=True)  # how the layers run, never the math (rounding aside); so are the next ones marked so
    attention: str = key("auto", "auto|xla|chunked|splash|cudnn; auto: splash on TPU where it applies, cuDNN on "
                         "GPU, einsum on CPU for short rows, chunked (O(T) memory) otherwise; see docs/guides/gpu.md "
                         "(long responses)", choices=BACKENDS)
    attention_block: int = key(512, "query/key block of the chunked backend", check=positive)
    decode_attention: str = key("xla", 'the sampler\'s decode steps: "xla" (einsums) or "pallas" (GPU: one Triton '
                                "kernel per part that skips masked key blocks, models/decode_kernel.py; CPU: its "
                                "interpreter, tests only)", choices=DECODE_ATTENTION, resumable=True)
    decode_unroll: int = key(0, "decoder layers per loop iteration in decode steps; all (auto on GPU and TPU): "
                             "unrolled on per-layer copies of the weights and caches (no per-step copies, one more "
                             "copy of the layer weights while sampling); 1 (auto on CPU): a rolled loop over the "
                             "stacked ones (models/qwen3.py: layer_unroll)", check=non_negative, resumable=True)
    decode_gather: bool = key(True, "per-layer decode steps (GPU, TPU) read the layer weights and the LM head "
                              "gathered whole over the mesh's fsdp axis once per sampling call (no weight "
                              "collectives in a step; one more copy of the weights / tensor on each device); False: "
                              "each step gathers its shards (less memory)", resumable=True)
    sequence_unroll: int = key(0, "decoder layers per loop iteration in prefill and the update (the same math); "
                               "0 = auto: all on GPU (a faster update, a longer compile: docs/device.md), 1 on CPU "
                               "and TPU (compile time flat in depth)", check=non_negative, resumable=True)
    init_seed: int = key(0, "seed of random weights and of LoRA adapters")
    init_from: str = key("", "the workdir of an `sft` (or `train`) run of one shared policy whose newest "
                         "checkpoint's weights start the model (after model.hf_path or random init; every policy "
                         "starts from them, LoRA: the base); read at step 0 only, so a resumed run no longer needs "
                         'it ("" = none; docs/guides/sft.md)')
    vocab_size: int = key(0, "embedding rows of a random model; 0 = the preset's", check=non_negative)

    def check(self):
        self.require(self.preset in PRESETS or (self.preset == "" and bool(self.hf_path)), "preset",
                     f"unknown preset {self.preset!r}{closest(self.preset, PRESETS)}; known: {sorted(PRESETS)} "
                     f"(or \"\" with {self.PATH}.hf_path: the checkpoint's architecture)")


@dataclasses.dataclass(frozen=True)
class LoraSettings(Section):
    PATH = "lora"

    rank: int = key(16, "adapter rank r", check=positive)
    alpha: float = key(32.0, "adapter scale alpha (the update is alpha / r * A @ B)")
