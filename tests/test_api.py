"""The Python API (atgrpo_jax.Trainer) and one-episode workflows (atgrpo_jax.Episode), as a TRL user
would try them: reward functions and records in memory, a two-role episode in ~30 lines."""
import json
import os
import sys
import types

import numpy as np
import pytest

from atgrpo_jax import Trainer
from atgrpo_jax.envs.episode import EpisodeWorkflow
from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.errors import ConfigError, UsageError
from atgrpo_jax.train.guard import SignalWatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs", "examples"))
import agree  # noqa: E402  (the docs' examples, trained here)
import judge  # noqa: E402

SHORT = {"train.steps": 2, "train.eval_every": 2, "train.eval_tasks": 4, "rollout.num_tasks": 4, "rollout.k": 2}
DATA = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(4) for b in range(3)]
SEEN = []  # what the reward functions were called with


def exact(completions, records, role, turn):
    SEEN.append((role, turn))
    return [1.0 if c.strip() == str(r["answer"]) else 0.0 for c, r in zip(completions, records)]


def length(completions):
    return [min(len(c), 3) / 3 for c in completions]


class Recorder:
    """A callback with TRL's method names."""

    def __init__(self):
        self.calls = []

    def on_step_end(self, step, metrics):
        self.calls.append(("step_end", step, "loss" in metrics))

    def on_evaluate(self, step, metrics):
        self.calls.append(("evaluate", step, "eval_success" in metrics))

    def on_save(self, step, metrics):
        self.calls.append(("save", step, True))


def test_a_trainer_trains_on_records_and_reward_functions_then_resumes_and_exports(tmp_path, monkeypatch, capsys):
    work = str(tmp_path / "run")
    recorder = Recorder()
    trainer = Trainer(os.path.join(ROOT, "configs", "sum_digits.py"), workdir=work, reward_fns=[exact, length],
                      reward_weights=[1.0, 0.1], train_dataset=DATA, overrides=SHORT, callbacks=[recorder])
    metrics = trainer.train()
    assert recorder.calls == [("step_end", 1, True), ("step_end", 2, True), ("evaluate", 2, True), ("save", 2, True)]
    assert set(metrics) >= {"eval_success", "eval/test/avg@1"} and 0 <= metrics["eval_success"] <= 1
    assert SEEN and set(SEEN) == {("assistant", 0)}  # asked for role and turn: it got them
    saved = json.loads(open(os.path.join(work, "config.json")).read())["env"]["kwargs"]
    assert [n.rsplit(".", 2)[-2:] for n in saved["reward_fn"]] == [["test_api", "exact"], ["test_api", "length"]]
    assert saved["train_path"].startswith("py:data:") and saved["test_path"].startswith("py:data:")
    from atgrpo_jax.registry import registered
    train, held = registered(saved["train_path"], "train"), registered(saved["test_path"], "test")
    assert len(held) == 1 and len(train) == 11 and held[0] not in train  # held out: never trained on
    again = Trainer(os.path.join(ROOT, "configs", "sum_digits.py"), workdir=work, reward_fns=[exact, length],
                    reward_weights=[1.0, 0.1], train_dataset=DATA, overrides={**SHORT, "train.steps": 3})
    metrics = again.train()  # the same objects under the same names: a plain resume
    assert again.train() == metrics  # a finished run: what it logged, not {}
    rows = [json.loads(line)["step"] for line in open(os.path.join(work, "metrics.jsonl"))]
    assert rows == [0, 1, 2, 3]
    import huggingface_hub
    uploads = []
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: types.SimpleNamespace(
        create_repo=lambda repo, exist_ok: None, upload_folder=lambda **kw: uploads.append(kw["repo_id"])))
    monkeypatch.setattr("atgrpo_jax.export.offline", lambda: False)  # the tests run offline; the upload is faked
    capsys.readouterr()
    out = again.export(str(tmp_path / "hf"), push_to_hub="me/sums")
    assert "model.safetensors" in out["files"] and out["step"] == 3
    assert out["pushed"] == "https://huggingface.co/me/sums" and uploads == ["me/sums"]
    assert capsys.readouterr().out == ""  # returned, not printed too
    with pytest.raises(UsageError, match=r"^--push_to_hub=sums: give a Hugging Face repository id, org/name$"):
        again.export(str(tmp_path / "hf2"), push_to_hub="sums")
    assert not (tmp_path / "hf2").exists()  # refused before any work


def test_several_reward_functions_are_summed_with_their_weights(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": 2}\n')
    wf = make_workflow("prompt_reward", train_path=str(data), test_path=str(data),
                       reward_fn=["prompt_reward_fns:exact", "test_api:length"], reward_weights=[1.0, 0.5])
    scores, feedback = wf.score(["2", "1"], [{"answer": 2}, {"answer": 2}], role="assistant", turn=0,
                                history=[(), ()])
    np.testing.assert_allclose(scores, [1.0 + 0.5 / 3, 0.5 / 3], rtol=1e-6)
    assert feedback[0].startswith("Your answer scored")
    out = wf.step(wf.reset([0], "train"), 0, 0, [["2", "10"]])  # each function's own score, for the metrics
    assert out.reward_parts.tolist() == [[{"exact": 1.0, "length": pytest.approx(1 / 3)},
                                          {"exact": 0.0, "length": pytest.approx(2 / 3)}]]
    from atgrpo_jax.train.step_metrics import reward_part_metrics

    samples = types.SimpleNamespace(reward_parts=np.concatenate([out.reward_parts, np.full((1, 2), None, object)]),
                                    mask=np.array([[True, True], [True, False]]),
                                    sample_agent=np.array([[0, 1], [0, 0]]))
    assert reward_part_metrics(samples) == {"reward_fn/exact/mean": 0.5, "reward_fn/exact/std": 0.5,
                                            "reward_fn/length/mean": pytest.approx(0.5),
                                            "reward_fn/length/std": pytest.approx(1 / 6)}
    by_role = reward_part_metrics(samples, ["solver", "checker"])  # several agents: per role too
    assert by_role["solver/reward_fn/exact/mean"] == 1.0
    assert by_role["checker/reward_fn/length/mean"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"env.kwargs.reward_weights: 1 weights for 2 reward functions"):
        make_workflow("prompt_reward", train_path=str(data), test_path=str(data),
                      reward_fn=["prompt_reward_fns:exact", "test_api:length"], reward_weights=[1.0])


class Counter:
    """An episode whose step changes the state it gets: each branch must have its own copy."""

    roles = ("a", "b")
    max_turns = 2
    splits = {"test": 3}

    def reset(self, task, split):
        return {"seen": [], "task": task}

    def prompt(self, role, turn, state):
        return [{"role": "user", "content": f"{role}{turn}{len(state['seen'])}"}]

    def step(self, role, turn, state, text):
        state["seen"].append(text)
        return state, float(len(text)), float(text == "ok"), text == "stop"


def test_an_episode_runs_batched_with_a_copy_per_branch():
    wf = EpisodeWorkflow(Counter())
    state = wf.reset([0, 1], "train")
    out = wf.step(state, 0, 0, [["ok", "x"], ["stop", "yy"]])
    assert out.local_reward.tolist() == [[2, 1], [4, 2]] and out.team_reward.tolist() == [[1, 0], [0, 0]]
    assert [s["seen"] for s in out.state["state"].ravel()] == [["ok"], ["x"], ["stop"], ["yy"]]
    assert state["state"][0]["seen"] == []  # the state it was given is untouched
    assert out.state["done"].tolist() == [[False, False], [True, False]]
    assert out.state["success"].tolist() == [[True, False], [False, False]]  # default: team reward > 0
    assert wf.prompts({"state": out.state["state"][:, 0]}, 1, 0)[0] == [{"role": "user", "content": "b01"}]


def test_the_docs_two_role_episode_trains(tmp_path):
    trainer = agree.trainer(str(tmp_path / "agree"), **{"train.steps": 2, "train.eval_every": 2,
                                                        "rollout.num_tasks": 4, "train.eval_tasks": 4})
    metrics = trainer.train()
    assert 0 <= metrics["eval_success"] <= 1
    rows = [json.loads(line) for line in open(tmp_path / "agree" / "metrics.jsonl")]
    assert {"reward/proposer", "reward/critic"} <= set(rows[-1])


def test_the_docs_three_role_episode_trains_and_its_judge_sees_only_the_solvers(tmp_path):
    trainer = judge.trainer(str(tmp_path / "judge"), **{"train.steps": 2, "train.eval_every": 2,
                                                        "rollout.num_tasks": 4, "train.eval_tasks": 4,
                                                        "train.log_episodes_every": 1})
    assert 0 <= trainer.train()["eval_success"] <= 1
    rows = [json.loads(line) for line in open(tmp_path / "judge" / "metrics.jsonl")]
    assert {"reward/left", "reward/right", "reward/judge"} <= set(rows[-1])
    log = json.loads(open(tmp_path / "judge" / "episodes.jsonl").readline())["log"]
    assert [t["agent"] for t in log] == ["left", "right", "judge"]
    left, right = (t["branches"][t["selected"]]["response"].strip()[:1] for t in log[:2])  # the kept branches
    assert f"user\n{left} {right}<|im_end|>" in log[2]["prompt"] and "say" not in log[2]["prompt"], log[2]["prompt"]


def test_runs_that_cannot_learn_say_so(tmp_path):
    with pytest.raises(ConfigError, match=r"config.rollout.k: 1: a group of one sample has no reward variance"):
        Trainer(os.path.join(ROOT, "configs", "demo.py"), workdir=str(tmp_path / "k1"),
                overrides={"rollout.k": 1, "rollout.tree": False}).train()
    with pytest.raises(ConfigError, match=r"config.rollout.max_turns: 1 would cut .* episodes of 2 turns short"):
        Trainer(os.path.join(ROOT, "configs", "demo.py"), workdir=str(tmp_path / "cut"), workflow=Counter(),
                overrides={"rollout.max_turns": 1}).train()
    watch = SignalWatch(steps=3)
    said = [watch.update({"adv_abs_mean": a, "reward_mean": 0.5}) for a in (0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0)]
    assert [s is not None for s in said] == [False, False, False, False, False, True, False]  # once, after 3 flat
    assert said[5].startswith("warning: no learning signal: in each of the last 3 steps every group's rewards")


def test_without_eval_dataset_a_seeded_tenth_is_held_out_and_said(capsys):
    from atgrpo_jax.api import hold_out

    rows = [{"prompt": str(i), "answer": i} for i in range(49)]
    train, held = hold_out(rows)
    assert len(held) == 5 and len(train) == 44 and not any(r in train for r in held)
    assert hold_out(rows) == (train, held)  # every process and every resume draws the same
    assert capsys.readouterr().err.splitlines()[0] == (
        "note: no eval_dataset: 5 of train_dataset's 49 rows are held out for evaluation and the best checkpoint "
        "(pass eval_dataset= to choose them)")
    assert hold_out(rows[:1]) == (rows[:1], rows[:1])


def test_api_errors_are_the_commands_one_line_without_the_package_s_frames(tmp_path):
    import traceback

    from atgrpo_jax.errors import OutputExists

    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    trainer = Trainer(os.path.join(ROOT, "configs", "sum_digits.py"), workdir=str(tmp_path / "run"))
    with pytest.raises(OutputExists, match=r"exists and is not empty: give a new directory or --overwrite "
                                           r"\(overwrite=True in Python\)$") as e:
        trainer.export(str(out))
    frames = [f.filename for f in traceback.extract_tb(e.value.__traceback__)]
    package = [f for f in frames if os.sep + "atgrpo_jax" + os.sep in f]
    assert package == [os.path.join(ROOT, "atgrpo_jax", "api.py")]  # only the API's own raise
    assert (out / "keep.txt").read_text() == "x"  # nothing lost
    with pytest.raises(ConfigError, match="rollout.k"):
        Trainer(os.path.join(ROOT, "configs", "sum_digits.py"), workdir=str(tmp_path / "r2"),
                overrides={"rollout.k": 0}).train()


def test_a_callback_that_raises_or_has_no_method_is_one_line():
    from atgrpo_jax.errors import UsageError
    from atgrpo_jax.train.hooks import StepInfo, run_hooks, user_hooks

    class Broken:
        def on_step_end(self, step, metrics):
            raise KeyError("loss_x")

    with pytest.raises(UsageError, match=r"^callback Broken.on_step_end raised KeyError at step 3: 'loss_x'$"):
        run_hooks(user_hooks([Broken()], 0), StepInfo(3, {}, False, False, True))
    with pytest.raises(UsageError, match=r"callbacks: .* has none of on_step_end, on_evaluate, on_save"):
        user_hooks([object()], 0)


def test_a_py_name_outside_its_process_says_how_to_pass_the_object():
    from atgrpo_jax.registry import registered

    with pytest.raises(ValueError, match=r"pass it by import path, --config.env.kwargs.reward_fn=mymod:score$"):
        registered("py:reward:mymod.score", "env.kwargs.reward_fn")
    with pytest.raises(ValueError, match=r"'reward' was defined in a script: move it into a module and pass "
                                         r"--config.env.kwargs.reward_fn=module:reward"):
        registered("py:reward:__main__.reward", "env.kwargs.reward_fn")
    with pytest.raises(ValueError, match=r"run through the same Python API \(this object has no import path\)"):
        registered("py:workflow:0123abcd4567", "env.workflow")
