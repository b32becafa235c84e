"""The tree rollout, the router and the per-policy update on a tiny model."""
import jax
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.envs.workflow import take_branch
from atgrpo_jax.models.lora import LoRAParam
from atgrpo_jax.rollout.plain import PlainRollout
from atgrpo_jax.rollout.tree import RolloutInputs, TreeRollout
from tiny_config import tiny
from atgrpo_jax.train.step import train_step
from atgrpo_jax.train.setup import build_run
from atgrpo_jax.train.validate import resolve
from tiers import full_case

K = 4


def tiny_config(regime="shared"):
    """The tests' tiny config with three tasks of K branches, longer answers and a fast optimizer."""
    return tiny(**{"regime": regime, "model.init_seed": 0, "rollout.num_tasks": 3, "rollout.k": K,
                   "rollout.max_new_tokens": 4, "optim.lr": 1e-2, "optim.schedule": "constant",
                   "optim.warmup_steps": 0, "optim.mini_batch_size": 32,
                   "lora.rank": 2, "lora.alpha": 4.0})


class Spy:
    """Wraps a workflow and records what each agent was shown and what the steps returned."""

    def __init__(self, wf):
        self.wf, self.calls = wf, []
        self.agents, self.max_turns, self.name = wf.agents, wf.max_turns, wf.name

    def reset(self, ids, split):
        return self.wf.reset(ids, split)

    def done(self, s):
        return self.wf.done(s)

    def success(self, s):
        return self.wf.success(s)

    def prompts(self, state, agent, turn):
        out = self.wf.prompts(state, agent, turn)
        self.calls.append(("prompts", agent, turn, out))
        return out

    def step(self, state, agent, turn, responses):
        out = self.wf.step(state, agent, turn, responses)
        self.calls.append(("step", agent, turn, out))
        return out


@pytest.fixture(scope="module")
def run():
    return build_run(resolve(tiny_config()))


def rollout(run, strategy=TreeRollout(K), seed=0):
    from atgrpo_jax.train.step import sample_fn_for
    spy = Spy(run.workflow)
    samples, episodes = strategy.begin(RolloutInputs(spy, sample_fn_for(run, 1.0, 3 * K), run.encode, [11, 12, 13],
                                                     "train", max_turns=2, alpha=1.0, key=jax.random.key(seed))).run()
    return spy, samples, episodes


def test_groups_are_k_samples_of_one_task_agent_turn(run):
    _, s, episodes = rollout(run)
    groups = list(zip(s.task, s.agent, s.turn))
    assert len(groups) == len(set(groups))  # one group per (task, agent, turn)
    assert s.reward.shape == s.mask.shape == s.response_len.shape == s.prompt_of.shape == (len(groups), K)
    assert s.response.shape[:2] == (len(groups), K)
    assert len(set(s.prompt_of[:, 0])) == len(groups)  # a prompt of its own per group, stored once
    for g in range(len(groups)):
        if s.mask[g].all():  # a live group: K distinct samples from one shared prompt
            assert (s.prompt_of[g] == s.prompt_of[g, 0]).all()
            assert (s.response_len[g] > 0).all()
            for k in range(K):  # padded arrays: nothing but zeros past a sample's length
                assert not s.response[g, k, s.response_len[g, k]:].any()
            assert not s.prompt[s.prompt_of[g, 0], s.prompt_len[s.prompt_of[g, 0]]:].any()
    assert episodes.success.shape == (3,)


def test_next_agent_observes_the_selected_branch(run):
    spy, s, _ = rollout(run, seed=1)
    calls = spy.calls
    checked = 0
    for i, call in enumerate(calls[:-1]):
        if call[0] != "step" or calls[i + 1][0] != "prompts":
            continue
        out, (_, agent, turn, shown) = call[3], calls[i + 1]
        reward = out.local_reward + out.team_reward
        best = np.argmax(reward, axis=1)
        expected = spy.wf.prompts(take_branch(out.state, best), agent, turn)
        live = ~np.asarray(spy.wf.done(take_branch(out.state, best)))
        assert [m for m, l in zip(shown, live) if l] == [m for m, l in zip(expected, live) if l]
        checked += 1
    assert checked >= 2


def test_plain_grpo_groups_episodes_by_task_and_agent(run):
    spy, s, episodes = rollout(run, PlainRollout(K, grouping="task_agent"), seed=2)
    assert s.reward.shape == (3 * 2, K)  # (task, agent) groups, K independent episodes
    assert sorted(zip(s.task, s.agent)) == [(t, a) for t in range(3) for a in range(2)]


def test_plain_grpo_as_the_reference_groups_by_task_at_its_last_turn(run):
    """One group per task: both agents' samples at the task's maximum turn over its K episodes,
    checked against the trajectory (every sample of every turn) in plain Python."""
    _, s, episodes = rollout(run, PlainRollout(K), seed=2)
    t = episodes.trajectory  # one-sample groups, task = episode index (task * K + k)
    assert s.reward.shape == (3, K * 2) and list(s.task) == [0, 1, 2] and (s.agent == -1).all()
    for task in range(3):
        steps = [(int(t.turn[g]), int(t.agent[g]), int(t.task[g]) % K, g) for g in range(t.num_groups)
                 if t.task[g] // K == task and t.mask[g, 0]]
        top = max(turn for turn, *_ in steps)
        assert s.turn[task] == top
        want = {(a, e): g for turn, a, e, g in steps if turn == top}
        for col in range(K * 2):
            e, a = divmod(col, 2)
            assert s.mask[task, col] == ((a, e) in want) and s.sample_agent[task, col] == a
            if (a, e) in want:
                g = want[(a, e)]
                assert s.reward[task, col] == t.reward[g, 0]
                np.testing.assert_array_equal(s.prompt_ids(task, col), t.prompt_ids(g, 0))  # its own episode's
                np.testing.assert_array_equal(s.response[task, col], t.response[g, 0])
    live = s.prompt_of[s.mask]
    assert len(set(live)) == len(live)  # independent episodes: no two samples share a prompt


def param_leaves(policy):
    return [np.asarray(x) for x in jax.tree.leaves(policy.state.params)]


@pytest.mark.parametrize("pools", [full_case(False, id="one_mesh"), pytest.param(True, id="4+4_device_pools")])  # tiers.py
def test_per_role_router_updates_each_policy_from_its_own_agent_only(pools):
    config = tiny_config("per_role")
    if pools:  # each policy on its own 4 of the 8 devices
        config.mesh, config.policy.pools = dict(data=1, fsdp=8, tensor=1), True
    run = build_run(resolve(config))
    assert [p.name for p in run.policies] == ["policy_planner", "policy_executor"]
    if pools:
        devices = [{d.id for x in jax.tree.leaves(p.state) for d in x.sharding.device_set} for p in run.policies]
        assert devices == [{0, 1, 2, 3}, {4, 5, 6, 7}]
        assert any(len(x.sharding.device_set) == 4 and not x.sharding.is_fully_replicated
                   for x in jax.tree.leaves(run.policies[1].state.params))  # really split over its pool
    assert list(run.policy_of_agent) == [0, 1]
    before = [param_leaves(p) for p in run.policies]
    # Only the executor's samples reach the update: the planner policy must not move.
    orig = run.policy_of_agent.copy()
    run.policy_of_agent[:] = [0, 1]
    from atgrpo_jax.train import batch as batch_mod
    real = batch_mod.policy_batch

    def only_executor(samples, adv, keep, agents, *a, **kw):
        keep = keep & (samples.agent == 1)[:, None]
        return real(samples, adv, keep, agents, *a, **kw)

    import atgrpo_jax.train.groups as groups
    groups.policy_batch = only_executor
    try:
        train_step(run, 1)
    finally:
        groups.policy_batch = real
        run.policy_of_agent[:] = orig
    after = [param_leaves(p) for p in run.policies]
    if pools:  # the update ran on the pool: the state never left it
        assert {d.id for x in jax.tree.leaves(run.policies[1].state) for d in x.sharding.device_set} == {4, 5, 6, 7}
    assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0]))
    assert any(not np.array_equal(a, b) for a, b in zip(before[1], after[1]))


def test_lora_updates_change_only_adapters():
    run = build_run(resolve(tiny_config("lora")))
    base = [np.asarray(x) for x in jax.tree.leaves(run.policies[0].frozen)]
    adapters = param_leaves(run.policies[0])
    assert all(isinstance(v, LoRAParam) for _, v in nnx.to_flat_state(run.policies[0].state.params))
    merged = run.policies[0].sampler_model()
    assert run.policies[0].sampler_model() is merged  # merged once per update, not per sample call
    train_step(run, 1)
    assert run.policies[0].sampler_model() is not merged
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(base, jax.tree.leaves(run.policies[0].frozen)))
    assert any(not np.array_equal(a, b) for a, b in zip(adapters, param_leaves(run.policies[0])))
    # both adapters share one base: no copy of the base weights per agent
    assert all(a is b for a, b in zip(jax.tree.leaves(run.policies[0].frozen), jax.tree.leaves(run.policies[1].frozen)))


def test_a_split_rollout_merges_into_the_whole_one(run):
    """Two processes' task slices, merged, equal one process rolling out all tasks."""
    from atgrpo_jax.rollout.tree import merge_rollouts
    from atgrpo_jax.train.step import sample_fn_for
    ids, key = np.array([11, 12, 13, 14]), jax.random.key(3)

    def go(sl: slice):
        return TreeRollout(K).begin(RolloutInputs(run.workflow, sample_fn_for(run, 1.0, 4), run.encode, ids[sl], "train",
                                                  max_turns=2, alpha=1.0, key=key, first_task=sl.start)).run()

    whole = merge_rollouts([go(slice(0, 4))], 2)
    split = merge_rollouts([go(slice(0, 2)), go(slice(2, 4))], 2)
    (s1, e1), (s2, e2) = whole, split
    for name in ("task", "agent", "turn", "reward", "mask"):
        np.testing.assert_array_equal(getattr(s2, name), getattr(s1, name), err_msg=name)
    assert len(set(map(tuple, np.stack([s1.task, s1.agent, s1.turn], 1)))) == len(s1.task)
    np.testing.assert_array_equal(s2.response, s1.response)
    np.testing.assert_array_equal(s2.response_len, s1.response_len)
    np.testing.assert_allclose(s2.sampler_logp, s1.sampler_logp, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(e2.success, e1.success)
    np.testing.assert_array_equal(e2.turns, e1.turns)
    assert len({tuple(r) for r in s1.response.reshape(-1, s1.response.shape[-1])}) > 1  # not all branches alike


def test_kl_reference_starts_at_zero_and_stays_small():
    config = tiny_config()
    config.loss.kl_coef = 0.1
    # The random policy's branches all earn the same reward (zero advantages), and at the reference the KL's
    # gradient is zero: the entropy bonus is what moves the policy in step 1 (not float noise through Adam).
    config.loss.entropy_coef = 0.01
    config.optim.mini_batch_size = 512  # one mini-batch: scored before its only update
    run = build_run(resolve(config))
    assert set(run.ref_params) == {"policy"}
    first = train_step(run, 1)
    assert 0.0 <= first["kl_ref"] < 1e-5  # the policy is still the reference when it is scored
    assert first["grad_norm"] > 1e-4
    second = train_step(run, 2)
    assert np.isfinite(second["kl_ref"]) and second["kl_ref"] > first["kl_ref"]


def test_old_logprobs_include_the_repetition_penalty():
    """The reference's training sampling (T=1.5, top-p 0.9, top-k 20, repetition penalty 1.2; another
    temperature and penalty for one agent): the update scores each token at its agent's temperature,
    under the penalty of the ids its prompt and its own response had shown, so the trainer's old
    log-probs equal the sampler's (the importance ratio starts at 1); without the penalty, or scored at
    temperature 1 without top-p (as once), they do not."""
    from atgrpo_jax.train import batch as batch_mod
    from atgrpo_jax.train.step import finish_update, packed_minibatches, sample_fn_for, start_update

    config = tiny_config()
    config.rollout.update(temperature=1.5, top_p=0.9, top_k=20, repetition_penalty=1.2, max_new_tokens=8)
    config.rollout.agents = {"executor": {"repetition_penalty": 1.5, "temperature": 1.3}}
    run = build_run(resolve(config))
    assert list(batch_mod.Scoring.of(run.scored_as).penalty) == [np.float32(1.2), 1.5]
    assert [s.temperature for s in run.sampling] == [1.5, 1.3]
    samples, _ = TreeRollout(K).begin(RolloutInputs(run.workflow, sample_fn_for(run, None, 3), run.encode, [11, 12, 13],
                                                    "train", max_turns=2, alpha=1.0, key=jax.random.key(7))).run()
    batch = batch_mod.policy_batch(samples, np.zeros(samples.reward.shape, np.float32), samples.mask.any(1),
                                   run.policy_of_agent == 0, config.optim.mini_batch_size, np.random.default_rng(0),
                                   batch_mod.Scoring.of(run.scored_as))
    policy = run.policies[0]
    shared = 0
    for mb in packed_minibatches(run, policy, batch):
        scored, sample_row = mb.packed.scored, mb.packed.sample_row
        shared += int((np.bincount(sample_row[sample_row >= 0]) > 1).sum())
        exact = np.asarray(policy.logprobs(mb.packed.placed()))
        unpenalized = mb.packed._replace(penalty=None, sample=None, sample_row=None)
        ones = np.ones(scored.shape, np.float32)
        plain = unpenalized._replace(inv_temp=ones, top_p=ones)  # temperature 1, no top-p (top-k is compiled in)
        assert np.abs(exact - mb.sampler_logp)[scored].max() < 1e-4
        assert np.abs(np.asarray(policy.logprobs(unpenalized.placed())) - mb.sampler_logp)[scored].mean() > 0.01
        assert np.abs(np.asarray(policy.logprobs(plain.placed())) - mb.sampler_logp)[scored].mean() > 0.05
    assert shared > 0  # rows held several samples of one prompt: each saw its own response only
    calls, recompute = [], policy.logprobs
    policy.logprobs = lambda *a: calls.append(a) or recompute(*a)
    assert finish_update(start_update(run, policy, batch))["logprob_gap"] < 1e-4
    # the first mini-batch's old log-probs came out of its own update (train/pending.py:first_step_is_on_policy)
    assert len(calls) == len(packed_minibatches(run, policy, batch)) - 1 >= 1


def test_decode_slots_sample_what_all_rows_at_once_do(run):
    """rollout.decode_slots (continuous batching) changes how many rows decode at once, not the samples."""
    _, whole, _ = rollout(run, seed=2)
    whole_rows = run.config
    run.config = run.config.replace_at("rollout.decode_slots", 5)
    try:
        _, slotted, _ = rollout(run, seed=2)
    finally:
        run.config = whole_rows
    for field in ("response", "response_len", "reward", "sampler_logp", "selected"):
        np.testing.assert_allclose(getattr(slotted, field), getattr(whole, field), atol=2e-6, err_msg=field)


def test_plain_grpo_skips_the_group_filters_unless_asked():
    """The reference filters only tree-sampled groups: plain GRPO keeps them all unless
    algo.filter_plain; tree sampling filters as configured."""
    config = tiny_config("plain_grpo")
    config.algo.update(drop_low_mean_frac=0.5, filter_scope="batch")
    run = build_run(resolve(config))
    m = train_step(run, 1)
    assert m["groups"] == 3 and m["groups_kept"] == 3
    run.config = run.config.replace_at("algo.filter_plain", True)
    assert train_step(run, 2)["groups_kept"] < 3
    tree = tiny_config()
    tree.algo.update(drop_low_mean_frac=0.5, filter_scope="batch")
    tree = build_run(resolve(tree))
    m = train_step(tree, 1)
    assert m["groups_kept"] < m["groups"]


def test_one_shared_lora_adapter_learns_from_every_agent():
    """policy.sharing="shared_lora" (the reference's L1 YAML, row 9): one adapter routed to both agents,
    trained on both agents' samples; the base stays as it was."""
    run = build_run(resolve(tiny_config("shared_lora")))
    (policy,) = run.policies
    assert policy.name == "lora_shared" and policy.is_lora and list(run.policy_of_agent) == [0, 0]
    base, adapters = [np.asarray(x) for x in jax.tree.leaves(policy.frozen)], param_leaves(policy)
    metrics = train_step(run, 1)
    assert metrics["samples"] > 0 and not metrics["skipped"]
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(base, jax.tree.leaves(policy.frozen)))
    assert any(not np.array_equal(a, b) for a, b in zip(adapters, param_leaves(policy)))
