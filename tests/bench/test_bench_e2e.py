"""The e2e benchmark compares like with like: on the same weights, the PyTorch sample
function (transformers generate) and ours pick the same greedy tokens and run the same
rollout structure; the PyTorch update computes our loss and gradient norm on the same
trainer batch; its recorded sampler log-probs are the model's. Plus a smoke run of main."""
import dataclasses
import itertools
import json

import jax
import numpy as np
import pytest

from atgrpo_jax.bench import e2e
from atgrpo_jax.bench.torch_baseline import trim_padding
from atgrpo_jax.models.tokenizer import encode_chat
from atgrpo_jax.rollout.tree import RolloutInputs, TreeRollout
from atgrpo_jax.bench.rows import as_rows
from atgrpo_jax.train.batch import pack, policy_batch
from atgrpo_jax.train.step import finish_update, start_update
from atgrpo_jax.train.setup import build_run
from atgrpo_jax.train.validate import resolve

K = 2


@pytest.fixture(scope="module")
def run():
    return build_run(resolve(e2e.e2e_config("test-tiny", num_tasks=2, k=K, turns=2, max_new_tokens=10, mini_batch=16)))


def ragged_prompts(run) -> list[np.ndarray]:
    """The two agents' first prompts of task 0, the second cut from the left: the rows get
    different left padding, in one prompt bucket (no new compilation)."""
    state = run.workflow.reset(np.arange(1), "train")
    msgs = run.workflow.prompts(state, 0, 0) + run.workflow.prompts(state, 1, 0)
    ids = [np.asarray(encode_chat(run.tokenizer, m), np.int32) for m in msgs]
    return [ids[0], ids[1][20:]]


def keys(n: int, seed: int) -> jax.Array:
    return jax.random.split(jax.random.key(seed), n)


def greedy_pair(run):
    return e2e.our_side(run, temperature=0.0).sample_fn, e2e.torch_side(run, temperature=0.0).sample_fn


def test_greedy_tokens_agree_with_transformers_generate(run):
    prompts = ragged_prompts(run)
    assert len({len(p) for p in prompts}) == len(prompts)
    ours, theirs = greedy_pair(run)
    a = ours(0, prompts, K, keys(len(prompts), 0))
    full = [ids for ids, _ in a.rows()]
    assert all(len(r) == 10 for r in full), "no stop token expected from these weights"
    # Make a token that greedy picks mid-response a stop token: both sides must stop there.
    stop = int(full[0][4])
    run_stop = dataclasses.replace(run, stop_ids=tuple(run.stop_ids) + (stop,))
    for r in (run, run_stop):
        ours, theirs = greedy_pair(r)
        a, b = ours(0, prompts, K, keys(len(prompts), 0)), theirs(0, prompts, K, keys(len(prompts), 1))
        assert len(a.rows()) == len(b.rows()) == K * len(prompts)
        for (x, lx), (y, ly) in zip(a.rows(), b.rows()):
            np.testing.assert_array_equal(x, y)
            assert not np.any(lx) and not np.any(ly) and len(lx) == len(ly)  # greedy samples from a point mass
        assert a.texts == b.texts
    ids = [x for x, _ in b.rows()]
    assert min(map(len, ids)) <= 5 and all(x[-1] == stop or len(x) == 10 for x in ids)


def test_torch_sampler_logprobs_are_the_models(run):
    """At temperature 1, generate's recorded log-probs are those of our model's logits over the
    ids the tokenizer has (the distribution sampled from), and no other id is drawn."""
    theirs = e2e.torch_side(run, temperature=1.0)
    prompts = ragged_prompts(run)
    out = theirs.sample_fn(0, prompts, K, keys(len(prompts), 3))
    model, limit = run.policies[0].model(), len(run.tokenizer)
    assert limit < model.cfg.vocab_size
    for i, (resp, logp) in enumerate(out.rows()):
        seq = np.concatenate([prompts[i // K], resp])
        logits, _ = model(seq[None], np.arange(len(seq))[None])
        ref = jax.nn.log_softmax(np.asarray(logits[0, len(prompts[i // K]) - 1:-1, :limit]), axis=-1)
        np.testing.assert_allclose(logp, np.take_along_axis(np.asarray(ref), resp[:, None], 1)[:, 0], atol=2e-4)
        assert resp.max() < limit
    assert len({tuple(r) for r, _ in out.rows()}) > 1  # it did sample


def test_torch_update_matches_the_trainers_update_on_one_batch(run):
    ours = e2e.our_side(run)
    samples, _ = TreeRollout(K).begin(RolloutInputs(run.workflow, ours.sample_fn, run.encode, np.arange(2), "train",
                                                    max_turns=2, alpha=1.0, key=jax.random.key(5))).run()
    adv = np.random.RandomState(0).randn(*samples.reward.shape).astype(np.float32)  # a signal for the loss
    keep = np.arange(len(adv)) < 5  # 10 samples: one mini-batch of 16 with 6 empty rows
    batch = policy_batch(samples, adv, keep, run.policy_of_agent == 0, 16, np.random.default_rng(0))
    assert batch.num_samples == 10 and len(batch.adv) == 16
    trimmed = trim_padding(as_rows(pack(batch, slots=1, share_prompts=False)))
    assert len(trimmed["adv"]) == 10 and trimmed["valid"][:, -1].any() and trimmed["valid"].all(1).any()
    theirs = e2e.torch_side(run)  # same weights as ours now
    t = theirs.update(0, batch)
    o = finish_update(start_update(run, run.policies[0], batch))
    assert t["minibatches"] == 1
    np.testing.assert_allclose(t["loss"], o["loss"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(t["grad_norm"], o["grad_norm"], rtol=1e-4)
    assert abs(o["loss"]) > 1e-3 and o["grad_norm"] > 1e-3


def test_main_runs_both_sides_on_the_same_rollout_structure(capsys):
    """Greedy, so both sides take the same tokens and the same env steps: the same groups, with
    the same number of samples each, and the same token counts."""
    assert e2e.main(["--preset", "test-tiny", "--tasks", "2", "-k", "2", "--turns", "2", "--max-new-tokens", "10",
                     "--temperature", "0", "--warmup", "0", "--steps", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["benchmark"] == "e2e" and out["config"]["tokenizer"] == "char"
    ours, theirs = out["ours"], out["pytorch"]
    for side in (ours, theirs):
        (step,) = side["steps"]
        for phase in e2e.PHASES:
            assert side[phase]["best"] == side[phase]["median"] == step[phase] > 0
        assert step["sample"] <= step["rollout"] and step["model_update"] <= step["update"]
        assert step["total"] == pytest.approx(step["rollout"] + step["update"])
        assert side["sampled_tokens_per_s"] == pytest.approx(step["sampled_tokens"] / step["rollout"])
    a, b = ours["steps"][0], theirs["steps"][0]
    assert a["groups"] == b["groups"]  # [task, agent, turn, samples] per group
    assert sorted(g[:3] for g in a["groups"]) == sorted(map(list, itertools.product(range(2), range(2), range(2))))
    assert all(g[3] in (0, 2) for g in a["groups"]) and a["samples"] == sum(g[3] for g in a["groups"])
    for key in ("samples", "sampled_tokens", "update_tokens"):
        assert a[key] == b[key] > 0
    assert 0 < a["sampled_tokens"] <= 10 * a["samples"]
    # ours scores each group's prompt once: fewer tokens than one row per sample
    assert a["update_packed_padded_tokens"] >= a["update_packed_tokens"]
    assert a["update_packed_tokens"] < a["update_tokens"]
    assert out["speedup"] == pytest.approx(theirs["total"]["best"] / ours["total"]["best"])
    assert out["ratios"]["rollout_median"] == pytest.approx(theirs["rollout"]["median"] / ours["rollout"]["median"])


def test_keep_heap_sets_glibc_malloc_in_a_fresh_process():
    import subprocess
    import sys
    code = "from atgrpo_jax.bench.common import keep_heap; keep_heap(); print('kept')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "kept", proc.stderr[-2000:]
