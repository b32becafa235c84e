"""Object-store workdirs (gs://) without a network: an in-memory gs:// behind fsspec, reached by the
same code paths as a real bucket (etils.epath -> fsspec for our files, TensorBoard's fsspec layer for
its reader). The fake refuses appends, in-place updates and renames, as an object store would."""
import importlib
import importlib.util
import json
import os
import struct

import numpy as np
import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from atgrpo_jax.evaluate import write_eval_outputs
from atgrpo_jax import workdir as wd
from atgrpo_jax.train.metrics import MetricsWriter
from atgrpo_jax.train.metrics_files import read_metrics, read_tb_scalars
from tiny_config import tiny

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FSSPEC_REGISTRY = importlib.import_module("fsspec.registry")  # `fsspec.registry` is a read-only view


class FakeGCS(MemoryFileSystem):
    """gs:// in memory: whole-object writes only (like GCS); logs every object written."""

    protocol = ("gs", "gcs")
    store: dict = {}
    pseudo_dirs = [""]
    uploads: list = []

    @classmethod
    def _strip_protocol(cls, path):
        path = os.fspath(path)
        for prefix in ("gs://", "gcs://"):
            path = path.removeprefix(prefix)
        return path.strip("/")  # "bucket/key", as gcsfs names objects

    def _open(self, path, mode="rb", **kwargs):
        if "a" in mode or "+" in mode:
            raise NotImplementedError(f"object store: mode {mode!r} on {path}")
        if "w" in mode:
            FakeGCS.uploads.append(self._strip_protocol(path))
        return super()._open(path, mode, **kwargs)

    def mv(self, *args, **kwargs):
        raise NotImplementedError("object store: no atomic rename")


@pytest.fixture
def gcs(monkeypatch):
    FakeGCS.store.clear()
    FakeGCS.pseudo_dirs[:] = [""]
    FakeGCS.uploads.clear()
    for protocol in FakeGCS.protocol:
        monkeypatch.setitem(FSSPEC_REGISTRY._registry, protocol, FakeGCS)
    monkeypatch.setenv("EPATH_USE_TF", "false")  # epath takes fsspec even where TensorFlow is installed
    monkeypatch.setattr(wd, "_module_available", lambda name: False)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    yield FakeGCS
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    FakeGCS.store.clear()


def _rows(seed, steps):
    rng = np.random.default_rng(seed)
    return [(s, {"loss": float(rng.standard_normal()), "reward/agent0": np.float32(rng.random()),
                 "tokens": int(rng.integers(100, 1000)), "nan": float("nan") if s % 3 == 0 else 0.5})
            for s in steps]


def _write(workdir, rows, **kw):
    writer = MetricsWriter(workdir, **kw)
    for step, scalars in rows:
        writer.write(step, scalars)
    return writer


def _object(path):
    return FakeGCS.store[FakeGCS._strip_protocol(path)].getvalue()


def _event_objects(workdir):
    return sorted(k for k in FakeGCS.store if k.startswith(FakeGCS._strip_protocol(workdir) + "/tb/events."))


def test_paths_keep_urls_and_make_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert wd.absolute("gs://bucket/run") == "gs://bucket/run"
    assert wd.absolute("run") == str(tmp_path / "run")
    assert wd.join("gs://bucket/run", "checkpoints") == "gs://bucket/run/checkpoints"
    assert wd.dirname("gs://bucket/run/checkpoints") == "gs://bucket/run"
    run, ckpts = str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints")
    assert wd.locate_checkpoint("gs://bucket/run/checkpoints/40/") == ("gs://bucket/run", "gs://bucket/run/checkpoints", 40)
    assert wd.locate_checkpoint("gs://bucket/run") == ("gs://bucket/run", "gs://bucket/run/checkpoints", None)
    assert wd.locate_checkpoint("run/checkpoints/7") == (run, ckpts, 7)
    assert wd.locate_checkpoint("run") == (run, ckpts, None)
    with pytest.raises(ValueError, match=r"unsupported URL scheme memory://.*gs://"):
        MetricsWriter("memory://bucket/run")


def test_metrics_and_tensorboard_on_the_store_equal_a_local_run(gcs, tmp_path):
    rows = _rows(0, range(1, 7))
    _write(str(tmp_path), rows).close()
    writer = _write("gs://bucket/run", rows, sync_every_s=0.0)
    staging = writer._mirror.local
    writer.close()
    assert not os.path.exists(staging)  # the local staging copy is removed
    assert _object("gs://bucket/run/metrics.jsonl") == (tmp_path / "metrics.jsonl").read_bytes()
    assert read_metrics("gs://bucket/run") == read_metrics(str(tmp_path))
    # TensorBoard's own reader, given the gs:// URL, goes through its fsspec layer to the store.
    remote_tb = read_tb_scalars("gs://bucket/run")
    assert remote_tb == read_tb_scalars(str(tmp_path))
    assert [s for s, _ in remote_tb["nan"]] == [1, 2, 4, 5]
    (name,) = _event_objects("gs://bucket/run")
    local_copy = tmp_path / "copy" / os.path.basename(name)
    local_copy.parent.mkdir()
    local_copy.write_bytes(_object("gs://" + name))
    steps = [e.step for e in EventFileLoader(str(local_copy)).Load() if e.HasField("summary")]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_uploads_follow_the_sync_period_and_skip_unchanged_files(gcs):
    now = [0.0]
    writer = MetricsWriter("gs://bucket/run", sync_every_s=10.0, clock=lambda: now[0])
    stored = lambda: [r["step"] for r in read_metrics("gs://bucket/run")]  # noqa: E731
    assert stored() == []  # an empty metrics.jsonl and the event file header go up at once
    first = len(gcs.uploads)
    for step in (1, 2, 3):
        now[0] = step  # 1 s per step: within the period, nothing is uploaded
        writer.write(step, {"loss": 1.0 / step})
    assert stored() == [] and len(gcs.uploads) == first
    assert sorted(writer.sync()) == ["metrics.jsonl", "tb/" + _event_objects("gs://bucket/run")[0].rsplit("/", 1)[1]]
    assert stored() == [1, 2, 3]
    assert writer.sync() == []  # nothing changed: nothing uploaded
    now[0] = 13.0  # 10 s after the last upload
    writer.write(4, {"loss": 0.25})
    assert stored() == [1, 2, 3, 4]
    writer.write(5, {"loss": 0.2})
    assert stored() == [1, 2, 3, 4]
    writer.close()
    assert stored() == [1, 2, 3, 4, 5]
    assert [s for s, _ in read_tb_scalars("gs://bucket/run")["loss"]] == [1, 2, 3, 4, 5]


def test_resume_on_the_store_truncates_like_a_local_resume(gcs, tmp_path):
    full = str(tmp_path / "full")
    _write(full, _rows(0, range(1, 9))).close()
    # The killed run: checkpoint at step 4, then steps 5 and 6 (different values) reached the store,
    # then the process died (no close: its staging directory is lost with the machine).
    killed = _write("gs://bucket/run", _rows(0, range(1, 5)) + _rows(99, range(5, 7)), sync_every_s=0.0)
    (old_events,) = _event_objects("gs://bucket/run")
    assert [r["step"] for r in read_metrics("gs://bucket/run")] == [1, 2, 3, 4, 5, 6]
    # Restarted on another machine: a fresh staging directory, resumed from the step-4 checkpoint.
    resumed = _write("gs://bucket/run", _rows(0, range(1, 9))[4:], resume_step=4)
    resumed.close()
    killed._events.close()
    assert _object("gs://bucket/run/metrics.jsonl") == (tmp_path / "full" / "metrics.jsonl").read_bytes()
    assert len(_event_objects("gs://bucket/run")) == 2  # the resumed run adds an event file
    old_copy = tmp_path / os.path.basename(old_events)
    old_copy.write_bytes(_object("gs://" + old_events))
    assert [e.step for e in EventFileLoader(str(old_copy)).Load() if e.HasField("summary")] == [1, 2, 3, 4]
    got = read_tb_scalars("gs://bucket/run")
    assert got == read_tb_scalars(full)
    assert [s for s, _ in got["loss"]] == list(range(1, 9))


def test_restart_without_resume_appends_to_the_stored_metrics(gcs):
    _write("gs://bucket/run", [(1, {"a": 1.0})]).close()
    _write("gs://bucket/run", [(2, {"a": 2.0})], tensorboard=False).close()
    assert read_metrics("gs://bucket/run") == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]
    assert len(_event_objects("gs://bucket/run")) == 1


def test_disabled_writer_touches_nothing_on_the_store(gcs):
    writer = MetricsWriter("gs://bucket/run", enabled=False, resume_step=3)
    writer.write(1, {"loss": 1.0})
    assert writer.sync() == []
    writer.close()
    assert gcs.store == {} and gcs.uploads == []


def test_config_json_on_the_store(gcs, tmp_path, monkeypatch):
    from atgrpo_jax.train.config import base_config

    config = base_config()
    assert wd.checkpoint_dir("gs://bucket/run") == "gs://bucket/run/checkpoints"  # a URL stays a URL
    wd.write_config(config, "gs://bucket/run")
    stored = json.loads(_object("gs://bucket/run/config.json"))
    assert stored == json.loads(config.to_json_best_effort())
    assert stored["optim"]["lr"] == config.optim.lr
    assert wd.saved_config("gs://bucket/run") == stored
    config.optim.lr = 0.5
    wd.write_config(config, "gs://bucket/run", keep_as="config.step3.json")  # the run's former config is kept
    assert json.loads(_object("gs://bucket/run/config.step3.json")) == stored
    assert json.loads(_object("gs://bucket/run/config.json"))["optim"]["lr"] == 0.5
    monkeypatch.chdir(tmp_path)
    assert wd.checkpoint_dir("local_run") == str(tmp_path / "local_run" / "checkpoints")
    wd.write_config(config, "local_run")
    assert json.loads((tmp_path / "local_run" / "config.json").read_text())["optim"]["lr"] == 0.5


def test_evaluate_writes_eval_json_and_the_curve_to_the_store(gcs):
    with MetricsWriter("gs://bucket/run", tensorboard=False) as w:
        for step in range(1, 11):
            w.write(step, {"loss": 1.0 / step, **({"eval_success": step / 10} if step % 2 == 0 else {})})
    result = {"step": 10, "eval_success": 0.75, "avg@4_success": 0.75}
    written = write_eval_outputs(result, "gs://bucket/run", "gs://bucket/evals/step10", label="shared", title="t")
    assert written == ["gs://bucket/evals/step10/eval.json", "gs://bucket/evals/step10/learning_curve.png"]
    assert json.loads(_object(written[0])) == result
    png = _object(written[1])
    assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (640, 400)  # plot_learning_curves' default 6.4 x 4 in at 100 dpi
    assert write_eval_outputs(result, "gs://bucket/no_metrics", "gs://bucket/no_metrics", label="shared",
                         title="t") == ["gs://bucket/no_metrics/eval.json"]  # no metrics: no curve


def test_missing_object_store_packages_are_named_before_anything_runs(monkeypatch):
    from atgrpo_jax.train import setup
    from atgrpo_jax.train.loop import run_training
    from atgrpo_jax.train.checkpoint import Checkpointer
    from atgrpo_jax.train.config import base_config

    # This environment as a pod without gcsfs, google-cloud-storage or TensorFlow looks.
    monkeypatch.setattr(wd, "_module_available", lambda name: False)
    monkeypatch.delitem(FSSPEC_REGISTRY._registry, "gcs", raising=False)
    monkeypatch.setitem(FSSPEC_REGISTRY.known_implementations, "gcs",
                        {"class": "gcsfs_absent_in_this_test.GCSFileSystem", "err": "Please install gcsfs"})
    monkeypatch.setattr(setup, "build_run", lambda config: pytest.fail("compiled before checking the workdir"))
    missing = wd.missing_packages("gs://bucket/run", checkpoints=True)
    assert len(missing) == 2 and "gcsfs" in missing[0] and "google-cloud-storage" in missing[1]
    assert wd.missing_packages("/tmp/run", checkpoints=True) == []
    with pytest.raises(ImportError, match="pip install gcsfs google-cloud-storage"):
        MetricsWriter("gs://bucket/run")
    with pytest.raises(ImportError, match="google-cloud-storage"):
        Checkpointer("gs://bucket/run/checkpoints", keep_last=1)
    config = base_config()
    config.model.preset = "test-tiny"  # a config that is fine: the workdir is what is wrong
    with pytest.raises(ImportError, match="pip install gcsfs google-cloud-storage"):
        run_training(config, "gs://bucket/run")


def test_training_run_on_the_store_uploads_each_checkpointed_step_before_saving(gcs, monkeypatch):
    """run_training on gs:// end to end, resumed from step 1 of a killed run. orbax itself cannot
    reach the fake (its arrays go through tensorstore's own GCS client), so a recording stand-in
    takes its place; it checks what a resume needs: the store holds each step's row before its save."""
    from atgrpo_jax.train import checkpoint
    from atgrpo_jax.train.loop import run_training

    _write("gs://bucket/run", [(s, {"loss": 100.0 + s}) for s in (1, 2, 3)], tensorboard=False).close()
    saves, dirs = [], []

    class RecordingCheckpointer:
        def __init__(self, directory, **kwargs):
            dirs.append(directory)

        def latest_step(self):
            return 1

        def all_steps(self):
            return [1]

        def restore(self, step, *, target):
            return target, {"step": step}

        def save(self, step, state, *, meta, metrics, force=False, extra=None):
            saves.append((step, [(r["step"], r["loss"]) for r in read_metrics("gs://bucket/run")]))

        def wait(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(checkpoint, "Checkpointer", RecordingCheckpointer)
    monkeypatch.setattr(wd, "_module_available", lambda name: name == "google.cloud.storage")
    config = tiny()
    config.train.update(steps=3, eval_every=0, checkpoint_every=1)
    run_training(config, "gs://bucket/run")

    assert set(dirs) == {"gs://bucket/run/checkpoints"}  # a URL reaches orbax unchanged (restore, then saves)
    assert json.loads(_object("gs://bucket/run/config.json"))["train"]["steps"] == 3
    rows = read_metrics("gs://bucket/run")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["loss"] == 101.0  # the killed run's 2, 3 dropped
    assert all(r["loss"] < 100 for r in rows[1:])
    assert saves == [(2, [(r["step"], r["loss"]) for r in rows[:2]]), (3, [(r["step"], r["loss"]) for r in rows])]
    assert [s for s, _ in read_tb_scalars("gs://bucket/run")["loss"]] == [2, 3]


def test_a_store_workdir_has_one_writer_by_lease(gcs, monkeypatch):
    """A second run is refused while the first one's lease is renewed; a lease that ran out (a dead run)
    is taken over with a notice; a released lease is gone."""
    from atgrpo_jax.errors import WorkdirBusy
    from atgrpo_jax.train import lock as lock_module

    monkeypatch.setattr(lock_module, "SETTLE_S", 0.0)
    first = lock_module.WorkdirLock("gs://bucket/run").acquire()
    with pytest.raises(WorkdirBusy, match=r"gs://bucket/run is in use by another run: pid \d+ on .*lease was renewed"):
        lock_module.WorkdirLock("gs://bucket/run").acquire()
    first.release()
    assert FakeGCS._strip_protocol("gs://bucket/run/train.lock") not in FakeGCS.store
    stale = {"host": "gone", "pid": 1, "started": 0.0, "heartbeat": 0.0}
    wd.write_text("gs://bucket/run/train.lock", json.dumps(stale))
    second = lock_module.WorkdirLock("gs://bucket/run").acquire()
    assert second.notice.startswith("took over gs://bucket/run/train.lock from pid 1 on gone")
    second.release()
