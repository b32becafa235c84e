"""generate() on a tiny random checkpoint: parity with transformers, log-probs, branches, stops, compiles.

Most calls share one shape (3 prompts in the 16 bucket, 12 new tokens, raw
log-probs on), so the file compiles the sampler only a few times.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from atgrpo_jax.models import Qwen3
from atgrpo_jax.models.hf_io import load_pretrained
from atgrpo_jax.sampling import GenerateSettings, decode, generate, row_keys_for, segments
from hf_fixtures import make_hf_checkpoint

VOCAB, NEW = 256, 12
LENGTHS = [7, 3, 12]  # left padding of different amounts


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    hf = make_hf_checkpoint(path, vocab=VOCAB, hidden=64, inter=96, layers=2, heads=4, kv_heads=2,
                            head_dim=24, seed=0, scale=16.0)
    return hf, load_pretrained(str(path))


def prompts(seed=0, lengths=LENGTHS):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, VOCAB, n)) for n in lengths]


def gen(model, ps, **kw):
    kw.setdefault("key", jax.random.key(0))
    kw.setdefault("raw_logprobs", True)
    return generate(model, ps, max_new_tokens=NEW, **kw)


def teacher_forced_logits(model, g):
    """Logits [N, new, V] predicting each response token, from one full forward pass (no cache)."""
    p = g.prompt_ids.shape[1]
    ids = np.concatenate([g.prompt_ids, g.tokens], axis=1)
    mask = np.concatenate([g.prompt_mask, g.mask], axis=1)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits, _ = model(jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(mask))
    return np.asarray(logits)[:, p - 1:-1]


def log_softmax_at(logits, tokens):
    z = logits - logits.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return np.take_along_axis(lp, tokens[..., None], axis=-1)[..., 0]


def test_greedy_matches_transformers_on_left_padded_prompts(models):
    hf, ours = models
    ps = prompts()
    g = gen(ours, ps, temperature=0.0)
    width = max(LENGTHS)
    ids = np.array([[0] * (width - len(p)) + p for p in ps])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in ps])
    with torch.no_grad():
        out = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
                          max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0)
    np.testing.assert_array_equal(g.tokens, out[:, width:].numpy())
    assert g.mask.all() and (g.lengths == NEW).all() and not g.stopped.any()
    # the comparison is meaningful: no near-ties on the greedy path
    logits = teacher_forced_logits(ours, g)
    top2 = np.sort(logits, axis=-1)[..., -2:]
    assert (top2[..., 1] - top2[..., 0]).min() > 1e-3  # float32 path differences are ~1e-5
    np.testing.assert_array_equal(logits.argmax(-1), g.tokens)
    assert (g.logprobs == 0).all()  # greedy draws from a point mass
    np.testing.assert_allclose(g.raw_logprobs, log_softmax_at(logits, g.tokens), atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_teacher_forced_logprobs(models, temperature):
    _, ours = models
    g = gen(ours, prompts(1), temperature=temperature, num_branches=2)
    logits = teacher_forced_logits(ours, g)
    np.testing.assert_allclose(g.logprobs, log_softmax_at(logits / temperature, g.tokens), atol=1e-4)
    np.testing.assert_allclose(g.raw_logprobs, log_softmax_at(logits, g.tokens), atol=1e-4)
    assert g.tokens.shape == (6, NEW) and g.prompt_ids.shape == (6, 16)
    np.testing.assert_array_equal(g.prompt_ids[0], g.prompt_ids[1])  # row b*K + k: prompt b
    assert (g.tokens[0] != g.tokens[1]).any()  # branches differ


def test_fixed_key_is_deterministic(models):
    _, ours = models
    ps = prompts(2)
    a, b = gen(ours, ps, key=jax.random.key(5)), gen(ours, ps, key=jax.random.key(5))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert (gen(ours, ps, key=jax.random.key(6)).tokens != a.tokens).any()


def test_a_settings_object_samples_as_its_fields_given_by_name(models):
    """GenerateSettings is the static part of a call; fields given by name replace its own."""
    _, ours = models
    ps = prompts(2)
    by_name = gen(ours, ps, temperature=0.7, top_k=5)
    settings = GenerateSettings(temperature=0.7, top_k=5, raw_logprobs=True)
    np.testing.assert_array_equal(gen(ours, ps, settings=settings).tokens, by_name.tokens)
    np.testing.assert_array_equal(gen(ours, ps, settings=dataclasses.replace(settings, top_k=9), top_k=5).logprobs,
                                  by_name.logprobs)
    with pytest.raises(TypeError, match="tempreature"):
        gen(ours, ps, tempreature=0.7)


def test_bfloat16_cache_is_close_to_float32(models):
    """The cache dtype is a setting: bf16 keys/values shift log-probs by bf16 rounding only."""
    _, ours = models
    ps = prompts(9)
    graphdef, weights = nnx.split(ours)
    ids, mask = np.zeros((3, 16), np.int32), np.zeros((3, 16), bool)
    for i, p in enumerate(ps):
        ids[i, 16 - len(p):], mask[i, 16 - len(p):] = p, True
    assert decode.prefill_jit(graphdef, weights, ids, mask, cache_dtype="bfloat16").cache.dtype == jnp.bfloat16
    g = gen(ours, ps, cache_dtype="bfloat16")
    reference = log_softmax_at(teacher_forced_logits(ours, g), g.tokens)  # float32 throughout
    err = np.abs(g.raw_logprobs - reference)
    # above float32 noise (the bf16 cache is really used), within bf16 rounding
    assert 1e-5 < err.max() < 0.02, err.max()


def expected_stop(tokens, stop_sets):
    """Lengths and stopped flags from an unstopped run: a row ends at its first stop token."""
    lengths, stopped = [], []
    for row, stops in zip(tokens, stop_sets):
        hits = [j for j, t in enumerate(row) if t in stops]
        lengths.append(hits[0] + 1 if hits else len(row))
        stopped.append(bool(hits))
    return np.array(lengths), np.array(stopped)


def test_stop_tokens_end_rows_and_mask_the_rest(models):
    _, ours = models
    ps = prompts(3)
    free = gen(ours, ps, temperature=0.0).tokens
    per_row = [[int(free[0, 4])], [int(free[1, 2]), VOCAB + 7], []]
    for stop_ids, sets in [(per_row, per_row), ([int(free[2, 6])], [[int(free[2, 6])]] * 3)]:
        g = gen(ours, ps, temperature=0.0, stop_ids=stop_ids, pad_id=0)
        lengths, stopped = expected_stop(free, sets)
        assert stopped.any() and (lengths < NEW).any()
        np.testing.assert_array_equal(g.lengths, lengths)
        np.testing.assert_array_equal(g.stopped, stopped)
        np.testing.assert_array_equal(g.mask, np.arange(NEW) < lengths[:, None])
        np.testing.assert_array_equal(np.where(g.mask, g.tokens, 0), np.where(g.mask, free, 0))
        assert (g.tokens[~g.mask] == 0).all() and (g.logprobs[~g.mask] == 0).all()
        assert (g.raw_logprobs[~g.mask] == 0).all()


def test_decode_stops_as_soon_as_every_row_is_done(models):
    _, ours = models
    ps = prompts(3)
    free = gen(ours, ps, temperature=0.0).tokens
    stops = [[int(free[0, 0])], [int(free[1, 1])], [int(free[2, 0])]]
    ids, mask = np.zeros((3, 16), np.int32), np.zeros((3, 16), bool)
    for i, p in enumerate(ps):
        ids[i, 16 - len(p):], mask[i, 16 - len(p):] = p, True
    stop_arr = np.full((3, 4), -1, np.int32)
    stop_arr[:, 0] = [s[0] for s in stops]
    settings = decode.DecodeSettings(NEW, raw_logprobs=True)
    out = segments.run(ours, ids, mask, stop_arr, row_keys_for(jax.random.key(0), 3),
                       decode.sampling_params(0.0), settings).out
    lengths, stopped = expected_stop(free, stops)
    assert stopped.all() and lengths.max() <= 2
    np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
    assert int(out.steps) == lengths.max()  # not NEW: the loop ended when the last row stopped


def test_branches_equal_separate_prefills_with_the_same_row_keys(models):
    _, ours = models
    ps = prompts(4)
    keys = row_keys_for(jax.random.key(9), 6)
    shared = gen(ours, ps, num_branches=2, row_keys=keys, key=None)
    for r in range(6):
        alone = gen(ours, [ps[r // 2]], row_keys=keys[r:r + 1], key=None)
        np.testing.assert_array_equal(alone.tokens[0], shared.tokens[r])
        np.testing.assert_allclose(alone.logprobs[0], shared.logprobs[r], atol=1e-5)
        np.testing.assert_array_equal(alone.prompt_ids[0][-len(ps[r // 2]):], ps[r // 2])
    assert len({tuple(t) for t in shared.tokens}) == 6


def test_no_recompilation_for_prompts_in_known_buckets(models):
    _, ours = models
    compiles = []

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    gen(ours, prompts(5, [5, 9, 2]), key=jax.random.key(1))  # warm-up
    sizes = [f._cache_size() for f in segments.JITTED]
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for seed, lengths in [(6, [3, 14, 8]), (7, [16, 1, 11])]:
            g = gen(ours, prompts(seed, lengths), key=jax.random.key(seed), temperature=seed / 10,
                    stop_ids=[[1, 2], [3], [4, 5, 6]], vocab_limit=VOCAB + seed % 2)  # >= the head: no limit
            assert g.tokens.shape == (3, NEW)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert [f._cache_size() for f in segments.JITTED] == sizes


LIMIT = 250  # as if the tokenizer had 250 ids for the head's VOCAB = 256 rows


class PrefersUnusedRows(Qwen3):
    """A checkpoint whose head puts +40 on every id >= LIMIT (like trained padding rows gone wrong)."""

    def logits(self, h):
        return super().logits(h) + jnp.where(jnp.arange(self.cfg.vocab_size) >= LIMIT, 40.0, 0.0)


def test_vocab_limit_never_emits_ids_beyond_it(models):
    _, ours = models
    model = PrefersUnusedRows(ours.cfg, rngs=nnx.Rngs(0))
    nnx.update(model, nnx.state(ours))
    ps = prompts(10)
    for temperature in (1.0, 0.0):  # one compiled sampler for both
        g = gen(model, ps, temperature=temperature, vocab_limit=LIMIT)
        assert g.tokens.max() < LIMIT and g.mask.all()
        logits = teacher_forced_logits(model, g)  # the biased head's, every row of it
        # without the limit the unused rows would win: they hold nearly all the mass at every step
        assert (np.exp(logits - logits.max(-1, keepdims=True))[..., LIMIT:].sum(-1)
                > 0.99 * np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)).all()
        if temperature:  # log-probs normalize over the allowed ids only (NumPy reference)
            np.testing.assert_allclose(g.logprobs, log_softmax_at(logits[..., :LIMIT], g.tokens), atol=1e-4)
        else:
            np.testing.assert_array_equal(g.tokens, logits[..., :LIMIT].argmax(-1))
            assert (g.logprobs == 0).all()
        np.testing.assert_allclose(g.raw_logprobs, log_softmax_at(logits, g.tokens), atol=1e-4)  # whole head


def test_batch_buckets_and_padded_array_input_give_the_same_rows(models):
    _, ours = models
    ps = prompts(8)
    keys = row_keys_for(jax.random.key(3), 3)
    full = gen(ours, ps, row_keys=keys, key=None)
    padded = gen(ours, ps[:2], row_keys=keys[:2], key=None, batch_buckets=(3, 6))
    np.testing.assert_array_equal(padded.tokens, full.tokens[:2])
    np.testing.assert_array_equal(padded.prompt_ids, full.prompt_ids[:2])
    array = np.zeros((3, 20), np.int32)
    for i, p in enumerate(ps):
        array[i, :len(p)] = p
    as_array = gen(ours, array, prompt_lengths=LENGTHS, row_keys=keys, key=None)
    np.testing.assert_array_equal(as_array.tokens, full.tokens)


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompts=[[1, 2], []]), "empty"),
    (dict(prompts=[[1, VOCAB]]), "outside"),
    (dict(prompts=[[1] * 20], buckets=(8, 16)), "exceeds"),
    (dict(top_p=0.0), "top_p"),
    (dict(temperature=-1.0), "temperature"),
    (dict(stop_ids=[[1], [2]]), "stop_ids"),
    (dict(key=None), "key"),
    (dict(row_keys=jax.random.split(jax.random.key(0), 2), key=None), "row_keys"),
    (dict(num_branches=0), "num_branches"),
    (dict(vocab_limit=0), "vocab_limit"),
    (dict(slots=0), "slots"),
])
def test_bad_input_is_a_clear_error(models, kwargs, message):
    _, ours = models
    kwargs = {"prompts": prompts(), **kwargs}
    with pytest.raises(ValueError, match=message):
        gen(ours, kwargs.pop("prompts"), **kwargs)
