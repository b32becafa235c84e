"""What can be known before a run works is refused before it does, in one line, with the workdir as it
was: a schedule or freeze that trains nobody, a name in the workdir that is not what the run keeps
there, a disk without room for one checkpoint, a role's model keys named as the role's. In process but
for the disk (a small tmpfs of its own)."""
import re

import pytest

from atgrpo_jax.errors import CheckpointError, ConfigError, NotWritable
from atgrpo_jax.train.loop import run_training
from faults_util import in_tmpfs, snapshot, stderr_lines, train_args, ROOT
from tiny_config import tiny

AGENTS = ("planner", "executor")  # the tiny config's workflow


@pytest.mark.parametrize("changes, message", [
    ({"policy.frozen_agents": AGENTS},
     "config.policy.frozen_agents: every agent (planner, executor) is frozen, so the run would train nothing; "
     "leave at least one out"),
    ({"policy.phases": ("executor",), "policy.frozen_agents": ("executor",)},
     "config.policy.phases[0]: executor is in policy.frozen_agents, so its steps would train nothing; give it an "
     "agent that trains"),
    ({"policy.phases": ("planner", "executor+planner"), "policy.frozen_agents": ("planner",)},
     "config.policy.phases[0]: planner is in policy.frozen_agents, so its steps would train nothing; give it an "
     "agent that trains"),
])
def test_a_schedule_or_freeze_that_trains_nobody_is_refused_before_anything_is_written(tmp_path, changes, message):
    work = tmp_path / "run"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        run_training(tiny(**changes), str(work))
    assert not work.exists()


@pytest.mark.parametrize("name, make", [
    ("checkpoints", lambda p: p.write_text("")),
    ("metrics.jsonl", lambda p: p.mkdir()),
])
def test_a_workdir_entry_of_the_wrong_kind_is_refused_before_anything_is_written(tmp_path, name, make):
    work = tmp_path / "run"
    work.mkdir()
    make(work / name)
    before = snapshot(work)
    kind, should = ("file", "folder") if name == "checkpoints" else ("folder", "file")
    with pytest.raises(NotWritable, match=rf"^--workdir {work}: {name} is a {kind}, where the run keeps its "
                                          rf"{should} {name}; move it away, or give another --workdir$"):
        run_training(tiny(), str(work))
    assert snapshot(work) == before


@pytest.mark.parametrize("key, error", [("init_from", ConfigError), ("hf_path", CheckpointError)])
def test_a_role_s_model_keys_are_named_as_the_role_s(tmp_path, key, error):
    work = tmp_path / "run"
    c = tiny(**{"policy.sharing": "per_role", "policy.role_models": {"executor": {key: "/nonexist"}}})
    with pytest.raises(error, match=rf"^config\.policy\.role_models\.executor\.{key}(=|: )"):
        run_training(c, str(work))
    assert not work.exists()


@pytest.mark.full  # a subprocess in a tmpfs; the wrong-kind entries above keep the family in the default tier
def test_a_disk_without_room_for_one_checkpoint_is_refused_at_the_start(tmp_path):
    disk = tmp_path / "disk"
    train = " ".join(train_args(disk / "run"))
    proc = in_tmpfs(f"cd {ROOT} && {train}; echo rc=$?; ls -A {disk}", str(disk), "2m")
    assert proc.stdout.split()[-1:] == ["rc=2"], proc.stderr[-3000:]
    assert re.fullmatch(rf"error: --workdir {disk}/run: no room for a checkpoint \(No space left on device \(the "
                        r"checkpoint needs [\d.]+ MiB, [\d.]+ MiB free\)\); free some space or give another --workdir",
                        stderr_lines(proc)[-1]), proc.stderr[-3000:]
    assert "run" not in proc.stdout.split()  # the lock it took is gone with the folder it made
