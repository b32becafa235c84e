"""Checkpoints prove their integrity: each step's manifest (every file's size and content hash, written
last) is verified before any array is read, so a flipped byte anywhere, a truncated file in extra/ or a
folder renamed to another step is caught, named in one line, and the newest checkpoint that verifies is
used instead. In process, on a small state saved as a run saves it (the end-to-end resume through the
command is test_checkpoints_unreadable.py's)."""
import os
import re
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from atgrpo_jax import cli
from atgrpo_jax.train import manifest
from atgrpo_jax.train.checkpoint import CheckpointDamaged, Checkpointer
from atgrpo_jax.train.resume import restore_given, restore_newest_readable
from atgrpo_jax.train.stops import close_keeping, diverged_stop


def state_of(step):
    return {"policy": {"w": jnp.full((64, 64), float(step)), "b": jnp.arange(8, dtype=jnp.float32) * step}}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints 1 and 2 of a small state, each with its meta and an extra item (the weights of
    rollouts in flight, as a staleness run saves them)."""
    directory = tmp_path_factory.mktemp("saved") / "checkpoints"
    with Checkpointer(str(directory), keep_last=0, best_metric=None) as ckpt:
        for step in (1, 2):
            ckpt.save(step, state_of(step), meta={"step": step}, extra={"ahead": jnp.full((16,), float(step))})
    return directory


@pytest.fixture
def copy(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "checkpoints")


def files_of(step_dir):
    return sorted(os.path.relpath(os.path.join(root, f), step_dir) for root, _, names in os.walk(step_dir)
                  for f in names if os.path.relpath(os.path.join(root, f), step_dir) not in manifest.UNLISTED)


def flip(path, offset=None, count=1):
    size = os.path.getsize(path)
    offset = size // 2 if offset is None else offset
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))
    assert os.path.getsize(path) == size


def test_a_saved_step_lists_every_file_it_holds_and_verifies(saved):
    record = manifest.read(str(saved / "2"))
    assert record["step"] == 2
    assert set(record["files"]) == set(files_of(saved / "2"))
    assert any(f.startswith("extra/") for f in record["files"]) and any(f.startswith("meta/") for f in record["files"])
    Checkpointer(str(saved), keep_last=0, read_only=True).verify(2)


def test_a_flipped_byte_anywhere_is_caught_before_any_array_is_read(saved, tmp_path):
    """Every file of a checkpoint in turn: one byte inverted in its middle (its size unchanged)."""
    names = files_of(saved / "2")
    assert len(names) > 10
    for i, name in enumerate(names):
        work = shutil.copytree(saved / "2", tmp_path / str(i) / "2")
        flip(work / name)
        with pytest.raises(CheckpointDamaged, match=f"^{re.escape(name)} differs from its manifest"):
            manifest.verify(str(work), 2)


def test_64_flipped_bytes_in_a_state_file_fall_back_to_the_previous_checkpoint(copy):
    data = max((f for f in files_of(copy / "2") if f.startswith("state/")), key=lambda f: os.path.getsize(copy / "2" / f))
    flip(copy / "2" / data, count=64)
    lines = []
    step, state, meta, bad = restore_newest_readable(str(copy), state_of(0), lines.append)
    assert (step, bad, meta["step"]) == (1, [2], 1)
    np.testing.assert_array_equal(state["policy"]["w"], np.full((64, 64), 1.0))
    assert lines == [f"checkpoint 2 in {copy} does not restore ({data} differs from its manifest (content hash)); "
                     "trying checkpoint 1"]


@pytest.mark.full  # the flipped state file (above) keeps the damaged-checkpoint family in the default tier
def test_a_truncated_file_in_extra_is_caught_and_not_swallowed(copy):
    name = max((f for f in files_of(copy / "2") if f.startswith("extra/")), key=lambda f: os.path.getsize(copy / "2" / f))
    with open(copy / "2" / name, "r+b") as f:
        f.truncate(os.path.getsize(copy / "2" / name) // 2)
    reader = Checkpointer(str(copy), keep_last=0, read_only=True)
    with pytest.raises(CheckpointDamaged, match=rf"^{re.escape(name)} has \d+ bytes, its manifest says \d+$"):
        reader.restore_extra(2, {"ahead": jnp.zeros(16)})
    lines = []
    assert restore_newest_readable(str(copy), state_of(0), lines.append)[0] == 1
    assert re.fullmatch(rf"checkpoint 2 in .* does not restore \({re.escape(name)} has \d+ bytes.*; trying checkpoint 1",
                        lines[0])


def test_a_folder_renamed_to_another_step_is_refused_and_export_is_told(copy):
    os.replace(copy / "2", copy / "6")
    lines = []
    assert restore_newest_readable(str(copy), state_of(0), lines.append)[:2][0] == 1
    assert lines == [f"checkpoint 6 in {copy} does not restore (the folder 6 holds step 2 (its manifest.json says "
                     "so)); trying checkpoint 1"]
    reader = Checkpointer(str(copy), keep_last=0, read_only=True)
    with pytest.raises(cli.UsageError, match=r"^checkpoint 6 in .* does not restore \(the folder 6 holds step 2 .*\); "
                                             r"choose another with --step \(saved: 1\)$"):
        restore_given(reader, 6, state_of(0), "--step")  # export --step=6 and evaluate take this path


@pytest.mark.full  # the flipped state file (above) keeps the damaged-checkpoint family in the default tier
def test_a_step_folder_without_a_manifest_is_an_unfinished_save(copy):
    os.remove(copy / "2" / manifest.MANIFEST)
    with pytest.raises(CheckpointDamaged, match="^no manifest.json: its save did not finish$"):
        Checkpointer(str(copy), keep_last=0, read_only=True).restore(2)


def test_the_last_good_checkpoint_of_a_message_is_one_that_verifies(copy):
    flip(copy / "2" / files_of(copy / "2")[-1])
    ckpt = Checkpointer(str(copy), keep_last=0, best_metric=None)
    assert ckpt.latest_step() == 2 and ckpt.newest_verified() == 1
    stop = diverged_stop(ckpt, {"policy": 3}, 5, 3)
    assert "last good checkpoint: 1." in str(stop)
    assert close_keeping(Checkpointer(str(copy), keep_last=0, best_metric=None, read_only=True)) == 1
