"""A full disk and places that cannot be written: one line naming the path and the cause, before any
work where it can be known before (a read-only workdir or --out), and earlier checkpoints kept."""
import json
import os
import re
import shlex
import subprocess
import sys
import types

import pytest
from faults_util import ROOT, assert_no_traceback, in_tmpfs, run, stderr_lines, train_args


@pytest.mark.full  # tiers.py: 20 s of runs; the disk filled between saves (below) keeps the family in the default tier
def test_a_full_disk_stops_the_run_at_the_save_that_does_not_fit(tmp_path):
    """First the disk fills during a save (the free-space check bypassed: another writer took the
    space after it), then the same command finds, before it trains, that the disk is still full."""
    disk = tmp_path / "disk"
    args = train_args(disk / "run", steps=5)
    unchecked = " ".join(map(shlex.quote, [args[0], os.path.join(os.path.dirname(__file__), "unchecked_train.py"),
                                           *args[3:]]))
    train = " ".join(map(shlex.quote, args))
    # 10 MiB: config, metrics and two 4.4 MiB checkpoints fit, the third does not
    proc = in_tmpfs(f"cd {ROOT} && {unchecked}; echo rc=$?; echo ---; {train}; echo rc=$?; "
                    f"ls {disk}/run/checkpoints; echo ---; cat {disk}/run/metrics.jsonl", str(disk), "10m")
    out = proc.stdout.split("---\n")
    assert "rc=1" in out[0] and "rc=2" in out[1], proc.stderr[-3000:]
    assert_no_traceback(proc)
    lines = stderr_lines(proc)
    assert len(lines) == 2, proc.stderr[-3000:]  # no orbax noise from the save that failed midway
    assert lines[0] == (f"error: cannot save checkpoint 3 to {disk}/run/checkpoints: No space left on device; "
                        "the run stopped (earlier checkpoints are kept)")
    assert re.fullmatch(rf"error: --workdir {disk}/run: no room for a checkpoint \(No space left on device "
                        r"\(the checkpoint needs [\d.]+ MiB, [\d.]+ MiB free\)\); free some space or give another "
                        r"--workdir", lines[1])
    assert "resuming" not in out[1]  # refused before the restore, so before any step
    left = out[1].split("rc=2\n")[1].split()  # 1 and 2 kept; the partial save left for a start with room to delete
    assert left[:2] == ["1", "2"] and all(".orbax-checkpoint-tmp" in n for n in left[2:]), left
    # the first run's rows as it left them (its save of 3 failed in the background, found at step 4's): the
    # refused start changed nothing; a resume cuts the rows after its checkpoint
    assert [json.loads(line)["step"] for line in out[2].splitlines()] == [1, 2, 3, 4]


def test_a_disk_filled_between_saves_stops_the_run_with_one_line_and_it_resumes(tmp_path):
    """Another writer fills the disk while the run goes on: whichever of its files is written next (a
    metrics row, TensorBoard's events, the checkpoint) fails as one line, and the run resumes once there
    is room again."""
    disk = tmp_path / "disk"
    train = " ".join(map(shlex.quote, train_args(disk / "run", "--config.train.log_episodes_every=1",
                                                 "--config.train.keep_last=1", steps=6)))
    logs = tmp_path  # (off the full disk)
    script = (f"cd {ROOT} && ({train} > {logs}/out.txt 2> {logs}/err.txt; echo $? > {logs}/rc) & "
              f"until [ -s {disk}/run/metrics.jsonl ] && [ $(wc -l < {disk}/run/metrics.jsonl) -ge 2 ]; do sleep 0.2; "
              f"done; dd if=/dev/zero of={disk}/fill bs=64k 2>/dev/null; wait; echo rc=$(cat {logs}/rc); "
              f"cat {logs}/err.txt; echo ---; rm {disk}/fill; {train}; echo rc=$?")
    proc = in_tmpfs(script, str(disk), "20m")
    first, second = proc.stdout.split("---\n")
    assert "rc=1" in first, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in first and "Exception in thread" not in first, first[-3000:]
    lines = [line for line in first.splitlines()[1:] if line.strip() and "PyTorch was not found" not in line]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "the run stopped" in lines[0], lines
    assert second.strip().endswith("rc=0"), second[-3000:]
    assert re.search(r"resuming at step \d", second)


@pytest.mark.full  # a subprocess in a tmpfs; the disk filled between saves (above) keeps the family in the default tier
@pytest.mark.parametrize("checkpointing", [0, 1])
def test_a_disk_full_at_the_start_is_one_line(tmp_path, checkpointing):
    """8 KB: the lock, config.json or TensorBoard's first events do not fit (or, checkpointing, one
    checkpoint does not): one line, no traceback of the writer that failed."""
    disk = tmp_path / "disk"
    train = " ".join(map(shlex.quote, train_args(disk / "run", f"--config.train.checkpoint_every={checkpointing}",
                                                 steps=1)))
    proc = in_tmpfs(f"cd {ROOT} && {train}; echo rc=$?", str(disk), "8k")
    assert proc.stdout.split()[-1] == "rc=2", proc.stderr[-3000:]
    assert_no_traceback(proc)
    [line] = stderr_lines(proc)
    assert re.fullmatch(rf"error: --workdir {disk}/run: (cannot start its outputs|no room for a checkpoint|cannot write "
                        r"its lock train.lock|cannot write in \S+) \(No space left on device.*", line), line


def read_only(tmp_path, command: str):
    """Run `command` with tmp_path/ro a read-only filesystem holding an empty folder `run`."""
    ro = tmp_path / "ro"
    return in_tmpfs(f"mkdir {ro}/run && mount -o remount,ro {ro} && cd {ROOT} && {command}", str(ro), "1m")


def test_a_read_only_workdir_fails_before_anything_runs(tmp_path):
    proc = read_only(tmp_path, " ".join(map(shlex.quote, train_args(tmp_path / "ro" / "run"))))
    assert proc.returncode == 2
    assert stderr_lines(proc) == [f"error: --workdir {tmp_path}/ro/run: cannot write in {tmp_path}/ro/run "
                                  "(Read-only file system)"]


def test_evaluate_and_export_check_out_before_the_work(finished_run, tmp_path):
    ro = tmp_path / "ro"
    evaluate = f"{sys.executable} -m atgrpo_jax.evaluate --checkpoint={finished_run} --out={ro}/run/eval"
    export = f"{sys.executable} -m atgrpo_jax.export --checkpoint={finished_run} --out={ro}/run/hf"
    proc = read_only(tmp_path, f"{evaluate}; echo rc=$?; {export}; echo rc=$?")
    assert proc.stdout.split() == ["rc=2", "rc=2"], proc.stderr[-3000:]
    assert stderr_lines(proc) == [f"error: --out {ro}/run/eval: cannot write in {ro}/run (Read-only file system)",
                                  f"error: --out {ro}/run/hf: cannot write in {ro}/run (Read-only file system)"]
    assert not os.path.exists(finished_run / "eval.json")


def test_a_workdir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    proc = run(train_args(tmp_path / "file" / "run"))
    assert proc.returncode == 2
    assert stderr_lines(proc) == [f"error: --workdir {tmp_path}/file/run: {tmp_path}/file is a file, not a directory"]


def test_only_closed_loop_callbacks_from_native_threads_are_dropped(capsys):
    """What a failed save leaves (tensorstore calling into orbax's closed event loop) is dropped;
    the same error raised by Python code is still printed."""
    import asyncio

    from atgrpo_jax.train.orbax_quiet import quiet_orbax_leftovers

    quiet_orbax_leftovers()
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as e:
        error = e
    sys.excepthook(RuntimeError, error, error.__traceback__.tb_next)  # as a native thread's call reports it
    assert capsys.readouterr().err == ""
    sys.excepthook(RuntimeError, error, error.__traceback__)  # called from Python: a real error
    assert "Event loop is closed" in capsys.readouterr().err
    # the same late call reported as unraisable (sys.unraisablehook) is a leftover too; others are not
    from atgrpo_jax.train.orbax_quiet import orbax_leftover
    late = types.SimpleNamespace(exc_value=error, exc_traceback=error.__traceback__.tb_next, object=print)
    assert orbax_leftover(late)
    assert not orbax_leftover(types.SimpleNamespace(exc_value=error, exc_traceback=error.__traceback__, object=print))
    assert not orbax_leftover(types.SimpleNamespace(exc_value=ValueError("x"), exc_traceback=None, object=print))


def test_only_orbax_coroutines_never_awaited_are_dropped(tmp_path):
    """A failed save or restore can leave any of orbax's coroutines unawaited (its metadata reads,
    its fragment writes), reported as a RuntimeWarning at collection, often at interpreter exit:
    each of orbax's is dropped, a coroutine of any other code is still reported."""
    script = tmp_path / "leftovers.py"
    script.write_text(
        "import gc, os\n"
        "from atgrpo_jax.train.orbax_quiet import quiet_orbax_leftovers\n"
        "quiet_orbax_leftovers()\n"
        "ns = {}\n"
        "source = 'async def write_fragment():\\n    pass\\nasync def _get_array_metadatas():\\n    pass\\n'\n"
        "exec(compile(source, os.path.join(os.sep, 'site', 'orbax', 'checkpoint', 'x.py'), 'exec'), ns)\n"
        "async def users_own():\n    pass\n"
        "async def users_last():\n    pass\n"
        "c = ns['write_fragment'](); del c; gc.collect()\n"
        "c = users_own(); del c; gc.collect()\n"
        "left_at_exit = ns['_get_array_metadatas'](), users_last()\n")
    proc = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "coroutine 'users_own' was never awaited" in proc.stderr
    assert "coroutine 'users_last' was never awaited" in proc.stderr  # at exit, too
    assert "write_fragment" not in proc.stderr and "_get_array_metadatas" not in proc.stderr
