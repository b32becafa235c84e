"""The docs' examples, run as they stand: the README's ten lines with a reward function, and the "your own
task" guide's workflow module with its two commands."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


GUIDE = os.path.join(ROOT, "docs", "guides", "own-task.md")


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_readme_reward_function_example_trains_and_exports(tmp_path, monkeypatch):
    """The README's ten lines, pasted into a script, with the run cut to 2 steps."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    code = re.search(r"```python\n(.*?)```", section(readme, "## Your prompts and a reward function"), re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    import atgrpo_jax.api

    class Short(atgrpo_jax.api.Trainer):
        def __init__(self, config, **kw):
            super().__init__(os.path.join(ROOT, config), **kw, overrides={"train.steps": 2, "train.eval_every": 2})

    monkeypatch.setattr(atgrpo_jax.api, "Trainer", Short)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "runs" / "mine" / "hf" / "model.safetensors").exists()
    assert [json.loads(line)["step"] for line in (tmp_path / "runs" / "mine" / "metrics.jsonl").open()] == [0, 1, 2]


@pytest.mark.full  # tiers.py: ~40 s, two CLI runs; the README example above and test_api's docs episode stay in the
# default tier
def test_the_guide_s_workflow_example_trains_and_evaluates(tmp_path):
    text = section(open(GUIDE, encoding="utf-8").read(), "## A workflow module")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    commands = re.search(r"```bash\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    (tmp_path / "my_task.py").write_text(code)
    (tmp_path / "configs").symlink_to(os.path.join(ROOT, "configs"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("XLA_FLAGS", None)
    for line in [c for c in commands.splitlines() if c.strip()]:
        args = shlex.split(line.split("#")[0])
        assert args[0] == "PYTHONPATH=." and args[1] == "python"
        if args[3] == "atgrpo_jax.train":  # a short run: 2 steps
            args += ["--config.train.steps=2", "--config.train.eval_every=2", "--config.train.log_episodes_every=1"]
        proc = subprocess.run([sys.executable, *args[2:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "add"
    result = json.loads((run / "eval.json").read_text())
    assert result["k"] == 4 and result["splits"] == ["test"]
    episodes = [json.loads(line) for line in (run / "eval_episodes.jsonl").read_text().splitlines()]
    # every one of the 20 test problems exactly 4 times, each with both agents' turns
    assert sorted((e["task"], e["episode"]) for e in episodes) == [(t, k) for t in range(20) for k in range(4)]
    assert all([t["agent"] for t in e["log"]] == ["solver", "checker"] for e in episodes)
    assert result["eval/test/avg@4"] == sum(e["success"] for e in episodes) / 80
    logged = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 1, 2, 2]  # log_episodes_tasks = 2 tasks per step
    solver = logged[0]["log"][0]
    assert solver["agent"] == "solver" and len(solver["branches"]) == 8  # the demo's K
    assert "+" in solver["prompt"] and all("parsed_as" in b and "advantage" in b for b in solver["branches"])


def test_the_own_task_guide_s_python_example_runs_as_written_without_a_warning(tmp_path, monkeypatch, capfd):
    """The guide's first example (two reward functions, a dataset file each), cut to 2 steps: it trains,
    evaluates and exports, and says no warning on the way."""
    code = re.search(r"```python\n(.*?)```", section(open(GUIDE, encoding="utf-8").read(), "## From Python"),
                     re.S).group(1)
    assert '"train.steps": 100' in code
    code = code.replace('"train.steps": 100', '"train.steps": 2, "train.eval_every": 2')
    monkeypatch.chdir(tmp_path)
    for name, n in (("train.jsonl", 40), ("test.jsonl", 8)):
        with open(name, "w") as f:
            for i in range(n):
                f.write(json.dumps({"prompt": f"{i % 10}+{i // 10}", "answer": i % 10 + i // 10}) + "\n")
    os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")
    exec(compile(code, "own-task.md", "exec"), {})
    assert (tmp_path / "runs" / "mine" / "hf" / "model.safetensors").exists()
    last = [json.loads(line) for line in (tmp_path / "runs" / "mine" / "metrics.jsonl").open()][-1]
    assert {"reward_fn/exact/mean", "reward_fn/exact/std", "reward_fn/short/mean"} <= set(last)  # as TRL logs them
    said = capfd.readouterr()
    assert "warning" not in (said.out + said.err).lower(), said.err
