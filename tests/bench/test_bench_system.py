"""The system benchmark's claims (not its timings): the latency model's arithmetic, and one
small run of each workflow whose report says what each schedule did."""
import json

import pytest

from atgrpo_jax.bench import system


def test_latency_model_arithmetic():
    m = system.LatencyModel(params=1e9, peak_flops=100e12, hbm_bytes_per_s=1e12, chips=2, mfu=0.5)
    # one row: each decode step reads the weights (2 GB at 2 TB/s = 1 ms); no prompt
    assert m.sample_s(0, 1, 10) == pytest.approx(10 * 1e-3)
    # 10,000 rows: each step is compute-bound (2 * 1e9 * 1e4 FLOPs at 1e14 FLOP/s = 0.2 s)
    assert m.sample_s(0, 10_000, 1) == pytest.approx(0.2)
    assert m.sample_s(1000, 1, 0) == pytest.approx(2e12 / 1e14)  # prefill: 2 FLOPs per param and token
    assert m.update_s(1000) == pytest.approx(6e12 / 1e14)  # forward and backward: 6 per param and token


@pytest.mark.parametrize("workflow", ["plan_path", "code"])
def test_one_small_run_reports_both_schedules(workflow, capsys):
    assert system.main(["--workflow", workflow, "--tasks", "4", "-k", "2", "--turns", "1", "--steps", "1",
                        "--new-tokens", "8", "--cohorts", "2", "--host-workers", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["ratio"] == pytest.approx(report["sides"]["async"]["best"] / report["sides"]["sync"]["best"])
    for side in report["sides"].values():
        (step,) = side["steps"]
        assert 0 < step["rollout"] <= step["total"]
        assert step["host_s"] > 0 and 0 <= step["host_overlapped"] <= 1
        assert all(0 < step[f"pool_busy_{p}"] <= 1 for p in "AB")  # each agent sampled on its own pool
        assert min(step["update_tokens"]) > 0
        assert 0 < side["device_only"] <= side["best"]  # host work only adds time
    assert report["device_only_ratio"] == pytest.approx(
        report["sides"]["async"]["device_only"] / report["sides"]["sync"]["device_only"])
    assert 0 < report["bound_ratio"] <= 1 and report["bound_ratio"] <= report["device_only_ratio"] + 1e-9


def test_device_only_replay():
    """Two cohorts, A then B each (1 s per stage), updates A 2 s, B 1 s: the sync loop is 4 s of stages
    then the longer update; the pipelined schedule overlaps the pools, and A's early update overlaps B."""
    one_cohort = [((0,), "A", 2.0), ((0,), "B", 2.0)]
    assert system.device_only(one_cohort, {"A": 2.0, "B": 1.0}, early=False) == pytest.approx(6.0)
    two = [((0,), "A", 1.0), ((1,), "A", 1.0), ((0,), "B", 1.0), ((1,), "B", 1.0)]
    # A: 0-1 (c0), 1-2 (c1); B: 1-2 (c0), 2-3 (c1); A's update 2-4, B's 3-4
    assert system.device_only(two, {"A": 2.0, "B": 1.0}, early=True) == pytest.approx(4.0)
    assert system.device_only(two, {"A": 2.0, "B": 1.0}, early=False) == pytest.approx(5.0)
    merged = [((0, 1), "A", 1.0), ((0, 1), "B", 1.0)]  # one call for both cohorts' stages on each pool
    assert system.device_only(merged, {"A": 2.0, "B": 1.0}, early=True) == pytest.approx(3.0)


def test_schedule_bound_is_each_pools_sampling_then_its_update():
    two = [((0,), "A", 1.0), ((1,), "A", 1.0), ((0,), "B", 1.0), ((1,), "B", 0.5)]
    assert system.schedule_bound(two, {"A": 2.0, "B": 1.0}) == pytest.approx(4.0)  # A: 2 s sampling + 2 s update
    assert system.schedule_bound(two, {"A": 0.5, "B": 3.0}) == pytest.approx(4.5)  # B: 1.5 + 3
    # the pipelined replay never beats it
    assert system.device_only(two, {"A": 2.0, "B": 1.0}, early=True) >= system.schedule_bound(two, {"A": 2.0, "B": 1.0})


def test_stage_times_reads_each_sampling_call_with_its_cohorts_and_pool():
    from atgrpo_jax.trace import Tracer
    tracer = Tracer()
    with tracer.span("sample", track="pool A", cohort=0):
        pass
    with tracer.span("step", track="host", cohort=0):  # not a sampling call
        pass
    with tracer.span("sample", track="pool B", cohort=(0, 1)):  # one call serving two cohorts
        pass
    stages = system.stage_times(tracer)
    assert [(c, p) for c, p, _ in stages] == [((0,), "A"), ((0, 1), "B")]
    assert all(s >= 0 for _, _, s in stages)


def test_due_parts_follow_the_trainers_cut():
    """Rollout r's part j runs during step r - N + j's update (the first step's, for those before it);
    a part already done is not run again."""
    from atgrpo_jax.bench.system_ahead import due_parts, part_ends

    assert part_ends(2, 2) == [1, 2] and part_ends(3, 2) == [1, 3] and part_ends(1, 2) == [0, 1]
    assert due_parts(1, 2, 10, {}) == [(2, 0), (2, 1), (3, 0)]  # rollout 2 whole, rollout 3's first part
    assert due_parts(2, 2, 10, {3: 1}) == [(3, 1), (4, 0)]
    assert due_parts(9, 2, 10, {10: 1}) == [(10, 1)]  # nothing past the last step
    assert due_parts(1, 1, 10, {}) == [(2, 0)]  # staleness 1: the next rollout whole


def test_a_small_pipelined_run_reports_its_steps(capsys):
    assert system.main(["--tasks", "4", "-k", "2", "--turns", "2", "--steps", "2", "--new-tokens", "8",
                        "--cohorts", "2", "--host-workers", "2", "--staleness", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    side = report["sides"]["async"]
    assert len(side["steps"]) == 2 and report["config"]["staleness"] == 2
    assert report["ratio"] == pytest.approx(side["best"] / report["sides"]["sync"]["best"])
    for step in side["steps"]:
        assert step["host_s"] > 0  # every measured step makes parts of later rollouts
        assert all(0 < step[f"pool_busy_{p}"] <= 1 for p in "AB")
