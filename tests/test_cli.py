"""The commands' command lines: bad input is one line naming what is wrong, exit status 2, nothing written."""
import json
import os
import subprocess
import sys

import pytest

from atgrpo_jax import cli
from atgrpo_jax.train.config import base_config
from command_util import exit_and_stderr

ROOT = os.path.join(os.path.dirname(__file__), "..")
DEMO = os.path.join(ROOT, "configs", "demo.py")


def run(*args, timeout=180):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # one CPU device is enough to fail fast
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    """The first case through the command (its flags, its exit status); the others through the same main
    under the same one-line handler, in this process (no second start of python and jax for each)."""
    from atgrpo_jax.train.__main__ import main

    workdir = tmp_path / "run"
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    proc = run("atgrpo_jax.train", f"--config={DEMO}", f"--workdir={workdir}", "--config.rollout.kk=3")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1] == "error: --config.rollout.kk: no such key (did you mean 'rollout.k'?)", \
        proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    cases = [
        ([f"--config={DEMO}", f"--workdir={a_file}"], f"--workdir {a_file} is a file, not a directory"),
        ([f"--config={os.path.join(ROOT, 'configs', 'math_qwen3_8b.py')}", f"--workdir={workdir}"],
         "config.model.hf_path: preset 'qwen3-8b'"),
        ([f"--config={DEMO}", f"--workdir={workdir}", "--config.env.kwargs.bogus=1"],
         "unexpected keyword argument 'bogus'"),
        ([f"--config={DEMO}", f"--workdir={workdir}", "--config.rollout.k=two"], "--config.rollout.k=two: not a number"),
        ([f"--config={DEMO}", f"--workdir={workdir}", "--config.char_alphabet=0123456789+=\nuseraitx"],
         "config.char_alphabet: has no 'n', which the chat template writes (the roles 'user' and 'assistant', "
         "newlines): add them to char_alphabet"),
        ([f"--config={DEMO}", f"--workdir={workdir}", "--config.char_alphabet=0123456789+=\nuseraitn0+"],
         "config.char_alphabet: '+0' appear more than once; each character once"),
        ([f"--config={DEMO}", f"--workdir={workdir}", "--config.sft.steps=60"],
         "--config.sft.steps: `train` does not read it; sft.* are the supervised command's keys"),
    ]
    for args, message in cases:
        code, lines = exit_and_stderr(main, args, capsys)
        assert code == 2 and lines[-1].startswith("error: ") and message in lines[-1], lines
    assert not workdir.exists()


def test_plan_help_exits_0():
    proc = run("atgrpo_jax.plan", "--help")
    assert proc.returncode == 0 and "--device" in proc.stdout and "--config" in proc.stdout


def test_overrides_are_typed_and_env_kwargs_take_any_key():
    c = base_config()
    c.lock()
    cli.apply_overrides(c, [("rollout.k", "4"), ("optim.lr", "3e-4"), ("model.remat", "true"),
                            ("rollout.prompt_buckets", "(128, 256)"), ("env.kwargs.test_set", "aime25"),
                            ("env.kwargs.max_turns", "3"), ("train.time_budget_s", "60")])
    assert (c.rollout.k, c.optim.lr, c.model.remat) == (4, 3e-4, True)
    assert c.rollout.prompt_buckets == (128, 256) and isinstance(c.rollout.prompt_buckets, tuple)
    assert c.env.kwargs.test_set == "aime25" and c.env.kwargs.max_turns == 3 and c.train.time_budget_s == 60.0
    for key, value, message in [("optim.lrr", "1", "did you mean 'optim.lr'"), ("rollout.k", "2.5", "integer"),
                                ("model.remat", "maybe", "not a bool"), ("rollout", "1", "is a section")]:
        with pytest.raises(cli.UsageError, match=message):
            cli.apply_overrides(c, [(key, value)])
    assert cli.pop_overrides(["prog", "--config.a.b=1", "--workdir=x", "--config.c", "2"]) == \
        ([("a.b", "1"), ("c", "2")], ["prog", "--workdir=x"])


def test_saved_configs_of_earlier_versions_load():
    """A config.json written before `regime` was split into three settings (here: per_role)."""
    from atgrpo_jax.train.config import from_saved
    from atgrpo_jax.train.validate import resolve

    saved = json.load(open(os.path.join(os.path.dirname(__file__), "train", "data", "config_before_issue15.json")))
    assert saved["regime"] == "per_role" and "policy_pools" in saved and "use_std" in saved["algo"]
    c = resolve(from_saved(saved))
    assert (c.policy.sharing, c.policy.pools, c.rollout.tree, c.env.single_agent) == ("per_role", False, True, False)
    assert c.algo.advantage == "grpo" and c.rollout.k == saved["rollout"]["k"]
    for regime, want in [("plain_grpo", ("shared", False, False)), ("single_agent", ("shared", True, True)),
                         ("lora", ("lora", True, False))]:
        c = resolve(from_saved(dict(saved, regime=regime, algo=dict(saved["algo"], use_std=False))))
        assert (c.policy.sharing, c.rollout.tree, c.env.single_agent) == want and c.algo.advantage == "drgrpo"


def test_configs_are_installed_with_the_package_and_found_without_a_checkout(tmp_path, monkeypatch):
    """setup.py installs configs/ as atgrpo_jax.configs; --config=configs/demo.py then works from any
    directory. The install's package mapping is imitated with a finder (this checkout is not installed)."""
    import importlib.abc
    import importlib.machinery
    import re

    setup = open(os.path.join(ROOT, "setup.py")).read()
    assert '"atgrpo_jax.configs": "configs"' in setup and re.search(r'PACKAGES = \[[^]]*"atgrpo_jax.configs"', setup)
    folder = os.path.abspath(os.path.join(ROOT, "configs"))

    class Installed(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "atgrpo_jax.configs":
                spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
                spec.submodule_search_locations = [folder]
                return spec
            return None

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "atgrpo_jax.configs":
                raise ModuleNotFoundError(name)
            return None

    monkeypatch.chdir(tmp_path)  # no configs/ here
    monkeypatch.delitem(sys.modules, "atgrpo_jax.configs", raising=False)
    meta_path = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", [NotInstalled(), *meta_path])
    with pytest.raises(cli.UsageError, match="no such file"):
        cli.load_config("configs/demo.py")
    monkeypatch.setattr(sys, "meta_path", [Installed(), *meta_path])
    assert cli.packaged_config("configs/demo.py") == os.path.join(folder, "demo.py")
    assert cli.load_config("configs/demo.py").model.preset == cli.load_config(DEMO).model.preset
    with pytest.raises(cli.UsageError, match="no such file"):
        cli.load_config("configs/nope.py")
