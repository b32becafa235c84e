"""`prompt_reward`: a dataset of prompts and a reward function (envs/prompt_reward.py)."""
import json
import os
import re

import numpy as np
import pytest

from atgrpo_jax.envs.prompt_reward import PromptReward, RewardError
from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.envs.workflow import take_branch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def data(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": a + b} for a, b in ((1, 2), (3, 4), (5, 0))]
    for name in ("train", "test"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dict(train_path=str(tmp_path / "train.jsonl"), test_path=str(tmp_path / "test.jsonl"))


def test_one_turn_scores_every_response_and_ends(data):
    wf = make_workflow("prompt_reward", reward_fn="prompt_reward_fns:exact", system_prompt="Add.", **data)
    assert [a.name for a in wf.agents] == ["assistant"] and wf.splits == {"test": 3}
    state = wf.reset([0, 1], "test")
    assert wf.prompts(state, 0, 0)[1] == [{"role": "system", "content": "Add."}, {"role": "user", "content": "3+4="}]
    out = wf.step(state, 0, 0, [["3", "4"], ["7 ", "x"]])
    assert out.local_reward.tolist() == [[1, 0], [1, 0]] and wf.success(out.state).tolist() == [[True, False], [True, False]]
    assert wf.done(out.state).all() and out.parsed_as[0, 1] == "score 0"


def test_more_turns_show_the_answer_and_the_feedback(data):
    wf = make_workflow("prompt_reward", reward_fn="prompt_reward_fns:with_feedback", max_turns=2, **data)
    state = wf.reset([2], "train")
    out = wf.step(state, 0, 0, [["4", "5"]])
    assert wf.done(out.state).tolist() == [[False, True]]  # the right answer ends the episode at once
    state = take_branch(out.state, np.array([0]))
    assert wf.prompts(state, 0, 1)[0] == [{"role": "user", "content": "5+0="}, {"role": "assistant", "content": "4"},
                                          {"role": "user", "content": "no, not 4"}]
    out = wf.step(state, 0, 1, [["6", "7"]])
    assert wf.done(out.state).all() and not wf.success(out.state).any()  # the last turn ends it either way


@pytest.mark.parametrize("fn, message", [
    ("raises", r"reward_fn='prompt_reward_fns:raises' raised ZeroDivisionError: division by zero"),
    ("too_few", r"returned 1 scores for 2 responses"),
    ("not_numbers", r"returned 'high' \(str\) for response 0: a score must be a number"),
    ("number_strings", r"returned '1' \(str\) for response 0: a score must be a number"),
    ("one_string", r"must return a list of numbers .* got str: '11'"),
    ("nan", r"returned nan for response 0: not a finite float32 number"),
    ("too_large", r"returned 1e\+39 for response 0: not a finite float32 number"),
    ("wrong_feedback", r"returned 3 feedback strings for 2 responses"),
    ("exits", r"raised SystemExit: 3"),
    ("interrupted", r"raised KeyboardInterrupt: \(no message\)"),
])
def test_a_failing_reward_function_is_one_named_line(data, fn, message):
    wf = make_workflow("prompt_reward", reward_fn=f"prompt_reward_fns:{fn}", **data)
    with pytest.raises(RewardError, match=message) as e:
        wf.step(wf.reset([0], "train"), 0, 0, [["3", "4"]])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(reward_fn=""), r"env.kwargs.reward_fn: prompt_reward needs it"),
    (dict(reward_fn="no_such_module:f"), r"env.kwargs.reward_fn='no_such_module:f': cannot import"),
    (dict(reward_fn="prompt_reward_fns"), r"give it as 'package.module:function'"),
    (dict(reward_fn="prompt_reward_fns:exact", fields={"prompt": "question"}), r"record 1 has no field 'question'"),
    (dict(reward_fn="prompt_reward_fns:exact", test_path="/nonexistent.jsonl"), r"env.kwargs.test_path: .* not exist"),
])
def test_bad_kwargs_name_the_key(data, kwargs, message):
    """(and the data readers' errors come through, named by the key)"""
    with pytest.raises(ValueError, match=message):
        make_workflow("prompt_reward", **{**data, **kwargs})


def test_the_readme_two_role_example(data, tmp_path, monkeypatch):
    readme = open(os.path.join(ROOT, "docs", "guides", "own-task.md"), encoding="utf-8").read()
    start = readme.index("## A reward function is enough")
    end = readme.find("\n## ", start + 1)
    code = re.findall(r"```python\n(.*?)```", readme[start:end if end > 0 else None], re.S)[-1]
    (tmp_path / "checked.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    wf = make_workflow("checked:make_workflow", reward_fn="prompt_reward_fns:exact", **data)
    assert isinstance(wf, PromptReward) and [a.name for a in wf.agents] == ["solver", "checker"]
    state = wf.reset([1], "test")
    out = wf.step(state, 0, 0, [["8", "7"]])
    assert not wf.done(out.state).any() and out.local_reward.tolist() == [[0, 1]]  # the solver does not end a turn
    state = take_branch(out.state, np.array([1]))
    assert "7" in wf.prompts(state, 1, 0)[0][-1]["content"]  # the checker sees the solver's answer
    out = wf.step(state, 1, 0, [["7", "6"]])
    assert wf.done(out.state).all() and wf.success(out.state).tolist() == [[True, False]]
    assert [a.name for a in make_workflow("checked:make_workflow", single_agent=True,
                                          reward_fn="prompt_reward_fns:exact", **data).agents] == ["solver"]


def test_the_readme_user_config_resolves(tmp_path):
    import importlib.util

    from atgrpo_jax.train.validate import resolve

    readme = open(os.path.join(ROOT, "docs", "guides", "own-task.md"), encoding="utf-8").read()
    start = readme.index("## A reward function is enough")
    [code] = [c for c in re.findall(r"```python\n(.*?)```", readme[start:], re.S) if c.startswith("# my_config.py")]
    (tmp_path / "my_config.py").write_text(code)
    spec = importlib.util.spec_from_file_location("my_config", tmp_path / "my_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = resolve(module.get_config())
    assert c.env.workflow == "prompt_reward" and c.rollout.tree is False and c.model.hf_path == "Qwen/Qwen3-0.6B"


def test_a_parquet_source_with_mapped_fields(data, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["2+2=", "1+0="], "answer": [4, 1]}), str(tmp_path / "t.parquet"))
    wf = make_workflow("prompt_reward", reward_fn="prompt_reward_fns:exact", train_path=str(tmp_path / "t.parquet"),
                       test_path=str(tmp_path / "t.parquet"), fields={"prompt": "question"})
    state = wf.reset([1], "train")
    assert wf.prompts(state, 0, 0) == [[{"role": "user", "content": "1+0="}]]
    assert wf.success(wf.step(state, 0, 0, [["1", "0"]]).state).tolist() == [[True, False]]


def test_a_validation_split_chooses_the_checkpoint(data, tmp_path):
    import types

    from atgrpo_jax.train.heldout import evaluation_splits

    (tmp_path / "valid.jsonl").write_text(json.dumps({"prompt": "2+2=", "answer": 4}) + "\n")
    wf = make_workflow("prompt_reward", reward_fn="prompt_reward_fns:exact", valid_path=str(tmp_path / "valid.jsonl"),
                       **data)
    assert wf.splits == {"test": 3, "valid": 1} and wf.test_splits == ("test",)
    assert wf.prompts(wf.reset([0], "valid"), 0, 0) == [[{"role": "user", "content": "2+2="}]]
    assert evaluation_splits(types.SimpleNamespace(workflow=wf)) == ["valid", "test"]  # valid picks the best step
    with pytest.raises(ValueError, match="split 'valid' has 1 records"):
        wf.reset([1], "valid")
    assert "valid" not in make_workflow("prompt_reward", reward_fn="prompt_reward_fns:exact", **data).splits


@pytest.mark.parametrize("fn", ["trl_style", "trl_kwargs"])
def test_a_trl_reward_function_runs_as_written(data, fn):
    """TRL's signature: prompts, completions, dataset columns by name, **kwargs."""
    wf = make_workflow("prompt_reward", reward_fn=f"prompt_reward_fns:{fn}", **data)
    out = wf.step(wf.reset([0, 1], "train"), 0, 0, [["3", "4"], ["7", "x"]])
    assert out.local_reward.tolist() == [[1, 0], [1, 0]]


def test_an_unknown_argument_is_one_line_naming_what_may_be_asked(data):
    wf = make_workflow("prompt_reward", reward_fn="prompt_reward_fns:asks_unknown", **data)
    with pytest.raises(RewardError) as e:
        wf.step(wf.reset([0], "train"), 0, 0, [["3"]])
    assert str(e.value) == ("env.kwargs.reward_fn='prompt_reward_fns:asks_unknown' asks for 'solution', which no call "
                            "passes; a reward function may ask for answer, completions, history, prompt, prompts, "
                            "records, role, turn (and **kwargs for all of them)")


def test_weights_that_cannot_reach_success_are_said(data, capsys):
    make_workflow("prompt_reward", reward_fn=["prompt_reward_fns:exact"] * 2, reward_weights=[0.3, 0.3], **data)
    assert capsys.readouterr().err == (
        "warning: env.kwargs.reward_weights sum to 0.6, below env.kwargs.success_at=1: a response succeeds only when "
        "its functions score above 1 (set success_at to what a right answer earns)\n")
    make_workflow("prompt_reward", reward_fn=["prompt_reward_fns:exact"] * 2, reward_weights=[0.3, 0.3],
                  success_at=0.6, **data)
    assert capsys.readouterr().err == ""
