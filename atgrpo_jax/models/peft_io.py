"""LoRA adapters out in PEFT's format: `adapter_config.json` + `adapter_model.safetensors`.

PEFT (and vLLM's LoRA loader) adapt an HF linear `y = W x` ([out, in]) to
`y = W x + (lora_alpha / r) * B A x`, storing `lora_A.weight` [r, in] and
`lora_B.weight` [out, r] under `base_model.model.<module path>`. Ours (models/qwen3.py,
`Layers`) are A [layers, in, r] and B [layers, r, out] with the update
`(alpha / r) * A @ B` in our (in..., out...) layout, whose flattening is the transpose of
HF's [out, in] (hf_io.HF_LAYER_NAMES). So PEFT's A is our A[i].T and its B our B[i].T.
"""
from __future__ import annotations

import json
import os
from typing import Iterator

import jax
import numpy as np
from safetensors.numpy import save_file

from atgrpo_jax.distributed import to_host
from atgrpo_jax.models.hf_io import HF_LAYER_NAMES
from atgrpo_jax.models.qwen3 import LORA_TARGETS, Qwen3

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PeftModel wraps the ForCausalLM, whose decoder is `model`


def _module(ours: str) -> str:
    """The HF module path inside a layer of our adapted weight: wq -> self_attn.q_proj."""
    return HF_LAYER_NAMES[ours][0].removesuffix(".weight")


def target_modules() -> list[str]:
    """PEFT's target_modules: the last name of every adapted module (q_proj, ..., down_proj)."""
    return [_module(ours).rsplit(".", 1)[-1] for ours in LORA_TARGETS]


def peft_tensors(model: Qwen3) -> Iterator[tuple[str, np.ndarray]]:
    """(PEFT name, host array in PEFT's layout) of every adapter weight of a LoRA model."""
    for ours in LORA_TARGETS:
        a = to_host(getattr(model.layers, f"lora_a_{ours}")[...])  # [L, in, r]
        b = to_host(getattr(model.layers, f"lora_b_{ours}")[...])  # [L, r, out]
        for i in range(model.cfg.num_layers):
            name = f"{PEFT_PREFIX}model.layers.{i}.{_module(ours)}"
            yield f"{name}.lora_A.weight", a[i].T
            yield f"{name}.lora_B.weight", b[i].T


def adapter_config(model: Qwen3, base_model_name_or_path: str) -> dict:
    """PEFT's LoraConfig of `model`'s adapters (the keys PEFT reads; the rest take PEFT's defaults)."""
    cfg = model.cfg
    alpha = int(cfg.lora_alpha) if float(cfg.lora_alpha).is_integer() else float(cfg.lora_alpha)
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": cfg.lora_rank, "lora_alpha": alpha, "lora_dropout": 0.0,
        "target_modules": target_modules(), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "modules_to_save": None, "inference_mode": True,
    }


def save_adapter(model: Qwen3, path: str, base_model_name_or_path: str) -> None:
    """Write `model`'s adapters (not its base) as a PEFT LoRA directory (process 0 writes; every process must call)."""
    if not model.cfg.lora_rank:
        raise ValueError("save_adapter: the model has no LoRA adapters (lora_rank 0)")
    tensors = {name: np.ascontiguousarray(w) for name, w in peft_tensors(model)}
    if jax.process_index() != 0:
        return
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(path, ADAPTER_CONFIG), "w") as f:
        json.dump(adapter_config(model, base_model_name_or_path), f, indent=2)
