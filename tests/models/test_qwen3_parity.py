"""Flax Qwen3 vs transformers' Qwen3ForCausalLM on random checkpoints saved to disk."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from atgrpo_jax.models import KVCache, Qwen3, get_preset
from atgrpo_jax.models.hf_io import load_pretrained, save_pretrained
from hf_fixtures import left_padded_batch, make_hf_checkpoint, torch_logits

CONFIGS = {  # GQA ratio 1, 2 and 4; tied and untied; head_dim != hidden / heads
    "tied-mha": dict(heads=4, kv_heads=4, head_dim=24, tied=True),
    "untied-gqa2": dict(heads=4, kv_heads=2, head_dim=24, tied=False, theta=1e6),
    "untied-gqa4": dict(hidden=48, heads=8, kv_heads=2, head_dim=16, tied=False, layers=3),
}
LENGTHS = [11, 7, 3, 11]  # left padding of different amounts


def ours(model, tokens, mask, positions):
    logits, _ = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    return np.asarray(logits)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_float32_logits_match_transformers(tmp_path, name):
    hf = make_hf_checkpoint(tmp_path, **CONFIGS[name])
    model = load_pretrained(str(tmp_path))
    assert model.cfg.tie_word_embeddings == CONFIGS[name]["tied"]
    tokens, mask, positions = left_padded_batch(np.random.RandomState(1), 256, LENGTHS)
    ref = torch_logits(hf, tokens, mask, positions)
    got = ours(model, tokens, mask, positions)
    diff = np.abs(got - ref)[mask]  # padded slots' outputs are unused by both
    assert np.abs(ref[mask]).max() > 1.0  # the comparison is not between near-zeros
    assert diff.max() <= 1e-4, diff.max()


def test_bfloat16_within_bf16_rounding(tmp_path):
    """bf16 keeps 8 mantissa bits (relative rounding 2^-9 per op); after a few
    layers the logits differ from float32 by O(1e-2). We accept our bf16 error
    up to twice transformers' own bf16 error against the same float32 logits."""
    hf = make_hf_checkpoint(tmp_path, **CONFIGS["untied-gqa2"])
    tokens, mask, positions = left_padded_batch(np.random.RandomState(2), 256, LENGTHS)
    ref = torch_logits(hf, tokens, mask, positions)
    hf_bf16 = torch_logits(hf.to(torch.bfloat16), tokens, mask, positions)
    model = load_pretrained(str(tmp_path), param_dtype="bfloat16", compute_dtype="bfloat16")
    assert model.embed[...].dtype == jnp.bfloat16
    got = ours(model, tokens, mask, positions)
    ours_err = np.abs(got - ref)[mask].max()
    hf_err = np.abs(hf_bf16 - ref)[mask].max()
    assert ours_err <= 2 * hf_err + 1e-3, (ours_err, hf_err)


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip_through_transformers(tmp_path, tied):
    cfg = get_preset("test-tiny", tie_word_embeddings=tied)
    model = Qwen3(cfg, rngs=nnx.Rngs(3))
    # small shards force the sharded-index layout
    save_pretrained(model, str(tmp_path), max_shard_bytes=64_000)
    assert (tmp_path / "model.safetensors.index.json").exists()
    hf = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path)).eval()
    tokens, mask, positions = left_padded_batch(np.random.RandomState(3), cfg.vocab_size, [9, 5])
    diff = np.abs(ours(model, tokens, mask, positions) - torch_logits(hf, tokens, mask, positions))
    assert diff[mask].max() <= 1e-4
    again = load_pretrained(str(tmp_path))  # and back into Flax, bit for bit
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_cache_decode_equals_full_forward():
    cfg = get_preset("test-tiny")
    model = Qwen3(cfg, rngs=nnx.Rngs(0))
    tokens, mask, positions = left_padded_batch(np.random.RandomState(4), cfg.vocab_size, [10, 6])
    full = ours(model, tokens, mask, positions)
    cache = KVCache.init(cfg, 2, 16)
    steps, (logits, cache) = [], model(tokens[:, :6], positions[:, :6], mask[:, :6], cache)
    steps.append(np.asarray(logits))
    for i in range(6, 10):
        logits, cache = model(tokens[:, i:i + 1], positions[:, i:i + 1], mask[:, i:i + 1], cache)
        steps.append(np.asarray(logits))
    incremental = np.concatenate(steps, axis=1)
    assert np.abs(incremental - full)[mask].max() <= 1e-5


def test_compiled_program_does_not_grow_with_depth():
    """Layers run as one scan: the HLO of 2 and 12 layers is the same size."""
    def hlo_size(layers):
        cfg = get_preset("test-tiny", num_layers=layers)
        graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))

        def f(state, tokens):
            model = nnx.merge(graphdef, state)
            return model(tokens, tokens)[0]

        tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)
        return len(jax.jit(f).lower(state, tokens).as_text())

    small, deep = hlo_size(2), hlo_size(12)
    assert abs(deep - small) / small < 0.05, (small, deep)


def test_preset_comments_state_their_parameter_counts():
    """Each preset's entry in models/model_config.py ends with a comment giving its size (596.0M, 1.72B)."""
    import re

    from atgrpo_jax.models import model_config as config
    source = open(config.__file__).read()
    for name, cfg in config.PRESETS.items():
        entry = source[source.index(f'"{name}":'):]
        comment = re.search(r"#\s*([\d.]+)([MB])", entry[:entry.index("\n", entry.index(")"))])  # on the closing line
        assert comment, name
        value = float(comment.group(1)) * (1e6 if comment.group(2) == "M" else 1e9)
        digits = len(comment.group(1).replace(".", "").lstrip("0"))
        assert abs(cfg.num_params() - value) <= 0.5 * 10 ** (len(str(int(value))) - digits), (name, cfg.num_params())
