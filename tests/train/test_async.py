"""The asynchronous schedule: the same samples, metrics and parameters as the synchronous one;
pools and host workers really overlap; staleness N samples with the weights from before the last N updates,
an episode's later turns with newer ones (partial rollouts)."""
import threading
import time

import jax
import numpy as np
import pytest

from atgrpo_jax.rollout.tree import RolloutInputs, Schedule, TreeRollout
from atgrpo_jax.trace import Tracer, overlap_seconds
from atgrpo_jax.train.metrics import is_wall_clock
from atgrpo_jax.train.setup import build_run
from atgrpo_jax.train.validate import resolve
from atgrpo_jax.train.step import train_step
from tiers import full_case
from tiny_config import tiny



def config(sharing="shared", pools=False, schedule="sync", **system):
    """The tests' tiny config with six tasks of three branches, a fast optimizer and the given system."""
    return tiny(**{"model.init_seed": 0, "rollout.num_tasks": 6, "rollout.k": 3, "rollout.max_new_tokens": 4,
                   "optim.lr": 1e-2, "optim.schedule": "constant", "optim.warmup_steps": 0,
                   "optim.mini_batch_size": 16, "policy.sharing": sharing, "policy.pools": pools,
                   "mesh": dict(data=1, fsdp=2 if pools else 1, tensor=1),  # pools: one device each
                   "system.schedule": schedule, "system.cohorts": 3, "system.host_workers": 2,
                   **{f"system.{k}": v for k, v in system.items()}})


def two_steps(c, tracers=None):
    run = build_run(resolve(c))
    tracers = [Tracer(), Tracer()] if tracers is None else tracers
    metrics = [train_step(run, step, tracer=t) for step, t in zip((1, 2), tracers)]
    params = [np.asarray(x) for p in run.policies for x in jax.tree.leaves(p.state.params)]
    return metrics, params


def early_starts(tracer: Tracer) -> list[tuple[str, float, float]]:
    """(pool, when its update started, when the other pools' last sampling ended) per early start."""
    events = tracer.to_json()["traceEvents"]
    track = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    spans = [(track[e["tid"]], e["name"], e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X"]
    return [(pool, ts, max(end for other, name, _, end in spans if other != pool and name.startswith("sample")))
            for pool, name, ts, _ in spans if name == "start update"]


@pytest.mark.parametrize("sharing,pools", [pytest.param("per_role", True, id="per_role_pools"),
                                           full_case("shared", False, id="shared")])  # tiers.py
def test_async_schedule_equals_the_synchronous_loop(sharing, pools):
    """...and with several policies, a policy's update starts while the other pool still samples
    (its agents' stages are done in every cohort): the results are still those of the loop."""
    tracers = [Tracer(), Tracer()]
    (m_sync, p_sync), (m_async, p_async) = (two_steps(config(sharing, pools, s), tracers if s == "async" else None)
                                            for s in ("sync", "async"))
    if sharing == "per_role":
        for t in tracers:  # the first agent acts first in each turn: its pool is done first
            starts = {pool: (start, other_end) for pool, start, other_end in early_starts(t)}
            start, other_end = starts["pool policy_planner"]
            assert start < other_end, starts
    for a, b in zip(m_sync, m_async):
        assert set(a) == set(b)
        for key in a:
            if is_wall_clock(key):
                continue
            if key.endswith(("samples", "groups", "groups_kept", "success", "turns")) or key.startswith("reward"):
                assert a[key] == b[key], key  # the same samples and rewards, exactly
            else:
                np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for x, y in zip(p_sync, p_async):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-7)


def slow_sample_fn(delay_s):
    """A stand-in for a pool's decoding: the device's time (a sleep), then K answers per prompt."""
    from atgrpo_jax.rollout.samples import SampleOut

    def sample(agent, prompts, k, keys):
        time.sleep(delay_s)
        n = len(prompts) * k
        return SampleOut.from_rows(np.full((n, 2), 7), np.full(n, 2), np.zeros((n, 2)), ["RD"] * n, 4)
    return sample


class SlowEnv:
    """The workflow with host time added to every step (a sandbox run, say): the calls take the
    delays in turn, so cohorts fall out of step as they do in a real run. With one delay for all,
    the cohorts that one call sampled together stay in lockstep and the two pools can end up
    strictly alternating (seen under load); uneven host times are what let them overlap."""

    def __init__(self, wf, delays_s):
        self.wf, self.delays_s, self.calls, self.lock = wf, delays_s, 0, threading.Lock()
        self.agents, self.max_turns, self.name, self.splits = wf.agents, wf.max_turns, wf.name, wf.splits

    def __getattr__(self, name):
        return getattr(self.wf, name)

    def step(self, *args):
        with self.lock:
            delay, self.calls = self.delays_s[self.calls % len(self.delays_s)], self.calls + 1
        time.sleep(delay)
        return self.wf.step(*args)


def test_pools_and_host_workers_overlap_on_the_timeline():
    """Two pools and a slow environment (sleeps stand in for device and sandbox time, so what is
    checked is the schedule, not this machine's speed): the timeline shows them at work at once."""
    from atgrpo_jax.envs.workflow_registry import make_workflow

    wf = SlowEnv(make_workflow("plan_path_demo", view="local", lenient=True, plan_len=2, exec_len=2),
                 (0.02, 0.05, 0.2, 0.3))
    tracer = Tracer()
    schedule = Schedule(cohorts=4, asynchronous=True, host_workers=2, pool_of_agent=(0, 1),
                        pool_names=("A", "B"), tracer=tracer)
    TreeRollout(3).begin(RolloutInputs(wf, slow_sample_fn(0.1), lambda m, a: [1, 2, 3], np.arange(8), "train",
                                       max_turns=2, alpha=1.0, key=jax.random.key(0), schedule=schedule)).run()
    a, b, host = tracer.spans("pool A"), tracer.spans("pool B"), tracer.spans("host")
    events = tracer.to_json()["traceEvents"]
    track = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    served = {name: 0 for name in ("pool A", "pool B")}
    for e in events:  # a call may serve several cohorts' stages (their requests waited together)
        if e["ph"] == "X" and track[e["tid"]] in served:
            served[track[e["tid"]]] += len(e["args"]["cohort"]) if isinstance(e["args"]["cohort"], list) else 1
    assert served == {"pool A": 4 * 2, "pool B": 4 * 2}  # every cohort's two turns, each agent on its own pool
    assert overlap_seconds(a, b) > 0.05  # the two pools sampled at the same time (half a call at least)
    assert overlap_seconds([s for s in host if s[1] - s[0] > 0.09], a + b) > 0.2  # steps ran while pools decoded
    out = tracer.to_json()["traceEvents"]
    assert {e["args"]["name"] for e in out if e["ph"] == "M"} == {"pool A", "pool B", "host"}


# staleness 1 on one policy in the full tier (tiers.py): staleness 2 on two pools keeps the family here
@pytest.mark.parametrize("staleness,correction,sharing", [full_case(1, "none", "shared"), (2, "truncated", "per_role")])
def test_staleness_n_samples_with_weights_up_to_n_updates_old(tmp_path, staleness, correction, sharing):
    """The lag of each step's samples; the ratio against the sampler's log-probs, or with
    loss.is_correction the decoupled form: clipped around recomputed old log-probs, each token weighted
    by pi_old / pi_sampler (not a correction of 1 against itself). per_role: two policies on two pools,
    their updates paced from threads beside the rollouts in flight."""
    from atgrpo_jax.train.loop import run_training
    from atgrpo_jax.train.metrics_files import read_metrics

    c = config(sharing, pools=sharing == "per_role")
    c.system.staleness = staleness
    c.loss.update(is_correction=correction, is_cap=1.5)
    c.train.update(steps=3, eval_every=0, checkpoint_every=0, log_episodes_every=0)  # step 3: 2 steps behind
    run_training(c, str(tmp_path))
    rows = read_metrics(str(tmp_path))
    prefixes = [""] if sharing == "shared" else [f"{name}/" for name in ("policy_planner", "policy_executor")]
    updates = {p: [r[f"{p}updates"] for r in rows] for p in prefixes}  # optimizer steps per training step
    assert "lag_updates" not in rows[0]  # the first step samples with its own weights
    for i, r in enumerate(rows[1:], start=1):  # the oldest samples: the updates of the last N steps behind
        assert r["lag_updates_max"] == max(sum(u[max(0, i - staleness):i]) for u in updates.values())
        assert r["lag_updates"] >= min(u[i - 1] for u in updates.values()) > 0  # none is on-policy
    if correction == "none":
        assert all("logprob_gap" not in r for r in rows[1:])  # the ratio is against the sampler's log-probs
    else:
        for p in prefixes:
            assert rows[0][f"{p}logprob_gap"] < 1e-5  # the first step samples with its own weights
            assert all(r[f"{p}logprob_gap"] > 1e-4 and r[f"{p}is_weight_mean"] != 1.0 for r in rows[1:])


def test_the_stale_rollout_is_the_one_of_the_weights_before_the_update():
    from atgrpo_jax.train.prefetch import Prefetch
    from atgrpo_jax.train.step import rollout_step

    c = config()
    run, fresh = build_run(resolve(c)), build_run(resolve(c))
    prefetch = Prefetch(run, last_step=2)
    train_step(run, 1, prefetch=prefetch)
    ahead = prefetch.take(2)
    assert (ahead.samples.version[ahead.samples.mask] == 0).all()  # sampled at optimizer step 0
    before, after = rollout_step(fresh, 2), rollout_step(run, 2)  # step 2 at the initial / updated weights
    np.testing.assert_array_equal(ahead.samples.response, before.samples.response)
    np.testing.assert_allclose(ahead.samples.sampler_logp, before.samples.sampler_logp, rtol=1e-6, atol=1e-6)
    gap = np.abs(after.samples.sampler_logp - before.samples.sampler_logp)[before.samples.mask].max()
    assert gap > 1e-3  # at the updated weights the distribution is another one


def test_staleness_2_continues_each_episode_under_the_newer_weights():
    """A partial rollout: step 3's first turn samples during step 1's update (the initial weights), its
    second during step 2's (the weights after step 1), from the state the first turn left; as made by
    hand from the same weights, and each sample records which weights made it."""
    from atgrpo_jax.train.prefetch import Prefetch
    from atgrpo_jax.train.step import begin_step_rollout, end_rollout, policy_states, sampling_versions, \
        set_policy_states

    c = config()
    run, by_hand = build_run(resolve(c)), build_run(resolve(c))
    prefetch = Prefetch(run, last_step=3, staleness=2)
    train_step(run, 1, prefetch=prefetch)  # during it: rollout 2 whole, rollout 3's first turn
    after_1 = jax.tree.map(jax.numpy.copy, policy_states(run))
    train_step(run, 2, prefetch=prefetch)  # during it: rollout 3's second turn
    three = prefetch.take(3).samples
    inflight = begin_step_rollout(by_hand, 3)
    inflight.advance(1, sampling_versions(by_hand))  # turn 0 at the initial weights
    set_policy_states(by_hand, after_1)
    inflight.advance(None, sampling_versions(by_hand))  # turn 1 at those after step 1
    want, _ = end_rollout(by_hand, inflight)
    np.testing.assert_array_equal(three.response, want.response)
    np.testing.assert_array_equal(three.version, want.version)
    np.testing.assert_allclose(three.sampler_logp, want.sampler_logp, rtol=1e-6, atol=1e-6)
    step_1 = int(after_1[run.policies[0].name].step)
    live = three.mask
    assert set(three.version[live & (three.turn[:, None] == 0)]) == {0}
    assert step_1 > 0 and set(three.version[live & (three.turn[:, None] == 1)]) == {step_1}


def test_timeline_arithmetic_against_a_fine_time_grid():
    from atgrpo_jax.trace import union

    rng = np.random.default_rng(0)
    a = [(s, s + d) for s, d in zip(rng.uniform(0, 10, 6), rng.uniform(0, 3, 6))]
    b = [(s, s + d) for s, d in zip(rng.uniform(0, 10, 6), rng.uniform(0, 3, 6))]
    grid = np.arange(0, 14, 1e-4) + 5e-5  # cell centres
    covered = lambda spans: np.any([(grid > s) & (grid < e) for s, e in spans], axis=0)  # noqa: E731
    want = sum(((grid > s) & (grid < e) & covered(b)).sum() for s, e in a) * 1e-4
    assert overlap_seconds(a, b) == pytest.approx(want, abs=1e-2)
    assert overlap_seconds(a, b) <= sum(e - s for s, e in a)
    assert sum(e - s for s, e in union(a)) == pytest.approx(covered(a).sum() * 1e-4, abs=1e-2)
    tracer = Tracer()
    tracer._events = [{"tid": 0, "ts": s * 1e6, "dur": (e - s) * 1e6} for s, e in a]
    tracer._tracks = {"pool A": 0}
    assert tracer.busy_seconds("pool") == pytest.approx(covered(a).sum() * 1e-4, abs=1e-2)


def test_a_step_whose_groups_are_all_filtered_updates_nothing():
    from atgrpo_jax.train.step import finish_updates

    assert finish_updates([], Tracer()) == []  # (a code step whose groups all had one reward crashed here)


def test_requests_waiting_at_a_pool_are_sampled_in_one_call():
    """While a pool decodes, the next cohorts' requests of the same agent queue up; the pool samples
    them in one call (one decode), and each prompt's responses are still those of its own key."""
    from atgrpo_jax.envs.workflow_registry import make_workflow
    from atgrpo_jax.rollout.samples import SampleOut

    calls = []

    def keyed_sample_fn(agent, prompts, k, keys):
        calls.append((agent, len(prompts)))
        time.sleep(0.05)
        moves = [int(jax.random.randint(key, (), 0, 4)) for key in keys]
        texts = ["UDLR"[(m + j) % 4] * 2 for m in moves for j in range(k)]
        n = len(texts)
        return SampleOut.from_rows(np.full((n, 2), 7), np.full(n, 2), np.zeros((n, 2)), texts, 4)

    wf = make_workflow("plan_path_demo", view="local", lenient=True, plan_len=2, exec_len=2)
    run = lambda schedule: TreeRollout(3).begin(RolloutInputs(  # noqa: E731
        wf, keyed_sample_fn, lambda m, a: [1, 2, 3], np.arange(8), "train", max_turns=2, alpha=1.0,
        key=jax.random.key(0), schedule=schedule)).run()
    sync, _ = run(None)
    calls.clear()
    merged, _ = run(Schedule(cohorts=4, asynchronous=True, host_workers=1, pool_of_agent=(0, 0)))
    assert max(n for _, n in calls) > 2 and len(calls) < 4 * 2 * 2  # some calls served several cohorts
    order = lambda s: np.lexsort((s.task, s.agent, s.turn))  # noqa: E731
    for field in ("mask", "text", "selected"):
        np.testing.assert_array_equal(getattr(merged, field)[order(merged)], getattr(sync, field)[order(sync)], field)
    # the grid steps 2 tasks at a time here, 8 in the sync run: newer XLA may sum a reward's moves in
    # another order for another batch shape (1 ulp seen with jax 0.12)
    np.testing.assert_allclose(merged.reward[order(merged)], sync.reward[order(sync)], rtol=0, atol=1e-5)
