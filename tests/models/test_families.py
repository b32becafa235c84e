"""Llama and Qwen2 checkpoints (the decoder's other families) against transformers: logits, greedy tokens,
and an export that transformers loads as the same architecture."""
import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from atgrpo_jax.models import Qwen3
from atgrpo_jax.models.hf_io import CheckpointError, config_from_hf, load_pretrained, save_pretrained
from atgrpo_jax.sampling import generate
from hf_fixtures import LLAMA3_ROPE, left_padded_batch, make_hf_checkpoint, torch_logits

CASES = {  # Llama with plain and with Llama 3 RoPE (tied, as SmolLM2 is); Qwen2 with its q/k/v biases
    "llama": dict(family="llama", tied=True),
    "llama3-rope": dict(family="llama", rope=LLAMA3_ROPE, theta=5e5),
    "qwen2": dict(family="qwen2", heads=4, kv_heads=2, head_dim=16),
}
LENGTHS = [40, 23, 9]  # left padding of different amounts; positions beyond LLAMA3_ROPE's context of 64 below


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_hf_checkpoint(path, **CASES[request.param], scale=16.0)
    return request.param, hf, str(path)


def test_logits_and_greedy_tokens_match_transformers(case):
    name, hf, path = case
    model = load_pretrained(path)
    assert model.cfg.family == CASES[name]["family"] and bool(model.cfg.rope_llama3) == ("rope" in CASES[name])
    tokens, mask, positions = left_padded_batch(np.random.RandomState(1), 256, LENGTHS)
    positions = positions + 40 * mask  # up to position 79: past the Llama 3 scaling's original context
    ref = torch_logits(hf, tokens, mask, positions)
    got, _ = model(tokens, positions, mask)
    assert np.abs(ref[mask]).max() > 1.0  # the comparison is not between near-zeros
    assert np.abs(np.asarray(got) - ref)[mask].max() <= 1e-4

    prompts = [list(map(int, row[m])) for row, m in zip(tokens, mask)]
    g = generate(model, prompts, max_new_tokens=10, temperature=0.0, key=jax.random.key(0))
    width = max(LENGTHS)
    with torch.no_grad():
        out = hf.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask, dtype=torch.long),
                          do_sample=False, max_new_tokens=10, min_new_tokens=10, pad_token_id=0)
    np.testing.assert_array_equal(g.tokens, out[:, width:].numpy())


def test_an_export_loads_in_transformers_as_its_own_architecture(case, tmp_path):
    name, _, path = case
    model = load_pretrained(path)
    save_pretrained(model, str(tmp_path))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(hf).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[CASES[name]["family"]]
    tokens, mask, positions = left_padded_batch(np.random.RandomState(3), 256, [12, 5])
    got, _ = model(tokens, positions, mask)
    assert np.abs(np.asarray(got) - torch_logits(hf, tokens, mask, positions))[mask].max() <= 1e-4
    again = load_pretrained(str(tmp_path))  # and back, bit for bit
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_family_or_rope_this_decoder_does_not_have_is_one_line():
    base = {"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1}
    with pytest.raises(CheckpointError, match=r"^config.json architectures=\['MistralForCausalLM'\]: supported are "
                                              r"LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM$"):
        config_from_hf({**base, "architectures": ["MistralForCausalLM"]})
    with pytest.raises(CheckpointError, match=r"rope_parameters rope type 'yarn' is not supported for LlamaForCausalLM"):
        config_from_hf({**base, "model_type": "llama", "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(CheckpointError, match=r"field mlp_bias=True is not supported"):
        config_from_hf({**base, "model_type": "llama", "mlp_bias": True})
    assert config_from_hf({**base, "model_type": "qwen2"}).qkv_bias


def test_a_family_trains_with_lora_from_its_checkpoint():
    """The update and LoRA on a family's extras: a Qwen2 model's biases get gradients, its adapters train."""
    cfg = config_from_hf({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
                          "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "num_key_value_heads": 2}, lora_rank=4)
    model = Qwen3(cfg, rngs=nnx.Rngs(0))
    assert model.layers.bq[...].shape == (2, 4, 8) and not hasattr(model.layers, "q_norm")
    tokens = np.arange(12).reshape(2, 6) % 64
    positions = np.tile(np.arange(6), (2, 1))

    def loss(m):
        logits, _ = m(tokens, positions)
        return -jax.nn.log_softmax(logits)[:, :-1].mean()

    grads = nnx.jit(nnx.grad(loss))(model)
    assert float(np.abs(np.asarray(grads.layers.bq[...])).sum()) > 0
    assert float(np.abs(np.asarray(grads.layers.lora_b_wq[...])).sum()) > 0


def test_qwen2_biases_in_the_fused_per_layer_decode_step_sample_the_rolled_loops_tokens():
    """GPUs and TPUs decode on per-layer weights with q, k, v (and Qwen2's biases) fused into one matrix
    (`fuse_projections`); on the same weights that step samples what the rolled loop does."""
    cfg = config_from_hf({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
                          "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "num_key_value_heads": 2})
    rolled = Qwen3(cfg.replace(decode_unroll=1), rngs=nnx.Rngs(0))
    for name in ("bq", "bk", "bv"):  # biases that matter
        getattr(rolled.layers, name).set_value(jax.random.normal(jax.random.key(1), getattr(rolled.layers, name).shape))
    per_layer = Qwen3(cfg.replace(decode_unroll=2), rngs=nnx.Rngs(1))
    nnx.update(per_layer, nnx.state(rolled))
    kw = dict(max_new_tokens=6, key=jax.random.key(2), temperature=1.0, num_branches=2)
    a, b = (generate(m, [[5, 9, 5, 30], [7, 7]], **kw) for m in (rolled, per_layer))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_the_gradient_of_a_tied_llama_matches_transformers(tmp_path):
    """What the update trains: the mean token log-likelihood's gradient, through the tied embedding that is
    both the input table and the LM head (SmolLM2's layout), equal to transformers' in loss and norm."""
    import jax.numpy as jnp

    hf = make_hf_checkpoint(str(tmp_path), vocab=64, hidden=32, inter=48, layers=2, heads=4, kv_heads=2, head_dim=8,
                            family="llama", tied=True)
    ours = load_pretrained(str(tmp_path))
    tokens = np.random.RandomState(0).randint(0, 64, (2, 12))
    hf.train()
    logp = torch.log_softmax(hf(input_ids=torch.tensor(tokens)).logits[:, :-1].float(), -1)
    loss_t = -logp.gather(-1, torch.tensor(tokens[:, 1:])[..., None]).mean()
    loss_t.backward()
    norm_t = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in hf.parameters() if p.grad is not None)))
    graphdef, params, rest = nnx.split(ours, nnx.Param, ...)

    def loss(params):
        logits, _ = nnx.merge(graphdef, params, rest)(jnp.asarray(tokens), jnp.tile(jnp.arange(12), (2, 1)))
        lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
        return -jnp.take_along_axis(lp, jnp.asarray(tokens[:, 1:])[..., None], -1).mean()

    loss_o, grads = jax.value_and_grad(loss)(params)
    norm_o = float(np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads))))
    np.testing.assert_allclose(float(loss_o), float(loss_t.detach()), rtol=1e-6)
    np.testing.assert_allclose(norm_o, norm_t, rtol=1e-5)
    assert norm_o > 0.1
