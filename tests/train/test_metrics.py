"""metrics.jsonl and TensorBoard scalars (read back with TensorBoard's own reader), resume, progress line."""
import glob
import io
import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from atgrpo_jax.train.metrics import MetricsWriter

from atgrpo_jax.train.metrics_files import read_metrics, read_tb_scalars
from atgrpo_jax.train.progress import ProgressBar


def _rows(seed, steps):
    """Deterministic metrics of a run: a mix of Python, NumPy and JAX scalars."""
    rng = np.random.default_rng(seed)
    out = []
    for step in steps:
        out.append((step, {"loss": float(rng.standard_normal()), "reward/agent0": np.float32(rng.random()),
                           "tokens": int(rng.integers(100, 1000)), "skipped": False,
                           "success": jnp.float32(step / 10)}))
    return out


def _write(workdir, rows, **kw):
    writer = MetricsWriter(workdir, **kw)
    for step, scalars in rows:
        writer.write(step, scalars)
    return writer


def test_jsonl_and_tensorboard_round_trip(tmp_path):
    rows = _rows(0, range(1, 6))
    writer = _write(str(tmp_path), rows)
    writer.write_text(2, "episodes", "**task 0**")  # as every real run does: read_tb_scalars skips it
    writer.close()
    got = read_metrics(str(tmp_path))
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5]
    for row, (step, scalars) in zip(got, rows):
        assert list(row) == ["step", "loss", "reward/agent0", "tokens", "skipped", "success"]
        assert row["loss"] == scalars["loss"]  # float64 exact in JSON
        assert row["reward/agent0"] == float(scalars["reward/agent0"])
        assert row["tokens"] == scalars["tokens"] and isinstance(row["tokens"], int)
        assert row["skipped"] == 0 and row["success"] == float(scalars["success"])
    tb = read_tb_scalars(str(tmp_path))  # TensorBoard's EventAccumulator (the text tag is not a scalar)
    assert set(tb) == {"loss", "reward/agent0", "tokens", "skipped", "success"}
    for tag, points in tb.items():
        assert [s for s, _ in points] == [1, 2, 3, 4, 5]
        for (_, value), (_, scalars) in zip(points, rows):
            assert value == float(np.float32(float(scalars[tag])))  # stored as float32
    names = os.listdir(tmp_path / "tb")
    assert len(names) == 1 and names[0].startswith("events.out.tfevents.")


def test_non_finite_values_are_null_in_jsonl_and_absent_in_tensorboard(tmp_path):
    with MetricsWriter(str(tmp_path)) as w:
        w.write(1, {"loss": 0.5, "kl": 0.1})
        w.write(2, {"loss": float("nan"), "kl": np.float32("inf"), "eval": None})
        w.write(3, {"loss": 0.25, "kl": -np.inf})
    text = (tmp_path / "metrics.jsonl").read_text()
    strict = [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
              for line in text.splitlines()]
    assert strict[1] == {"step": 2, "loss": None, "kl": None, "eval": None}
    assert strict[2]["kl"] is None and strict[2]["loss"] == 0.25
    tb = read_tb_scalars(str(tmp_path))
    assert tb["loss"] == [(1, 0.5), (3, 0.25)]
    assert [s for s, _ in tb["kl"]] == [1] and "eval" not in tb
    assert all(math.isfinite(v) for points in tb.values() for _, v in points)


def test_bad_values_raise_naming_the_key(tmp_path):
    with MetricsWriter(str(tmp_path)) as w:
        with pytest.raises(ValueError, match="'per_agent' must be a scalar"):
            w.write(1, {"per_agent": np.ones(3)})
        with pytest.raises(TypeError, match="'phase'"):
            w.write(1, {"phase": "rollout"})
        with pytest.raises(ValueError, match="reserved"):
            w.write(1, {"step": 3})
        w.write(1, {"ok": 1.0})
    assert read_metrics(str(tmp_path)) == [{"step": 1, "ok": 1.0}]


@pytest.mark.parametrize("uid", [0, 8])
def test_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch, uid):
    # uid 8 (the full run takes it): the killed run's event file ends in ".9", the resumed one's in
    # ".10", which sorts first when both are made in the same second.
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(uid))
    full = str(tmp_path / "full")
    _write(full, _rows(0, range(1, 9))).close()

    resumed = str(tmp_path / "resumed")
    # The killed run: its steps 5 and 6 came after its last checkpoint (step 4) and
    # differ from what the resumed run recomputes; it died while writing step 7.
    killed = _write(resumed, _rows(0, range(1, 5)) + _rows(99, range(5, 7)))
    killed._file.write('{"step": 7, "loss": 0.3')
    killed._file.flush()  # no close(): the process died, also in the middle of an event record
    killed._events.flush()
    (old_events,) = glob.glob(os.path.join(resumed, "tb", "events.out.tfevents.*"))
    with open(old_events, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x00")
    assert [r["step"] for r in read_metrics(resumed)] == [1, 2, 3, 4, 5, 6]  # torn line skipped
    assert max(s for s, _ in read_tb_scalars(resumed)["loss"]) == 6

    _write(resumed, _rows(0, range(1, 9))[4:], resume_step=4).close()
    killed._events.close()
    assert (tmp_path / "resumed" / "metrics.jsonl").read_bytes() == (tmp_path / "full" / "metrics.jsonl").read_bytes()
    assert len(os.listdir(os.path.join(resumed, "tb"))) == 2  # the resumed run adds a file
    old_steps = [e.step for e in EventFileLoader(old_events).Load() if e.HasField("summary")]
    assert old_steps == [1, 2, 3, 4]  # the killed run's later events are gone from its file
    got, want = read_tb_scalars(resumed), read_tb_scalars(full)
    assert got == want
    assert [s for s, _ in got["loss"]] == list(range(1, 9))


def test_appending_after_a_torn_line_keeps_the_next_line_whole(tmp_path):
    _write(str(tmp_path), [(1, {"a": 1.0})]).close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "a"')  # killed mid-line, then restarted without resume_step
    _write(str(tmp_path), [(2, {"a": 2.0})]).close()
    assert read_metrics(str(tmp_path)) == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]


def test_local_workdir_is_written_in_place_without_uploads(tmp_path):
    """A local (pathlib) workdir: every write is on disk at once; sync() has nothing to upload."""
    w = MetricsWriter(tmp_path / "run", sync_every_s=0.0)
    w.write(1, {"loss": 0.5})
    assert read_metrics(str(tmp_path / "run")) == [{"step": 1, "loss": 0.5}]  # before close
    assert read_tb_scalars(tmp_path / "run") == {"loss": [(1, 0.5)]}
    assert w.sync() == [] and w.path == str(tmp_path / "run" / "metrics.jsonl")
    w.close()
    w.close()  # idempotent
    assert sorted(os.listdir(tmp_path / "run")) == ["metrics.jsonl", "tb"]
    with pytest.raises(RuntimeError, match="closed"):
        w.write(2, {"loss": 0.4})


def test_disabled_writer_writes_nothing(tmp_path):
    workdir = tmp_path / "proc1"
    w = MetricsWriter(str(workdir), enabled=False, resume_step=3)
    w.write(1, {"loss": 1.0})
    w.close()
    assert not workdir.exists()


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _clock(times):
    it = iter(times)
    return lambda: next(it)


def test_progress_bar_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    # t0 = 0; every update reads the clock once: 2 s per step.
    bar = ProgressBar(10, stream=out, print_every=5, clock=_clock([0.0] + [2.0 * i for i in range(1, 11)]))
    for step in range(1, 11):
        bar.update(step, {"success": step / 10, "reward": 1.5, "loss": 0.123456, "other": 9})
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/10", "5/10", "10/10"]
    assert "\r" not in out.getvalue()
    assert lines[1] == "step 5/10 [ 50%]  success 0.5  reward 1.5  loss 0.123  | 0:00:10 elapsed, ETA 0:00:10"
    assert lines[2].endswith("0:00:20 elapsed, ETA 0:00:00") and "other" not in lines[2]


def test_progress_bar_redraws_in_place_on_a_terminal_and_times_only_this_process():
    out = _Tty()
    # Resumed at step 40 of 100: ETA from the steps timed here after the first (which compiles): 3 s each.
    bar = ProgressBar(100, stream=out, start_step=40, keys=("train/success",), clock=_clock([0.0, 3.0, 6.0]))
    bar.update(41, {"train/success": 0.25})
    bar.update(42, {})
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    first, second = text.strip("\n").split("\r")[1:]
    assert first.startswith("step 41/100 [ 41%]  success 0.25  |") and first.endswith("ETA ?")
    assert second.rstrip().endswith("0:00:06 elapsed, ETA 0:02:54")
    assert len(second) == len(first)  # padded over the longer previous line
    quiet = io.StringIO()
    ProgressBar(5, stream=quiet, enabled=False).update(5, {"loss": 1.0})
    assert quiet.getvalue() == ""


def test_episode_rows_and_text_are_truncated_on_resume_like_metrics(tmp_path):
    from atgrpo_jax.train.metrics_files import EPISODES_FILE

    with MetricsWriter(str(tmp_path)) as w:
        for step in (1, 2, 3):
            w.write(step, {"loss": float(step)})
            w.write_rows(EPISODES_FILE, [{"step": step, "task": t} for t in range(2)])
            w.write_text(step, "episodes", f"**step {step}**")
        with pytest.raises(ValueError, match="metrics.jsonl"):
            w.write_rows("metrics.jsonl", [{"step": 1}])
    with MetricsWriter(str(tmp_path), resume_step=1):
        pass
    rows = [json.loads(line) for line in (tmp_path / EPISODES_FILE).read_text().splitlines()]
    assert [(r["step"], r["task"]) for r in rows] == [(1, 0), (1, 1)]
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1]


def test_completion_metrics_of_the_live_samples_per_role():
    """Lengths, the share cut at the budget without a stop token, and groups with no reward spread:
    two groups of agent 0 (budget 4) and one of agent 1 (budget 3); stop id 2; one sample not live."""
    import types

    import numpy as np

    from atgrpo_jax.train.step_metrics import completion_metrics

    response = np.zeros((3, 2, 4), np.int32)
    response[0, 0, :4] = [5, 6, 7, 8]  # cut at 4, no stop: clipped
    response[0, 1, :2] = [5, 2]
    response[1, 0, :4] = [5, 6, 7, 2]  # at the budget but stopped: not clipped
    response[1, 1, :1] = [9]  # not live
    response[2, 0, :3] = [5, 6, 7]  # agent 1's budget 3: clipped
    response[2, 1, :3] = [5, 6, 2]
    samples = types.SimpleNamespace(
        response=response, response_len=np.array([[4, 2], [4, 1], [3, 3]]),
        mask=np.array([[True, True], [True, False], [True, True]]),
        sample_agent=np.array([[0, 0], [0, 0], [1, 1]]), reward=np.array([[1.0, 0.0], [0.5, 0.5], [0.2, 0.2]]))
    m = completion_metrics(samples, [4, 3], (2,), ["a", "b"])
    assert m["completion_len_mean"] == (4 + 2 + 4 + 3 + 3) / 5 and m["completion_len_min"] == 2
    assert m["completion_len_max"] == 4 and m["clipped_ratio"] == 2 / 5
    assert m["zero_std_groups"] == 1 / 2  # group 1 has one live sample: not counted; group 2 is flat
    assert m["a/clipped_ratio"] == 1 / 3 and m["a/zero_std_groups"] == 0.0
    assert m["b/clipped_ratio"] == 1 / 2 and m["b/zero_std_groups"] == 1.0 and m["b/completion_len_mean"] == 3
    assert "a/clipped_ratio" not in completion_metrics(samples, [4, 3], (2,), ["solo"])


def test_a_stalled_team_is_named_once_per_cause():
    """A role whose groups all score alike while the other's differ (a checker that always says "n") is
    named after `steps` such steps; team success 0 through the window while a role's reward rises names
    that role; one role alone, or every role flat (the no-signal warning's case), says nothing here."""
    from atgrpo_jax.train.guard import StallWatch

    def row(checker_flat, success=0.0, proposer=0.2, checker=-1.0):
        return {"reward/proposer": proposer, "reward/checker": checker, "success": success,
                "proposer/zero_std_groups": 0.5, "checker/zero_std_groups": 1.0 if checker_flat else 0.5}

    watch = StallWatch(steps=3, window=100)
    said = [watch.update(row(flat, success=0.5)) for flat in (True, True, False, True, True, True, True, True)]
    assert [len(s) for s in said] == [0, 0, 0, 0, 0, 1, 0, 0]  # once, after 3 in a row
    assert said[5][0].startswith("warning: role checker gets no learning signal: in each of the last 3 steps")
    everyone_flat = dict(row(True), **{"proposer/zero_std_groups": 1.0})
    assert StallWatch(steps=1).update(everyone_flat) == []
    assert StallWatch(steps=1).update({"reward/solo": 0.0, "solo/zero_std_groups": 1.0}) == []

    watch = StallWatch(steps=100, window=4)
    rising = [watch.update(row(False, proposer=p)) for p in (0.1, 0.2, 0.4, 0.6, 0.7)]
    assert [len(s) for s in rising] == [0, 0, 0, 1, 0]
    assert rising[3][0].startswith("warning: team success has been 0 for the last 4 steps while "
                                   "reward/proposer rose (0.1 -> 0.6): proposer is learning its own reward")
    flat_rewards = StallWatch(steps=100, window=4)
    assert not any(flat_rewards.update(row(False)) for _ in range(6))
    some_success = StallWatch(steps=100, window=4)
    assert not any(some_success.update(row(False, success=0.25 * (i == 2), proposer=0.1 * i)) for i in range(6))
