"""Hugging Face checkpoints in and out: Qwen3, Llama and Qwen2 (models/model_config.py FAMILIES).

`load_pretrained` reads `config.json` and `*.safetensors` (one file, several,
or a sharded index) and builds the NNX model without ever holding the whole
checkpoint on the host: every parameter is created with
`jax.make_array_from_callback`, and each callback reads from disk only the
slice its device holds (lazily, through safetensors' slicing).

`save_pretrained` writes a directory that transformers loads as the model's own
family (`Qwen3ForCausalLM`, `LlamaForCausalLM`, `Qwen2ForCausalLM`): HF tensor
names and layouts, `config.json`, shards plus index.
"""
from __future__ import annotations

import glob
import json
import math
import os
from typing import Iterator

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from atgrpo_jax.models.model_config import FAMILIES, Qwen3Config
from atgrpo_jax.models.hub_ids import CheckpointError, local_model_dir
from atgrpo_jax.models.qwen3 import LAYER_PARAMS, Qwen3, layer_params
from atgrpo_jax.sharding import logical_sharding

# our layer param -> (HF name inside model.layers.{i}, number of leading "in" dims).
# A linear weight is stored by HF as [out, in]; ours is W.T reshaped to
# (in dims..., out dims...). n_in = None means the same layout (norms); 0, a flat
# vector that ours holds reshaped (q/k/v biases: [heads * head_dim] -> [heads, head_dim]).
HF_LAYER_NAMES = {
    "attn_norm": ("input_layernorm.weight", None),
    "wq": ("self_attn.q_proj.weight", 1),
    "wk": ("self_attn.k_proj.weight", 1),
    "wv": ("self_attn.v_proj.weight", 1),
    "wo": ("self_attn.o_proj.weight", 2),
    "q_norm": ("self_attn.q_norm.weight", None),
    "k_norm": ("self_attn.k_norm.weight", None),
    "bq": ("self_attn.q_proj.bias", 0),
    "bk": ("self_attn.k_proj.bias", 0),
    "bv": ("self_attn.v_proj.bias", 0),
    "mlp_norm": ("post_attention_layernorm.weight", None),
    "w_gate": ("mlp.gate_proj.weight", 1),
    "w_up": ("mlp.up_proj.weight", 1),
    "w_down": ("mlp.down_proj.weight", 1),
}
assert set(HF_LAYER_NAMES) == set(LAYER_PARAMS)

# HF config fields we read, those we accept only at a given value (per family), and the rest
# we know to be irrelevant to the forward pass. Anything else is an error.
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads")
_MUST_EQUAL = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "use_sliding_window": False,
               "pretraining_tp": 1}
_IGNORED = {"architectures", "model_type", "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id",
            "unk_token_id",
            "dtype", "torch_dtype", "initializer_range", "layer_types", "max_window_layers",
            "sliding_window", "transformers_version", "use_cache", "head_dim", "rope_theta", "rope_scaling",
            "rope_parameters", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings"}
_FAMILY_OF = {f.architecture: name for name, f in FAMILIES.items()} | {f.model_type: name for name, f in
                                                                        FAMILIES.items()}
_SUPPORTED = ", ".join(sorted(f.architecture for f in FAMILIES.values()))


def family_of(hf: dict) -> str:
    """The family (FAMILIES) of a parsed config.json, from `architectures` or else `model_type`; anything
    else is a CheckpointError naming what is supported."""
    archs = hf.get("architectures")
    if archs:
        if len(archs) != 1 or archs[0] not in _FAMILY_OF:
            raise CheckpointError(f"config.json architectures={archs}: supported are {_SUPPORTED}")
        family = _FAMILY_OF[archs[0]]
    elif hf.get("model_type") in _FAMILY_OF:
        family = _FAMILY_OF[hf["model_type"]]
    else:
        raise CheckpointError(f"config.json model_type={hf.get('model_type')!r}: supported are {_SUPPORTED}")
    if hf.get("model_type", FAMILIES[family].model_type) != FAMILIES[family].model_type:
        raise CheckpointError(f"config.json model_type={hf['model_type']!r} does not match its architectures "
                              f"{archs} (model_type {FAMILIES[family].model_type!r})")
    return family


def _rope(hf: dict, family: str) -> tuple[float, tuple]:
    """(theta, Llama 3 scaling or ()) of config.json: transformers 5's `rope_parameters`, or the older
    `rope_theta` with `rope_scaling`."""
    kind_of = lambda d: (d or {}).get("rope_type", (d or {}).get("type", "default"))  # noqa: E731
    parameters, scaling = hf.get("rope_parameters"), hf.get("rope_scaling")
    field, rope = (("rope_scaling", scaling) if kind_of(scaling) != "default" else  # a scaling either names counts
                   ("rope_parameters", parameters or {}))
    theta = float((parameters or {}).get("rope_theta", rope.get("rope_theta", hf.get("rope_theta", 10_000.0))))
    kind = kind_of(rope)
    if kind == "default":
        return theta, ()
    if kind == "llama3" and family == "llama":
        return theta, (float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
                       int(rope["original_max_position_embeddings"]))
    raise CheckpointError(f"config.json {field} rope type {kind!r} is not supported for "
                          f"{FAMILIES[family].architecture} (supported: default, and llama3 for Llama)")


def config_from_hf(hf: dict, **overrides) -> Qwen3Config:
    """The decoder's config from a parsed HF config.json (any family of FAMILIES); unsupported fields are
    errors."""
    family = family_of(hf)
    for key, value in _MUST_EQUAL.items():
        if key in hf and hf[key] != value:
            raise CheckpointError(f"config.json field {key}={hf[key]!r} is not supported (need {value!r})")
    for key in _REQUIRED:
        if key not in hf:
            raise CheckpointError(f"config.json lacks required field {key!r}")
    unknown = set(hf) - set(_REQUIRED) - set(_MUST_EQUAL) - _IGNORED
    if unknown:
        raise CheckpointError(f"config.json has fields this loader does not know: {sorted(unknown)}")
    theta, llama3 = _rope(hf, family)
    heads = hf["num_attention_heads"]
    fields = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=theta, rope_llama3=llama3, rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 40_960)), family=family,
    )
    fields.update(overrides)
    return Qwen3Config(**fields)


def config_to_hf(cfg: Qwen3Config) -> dict:
    """config.json of `cfg` as its own family's transformers class reads it."""
    family = FAMILIES[cfg.family]
    hf = {
        "architectures": [family.architecture], "model_type": family.model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu",
        "attention_dropout": 0.0, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "use_cache": True, "torch_dtype": cfg.param_dtype,
    }
    if cfg.family != "qwen2":  # Qwen2's q/k/v biases are not a switch there
        hf["attention_bias"] = False
    if cfg.family == "llama":
        hf["mlp_bias"] = False
    else:
        hf["use_sliding_window"] = False
    if cfg.rope_llama3:
        factor, low, high, context = cfg.rope_llama3
        hf["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                              "high_freq_factor": high, "original_max_position_embeddings": context}
    return hf


def hf_tensor_names(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF checkpoint of `cfg` must hold, with its shape."""
    names = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size),
             "model.norm.weight": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    for ours, (shape_fn, _) in layer_params(cfg).items():
        hf, n_in = HF_LAYER_NAMES[ours]
        shape = shape_fn(cfg)
        hf_shape = (shape if n_in is None else (math.prod(shape),) if n_in == 0 else
                    (math.prod(shape[n_in:]), math.prod(shape[:n_in])))
        for i in range(cfg.num_layers):
            names[f"model.layers.{i}.{hf}"] = hf_shape
    return names


def _open(path: str):
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: listed in the checkpoint's index but missing")
    try:
        return safe_open(path, framework="numpy")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for every kind of damage
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); an interrupted download leaves "
                              "a truncated file: download it again") from None


class _Reader:
    """Lazy access to the tensors of a checkpoint directory, by HF name."""

    def __init__(self, path: str):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise CheckpointError(f"no *.safetensors files in {path}")
        self._handles = [_open(os.path.join(path, f)) for f in files]
        self.where = {}
        for h in self._handles:
            for name in h.keys():
                self.where[name] = h

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.where[name].get_slice(name).get_shape())

    def read(self, name: str, rows: slice, cols: slice | None = None) -> np.ndarray:
        s = self.where[name].get_slice(name)
        return s[rows] if cols is None else s[rows, cols]


def _check_tensors(reader: _Reader, cfg: Qwen3Config):
    expected = hf_tensor_names(cfg)
    missing = sorted(set(expected) - set(reader.where))
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s): {missing[:5]}")
    extra = set(reader.where) - set(expected)
    if cfg.tie_word_embeddings:
        extra.discard("lm_head.weight")  # some exports keep the tied copy
    if extra:
        raise CheckpointError(f"checkpoint has unexpected tensor(s): {sorted(extra)[:5]}")
    for name, shape in expected.items():
        if reader.shape(name) != shape:
            raise CheckpointError(f"tensor {name} has shape {reader.shape(name)}, expected {shape}")


def _read_linear(reader, name, n_in, our_shape, index):
    """Slice `index` of our layout W.T.reshape(our_shape) for HF tensor `name` [out, in]."""
    in_dims, out_dims = our_shape[:n_in], our_shape[n_in:]
    idx_in, idx_out = index[:n_in], index[n_in:]

    def flat(idx, dims):  # read only along the leading dim of a group; slice the rest after
        start, stop, _ = idx[0].indices(dims[0])
        inner = math.prod(dims[1:])
        return slice(start * inner, stop * inner), (stop - start, *dims[1:]), (slice(None), *idx[1:])

    rows, out_shape, out_rest = flat(idx_out, out_dims)
    cols, in_shape, in_rest = flat(idx_in, in_dims)
    block = reader.read(name, rows, cols).T.reshape(*in_shape, *out_shape)
    return block[(*in_rest, *out_rest)]


def _reader_fn(reader: _Reader, path: tuple, cfg: Qwen3Config, dtype):
    """callback(index) -> host block of the parameter at `path` of the NNX state."""
    name = path[-1]
    if path[0] == "layers":
        hf, n_in = HF_LAYER_NAMES[name]
        shape = LAYER_PARAMS[name][0](cfg)

        def read_layer(i, idx):
            full = f"model.layers.{i}.{hf}"
            if n_in is None:
                return reader.read(full, idx[0])
            if n_in == 0:  # a flat bias: whole rows of ours, then the rest of the index
                start, stop, _ = idx[0].indices(shape[0])
                inner = math.prod(shape[1:])
                return reader.read(full, slice(start * inner, stop * inner)).reshape(-1, *shape[1:])[
                    (slice(None), *idx[1:])]
            return _read_linear(reader, full, n_in, shape, idx)

        def cb(index):
            layers = range(*index[0].indices(cfg.num_layers))
            return np.stack([read_layer(i, index[1:]) for i in layers]).astype(dtype)
        return cb
    if name == "embed":
        return lambda index: reader.read("model.embed_tokens.weight", index[0], index[1]).astype(dtype)
    if name == "final_norm":
        return lambda index: reader.read("model.norm.weight", index[0]).astype(dtype)
    if name == "lm_head":
        shape = (cfg.hidden_size, cfg.vocab_size)
        return lambda index: _read_linear(reader, "lm_head.weight", 1, shape, index).astype(dtype)
    raise CheckpointError(f"no HF tensor maps to parameter {'/'.join(map(str, path))}")


def _iter_params(state) -> Iterator[tuple[tuple, nnx.Variable]]:
    for path, var in nnx.to_flat_state(state):
        yield tuple(str(p) for p in path), var


ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                       "num_kv_heads", "head_dim", "tie_word_embeddings", "family")


def check_architecture(cfg: Qwen3Config, expected: Qwen3Config, path: str, expected_name: str):
    """An error naming the first field in which the checkpoint's architecture differs from `expected`."""
    for field in ARCHITECTURE_FIELDS:
        have, want = getattr(cfg, field), getattr(expected, field)
        if have != want:
            raise CheckpointError(f"{path}/config.json has {field}={have}, but {expected_name} has {want}: "
                                  "point model.hf_path at a checkpoint of that model, or set model.preset to "
                                  "the checkpoint's (\"\" takes the architecture from the checkpoint)")


def read_config(path: str, **config_overrides) -> Qwen3Config:
    """The Qwen3Config of the checkpoint directory `path` (its config.json)."""
    if not os.path.isdir(path):
        raise CheckpointError(f"model checkpoint {path!r} is not a directory")
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"no config.json in {path}")
    try:
        with open(cfg_path) as f:
            hf = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e})") from None
    return config_from_hf(hf, **config_overrides)


def load_pretrained(path: str, mesh=None, expected: Qwen3Config | None = None, expected_name: str = "",
                    **config_overrides) -> Qwen3:
    """The Qwen3 model stored at `path` (a directory, or a hub id org/name[@revision]: models/hub_ids.py), each
    parameter placed on `mesh` by its logical axes.

    config_overrides set Qwen3Config fields such as param_dtype or compute_dtype; `expected`
    (named `expected_name` in errors) is the architecture the caller wants.
    """
    path = local_model_dir(path, "model")
    cfg = read_config(path, **config_overrides)
    if expected is not None:
        check_architecture(cfg, expected, path, expected_name)
    reader = _Reader(path)
    _check_tensors(reader, cfg)
    abstract = nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    dtype = np.dtype(ml_dtypes.bfloat16) if cfg.param_dtype == "bfloat16" else np.dtype(cfg.param_dtype)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for p, var in _iter_params(state):
        shape = var.shape
        sharding = device if mesh is None else logical_sharding(mesh, var.logical_axes, shape)
        var.set_value(jax.make_array_from_callback(shape, sharding, _reader_fn(reader, p, cfg, dtype)))
    return nnx.merge(graphdef, state)


def _host(x) -> np.ndarray:
    if not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def _hf_tensors(model: Qwen3) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, host array in HF layout), one tensor at a time."""
    cfg = model.cfg
    yield "model.embed_tokens.weight", _host(model.embed[...])
    yield "model.norm.weight", _host(model.final_norm[...])
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", _host(model.lm_head[...]).T
    for ours in layer_params(cfg):
        hf, n_in = HF_LAYER_NAMES[ours]
        stacked = getattr(model.layers, ours)[...]
        for i in range(cfg.num_layers):
            w = _host(stacked[i])
            if n_in == 0:
                w = w.reshape(-1)
            elif n_in is not None:
                w = w.reshape(math.prod(w.shape[:n_in]), -1).T
            yield f"model.layers.{i}.{hf}", w


def save_pretrained(model: Qwen3, path: str, max_shard_bytes: int = 2 * 1024**3) -> None:
    """Write `model` as an HF checkpoint of its family (process 0 writes; every process must call).

    Shards are written as they fill, so the host holds at most one shard.
    """
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(path, exist_ok=True)
    files: list[tuple[str, list[str]]] = []
    shard: dict[str, np.ndarray] = {}

    def flush():
        if writer and shard:
            tmp = f"shard-{len(files):05d}.tmp"
            save_file(shard, os.path.join(path, tmp), metadata={"format": "pt"})
            files.append((tmp, list(shard)))
        shard.clear()

    for name, w in _hf_tensors(model):
        if shard and sum(x.nbytes for x in shard.values()) + w.nbytes > max_shard_bytes:
            flush()
        shard[name] = np.ascontiguousarray(w)  # safetensors writes the raw buffer, ignoring strides
    flush()
    if not writer:
        return
    weight_map = {}
    for i, (tmp, names) in enumerate(files):
        final = "model.safetensors" if len(files) == 1 else f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        os.replace(os.path.join(path, tmp), os.path.join(path, final))
        weight_map.update({n: final for n in names})
    if len(files) > 1:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_to_hf(model.cfg), f, indent=2)
