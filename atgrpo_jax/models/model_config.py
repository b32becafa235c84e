"""The decoder's architecture config, its families and presets.

One decoder serves three Hugging Face families (`FAMILIES`): Qwen3 (q/k RMSNorm), Llama (neither; RoPE
optionally scaled as Llama 3 does) and Qwen2 / Qwen2.5 (biases on q, k and v). Sizes of the released
Qwen3 models are those of their published `config.json` (Qwen/Qwen3-*); all share vocab 151,936
embedding rows (the tokenizer has 151,669 tokens), RoPE theta 1e6, RMSNorm eps 1e-6, SwiGLU, q/k norms.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from atgrpo_jax.models.attention import BACKENDS
from atgrpo_jax.models.decode_kernel import DECODE_ATTENTION

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Family:
    """What sets a Hugging Face model family apart in this decoder (everything else is shared: pre-norm
    blocks, RMSNorm, GQA, rotate-half RoPE, SwiGLU)."""
    architecture: str  # config.json `architectures`
    model_type: str  # config.json `model_type`
    qk_norm: bool  # RMSNorm over head_dim on q and k before RoPE
    qkv_bias: bool  # biases on the q, k and v projections


FAMILIES = {
    "qwen3": Family("Qwen3ForCausalLM", "qwen3", qk_norm=True, qkv_bias=False),
    "llama": Family("LlamaForCausalLM", "llama", qk_norm=False, qkv_bias=False),
    "qwen2": Family("Qwen2ForCausalLM", "qwen2", qk_norm=False, qkv_bias=True),
}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40_960
    param_dtype: str = "float32"  # storage of weights
    compute_dtype: str = "float32"  # matmul inputs and activations
    remat: bool = False  # recompute each layer in the backward pass
    recompute_elementwise: bool = True  # without remat: the backward recomputes norms, RoPE, SwiGLU (`decoder_layer`)
    attention: str = "auto"  # backend: auto|xla|chunked|splash|cudnn (models/attention.py)
    attention_block: int = 512  # query/key block of the chunked backend
    decode_attention: str = "xla"  # the sampler's one-token steps: xla|pallas (models/decode_kernel.py)
    decode_unroll: int = 0  # layers per loop iteration in one-token steps; 0 = auto (`layer_unroll`)
    decode_gather: bool = True  # per-layer decode steps read weights gathered whole over fsdp once per call
    sequence_unroll: int = 0  # layers per loop iteration in calls of many tokens per row (prefill, the update);
    # 0 = auto (`layer_unroll`)
    lora_rank: int = 0  # > 0 adds low-rank adapters to every projection
    lora_alpha: float = 32.0
    family: str = "qwen3"  # FAMILIES: which HF architecture this is (its layers' extras, its HF names)
    # Llama 3's RoPE scaling, (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings);
    # () is plain RoPE (`qwen3.rope_frequencies`)
    rope_llama3: tuple = ()

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"Qwen3Config.family must be one of {sorted(FAMILIES)}, got {self.family!r}")
        if self.rope_llama3 and len(self.rope_llama3) != 4:
            raise ValueError("Qwen3Config.rope_llama3 must be (factor, low_freq_factor, high_freq_factor, "
                             f"original_max_position_embeddings) or (), got {self.rope_llama3!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"Qwen3Config.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"Qwen3Config.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim must be even for RoPE, got {self.head_dim}")
        if self.attention not in BACKENDS:
            raise ValueError(f"Qwen3Config.attention must be one of {BACKENDS}, got {self.attention!r}")
        if self.decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"Qwen3Config.decode_attention must be one of {DECODE_ATTENTION}, "
                             f"got {self.decode_attention!r}")
        if int(self.decode_unroll) < 0:
            raise ValueError(f"Qwen3Config.decode_unroll must be >= 0 (0 = auto), got {self.decode_unroll}")
        if int(self.sequence_unroll) < 0:
            raise ValueError(f"Qwen3Config.sequence_unroll must be >= 0 (0 = auto), got {self.sequence_unroll}")
        if int(self.attention_block) <= 0:
            raise ValueError(f"Qwen3Config.attention_block must be positive, got {self.attention_block}")
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"Qwen3Config.{name} must be one of {sorted(DTYPES)}, "
                                 f"got {getattr(self, name)!r}")

    @property
    def qk_norm(self) -> bool:
        return FAMILIES[self.family].qk_norm

    @property
    def qkv_bias(self) -> bool:
        return FAMILIES[self.family].qkv_bias

    @property
    def dtype(self):
        return DTYPES[self.compute_dtype]

    @property
    def weight_dtype(self):
        return DTYPES[self.param_dtype]

    def replace(self, **kw) -> "Qwen3Config":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        d, f, l = self.hidden_size, self.intermediate_size, self.num_layers
        attn = d * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        extras = (2 * self.head_dim * self.qk_norm  # q/k norms
                  + self.head_dim * (self.num_heads + 2 * self.num_kv_heads) * self.qkv_bias)  # q/k/v biases
        per_layer = attn + 3 * d * f + 2 * d + extras
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + l * per_layer + d + head


_QWEN_VOCAB = 151_936


def _qwen3(hidden: int, mlp: int, layers: int, heads: int, tied: bool = False) -> Qwen3Config:
    """A released Qwen3 size: 8 KV heads of 128 dimensions, vocabulary 151,936."""
    return Qwen3Config(vocab_size=_QWEN_VOCAB, hidden_size=hidden, intermediate_size=mlp, num_layers=layers,
                       num_heads=heads, num_kv_heads=8, head_dim=128, tie_word_embeddings=tied)


PRESETS: dict[str, Qwen3Config] = {
    # The released models. Comments: parameters as Qwen3Config.num_params counts them (a test keeps them true).
    "qwen3-0.6b": _qwen3(hidden=1024, mlp=3072, layers=28, heads=16, tied=True),  # 596.0M
    "qwen3-1.7b": _qwen3(hidden=2048, mlp=6144, layers=28, heads=16, tied=True),  # 1.72B
    "qwen3-4b": _qwen3(hidden=2560, mlp=9728, layers=36, heads=32, tied=True),  # 4.02B
    "qwen3-8b": _qwen3(hidden=4096, mlp=12288, layers=36, heads=32),  # 8.19B
    "qwen3-14b": _qwen3(hidden=5120, mlp=17408, layers=40, heads=40),  # 14.77B
    "qwen3-32b": _qwen3(hidden=5120, mlp=25600, layers=64, heads=64),  # 32.76B
    # SmolLM2-135M(-Instruct), Llama architecture (its published config.json)
    "smollm2-135m": Qwen3Config(vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_layers=30,
                                num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100_000.0, rms_norm_eps=1e-5,
                                tie_word_embeddings=True, max_position_embeddings=8192, family="llama"),  # 134.5M
    # Benchmark configs: a small one and a Qwen3-like one with the real vocabulary.
    "bench-small": Qwen3Config(vocab_size=8192, hidden_size=256, intermediate_size=768, num_layers=4,
                               num_heads=4, num_kv_heads=2, head_dim=64),  # 7.3M
    "bench-qwen-like": Qwen3Config(vocab_size=151_669, hidden_size=512, intermediate_size=1536, num_layers=8,
                                   num_heads=8, num_kv_heads=2, head_dim=64),  # 179.4M (102M tied)
    # From-scratch CPU demo with the character tokenizer (vocab padded to 128).
    "demo-tiny": Qwen3Config(vocab_size=128, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=32, tie_word_embeddings=True,
                             max_position_embeddings=1024),  # 0.41M
    # Tests: head_dim != hidden / heads on purpose.
    "test-tiny": Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=24, max_position_embeddings=256),  # 0.152M
}

def get_preset(name: str, **overrides) -> Qwen3Config:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
