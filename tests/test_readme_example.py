"""The README's "your own task" example, run as it stands: its workflow module and its two commands."""
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def section(readme: str) -> str:
    start = readme.index("## Your own task, without forking")
    return readme[start:readme.index("\n## ", start + 1)]


def test_the_readme_workflow_example_trains_and_evaluates(tmp_path):
    text = section(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
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
