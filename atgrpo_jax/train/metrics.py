"""Training metrics: a `metrics.jsonl`, TensorBoard event files, a console progress line.

`MetricsWriter.write(step, scalars)` appends one JSON line `{"step": step, ...}`
to `workdir/metrics.jsonl` and the same scalars to TensorBoard event files in
`workdir/tb/`, flushing both on every write (a killed run loses at most the
line being written; readers skip a torn last line).

Non-finite values: JSON has no NaN, so NaN, +-inf (and None) are written as
`null` in metrics.jsonl and are not written to TensorBoard at all (the curve
has no point at that step). Integers stay integers in the jsonl; TensorBoard
stores float32. A value that is not a number raises an error naming the key.

Reading the files, and cutting them back, is train/metrics_files.py.

Resuming (`resume_step=s`): the lines and events of steps > s (written by the
killed run after its last checkpoint) are dropped, so a resumed run's files
equal an uninterrupted run's: metrics.jsonl is rewritten without them, and so
is every event file that holds any (TensorFlow's record format, rewritten
with TensorBoard's own reader and record writer, each file replaced
atomically). Event files are otherwise append-only: the resumed run writes a
new file next to the old ones, and any TensorBoard reader (Python or Rust)
merges them. A TensorBoard server that was already showing the dropped points
keeps them until it restarts.

Only the TensorBoard package is used (no TensorFlow): events are built with
`tensorboard.plugins.scalar.summary_v2.scalar_pb` and written by
`tensorboard.summary.writer.event_file_writer.EventFileWriter`.

Object-store workdirs (`gs://bucket/run`; see `atgrpo_jax/workdir.py`): both files are
written exactly as above in a local staging directory, and the changed ones
are uploaded whole (an atomic object write) at most every `sync_every_s`
seconds, at `sync()` (the trainer calls it before each checkpoint, so the
store holds every row a resume keeps) and at `close()`. Resuming downloads
the files first, truncates them locally and uploads the rewritten ones.
TensorBoard's own writer is not pointed at the store: its fsspec layer
appends per record, and gcsfs turns an append into an overwrite.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Mapping, Sequence, TextIO

import numpy as np

from atgrpo_jax import workdir as wd
from atgrpo_jax.errors import LogWriteError
from atgrpo_jax.train.metrics_files import (_EVENTS_PREFIX, JSONL_FILES, METRICS_FILE, TB_DIR, truncate_events,
                                            truncate_metrics)

log = logging.getLogger(__name__)

WALL_CLOCK = ("rollout_s", "update_s", "tokens_per_s", "rollout_tokens_per_s", "time_s", "host_busy")
WALL_CLOCK_PREFIXES = ("pool_busy/",)


def is_wall_clock(key: str) -> bool:
    return key.startswith(WALL_CLOCK_PREFIXES) or key.rsplit("/", 1)[-1] in WALL_CLOCK


SYNC_EVERY_S = 30.0  # object stores: upload period (GCS allows ~1 write/s per object)


def _scalar(key: str, value: Any) -> int | float | None:
    """A Python number for one metric (None when missing or not finite); clear error otherwise."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    try:
        arr = np.asarray(value)
    except Exception as e:  # noqa: BLE001 - report which metric is bad
        raise TypeError(f"metric {key!r}: cannot convert {type(value).__name__} to a number: {e}") from None
    if arr.shape != ():
        raise ValueError(f"metric {key!r} must be a scalar, got shape {arr.shape}")
    if arr.dtype.kind in "biu":
        return int(arr)
    if arr.dtype.kind != "f" and not arr.dtype.name.startswith(("bfloat", "float")):
        raise TypeError(f"metric {key!r} must be a number, got {arr.dtype} value {value!r}")
    x = float(arr)
    return x if math.isfinite(x) else None


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _wait_for_a_later_file_name(tb_dir: str) -> None:
    """Sleep (< 1 s) until a new event file's name sorts after every existing one.

    TensorBoard reads a directory's event files in name order, and the name is
    `events.out.tfevents.<second>.<host>.<pid>.<counter>`: within one second
    the counter decides, and "10" sorts before "9". A resumed run's file read
    before the old one would look like steps going backwards.
    """
    if not os.path.isdir(tb_dir):
        return
    seconds = [int(n[len(_EVENTS_PREFIX):].split(".", 1)[0]) for n in os.listdir(tb_dir)
               if n.startswith(_EVENTS_PREFIX) and n[len(_EVENTS_PREFIX):].split(".", 1)[0].isdigit()]
    if seconds and time.time() < max(seconds) + 1:
        time.sleep(max(seconds) + 1 - time.time())


@contextlib.contextmanager
def _disk(what: str, where: str):
    """An OSError while writing `what` (disk full, read-only, ...) as one LogWriteError line."""
    try:
        yield
    except OSError as e:
        raise LogWriteError(f"cannot write {what} in {where}: {e.strerror or e}") from None


def _quiet_tensorboard_thread(args):
    """TensorBoard's writer thread re-raises its own I/O errors, which the next flush reports again (as
    one line: `_disk`); its traceback is left out. Other threads' exceptions go on as before."""
    if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
        return
    _previous_hook(args)


_previous_hook = threading.excepthook


class MetricsWriter:
    """Appends scalars to metrics.jsonl and TensorBoard; see the module docstring. A disk that fails
    (full, read-only) is one LogWriteError naming the file."""

    def __init__(self, workdir: str, *, enabled: bool = True, resume_step: int | None = None,
                 tensorboard: bool = True, jsonl: bool = True, extra: Sequence[Any] = (),
                 sync_every_s: float = SYNC_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.workdir = workdir = os.fspath(workdir)
        self.enabled = enabled
        self.path = wd.join(workdir, METRICS_FILE)
        self.tb_dir = wd.join(workdir, TB_DIR)
        self.sync_every_s = sync_every_s
        self._clock = clock
        self._file: TextIO | None = None
        self._events = None
        self._mirror: wd.Mirror | None = None
        self._open_now = enabled
        self.jsonl = jsonl
        self.extra = list(extra)  # other loggers (wandb_log.WandbLogger): scalars(), rows(), close()
        if not enabled:  # e.g. processes other than 0 in a multi-host run
            return
        local = workdir
        if wd.is_remote(workdir):
            wd.require_support(workdir)
            self._mirror = wd.Mirror(workdir)
            local = self._mirror.local
            for name in JSONL_FILES:
                self._mirror.pull(name)  # appended to, or truncated
            if resume_step is not None and tensorboard:
                self._mirror.pull_dir(TB_DIR, _EVENTS_PREFIX)  # only to be truncated
        else:
            os.makedirs(workdir, exist_ok=True)
        self._local = local
        self._local_path = os.path.join(local, METRICS_FILE)
        self._local_tb = os.path.join(local, TB_DIR)
        if resume_step is not None:
            dropped = sum(truncate_metrics(os.path.join(local, name), resume_step) for name in JSONL_FILES)
            dropped_events = truncate_events(self._local_tb, resume_step) if tensorboard else 0
            if dropped or dropped_events:
                log.info("run resumed at step %d: dropped %d jsonl lines and %d events written after it",
                         resume_step, dropped, dropped_events)
        self._file = self._open(METRICS_FILE) if jsonl else None
        self._extra: dict[str, TextIO] = {}  # other JSONL files, opened when first written
        if tensorboard:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            _wait_for_a_later_file_name(self._local_tb)
            threading.excepthook = _quiet_tensorboard_thread
            with _disk("TensorBoard's events", self.tb_dir):
                self._events = EventFileWriter(self._local_tb)
        self._last_sync = -math.inf
        self.sync()  # the store holds the truncated files (or an empty metrics.jsonl) from the start

    def _open(self, name: str) -> TextIO:
        path = os.path.join(self._local, name)
        f = open(path, "a", encoding="utf-8")
        if f.tell() and not _ends_with_newline(path):
            f.write("\n")  # end a torn line so it does not swallow the next one
        return f

    def write_rows(self, name: str, rows: Sequence[Mapping[str, Any]]):
        """Append JSON rows (each with a "step") to `name` (one of JSONL_FILES), flushed."""
        if not self.enabled or not rows:
            return
        if name not in JSONL_FILES or name == METRICS_FILE:
            raise ValueError(f"write_rows: {name!r} is not one of {JSONL_FILES[1:]}")
        for logger in self.extra:
            logger.rows(name, rows)
        if not self.jsonl:
            return
        with _disk(name, self.workdir):
            f = self._extra.get(name) or self._extra.setdefault(name, self._open(name))
            for row in rows:
                f.write(json.dumps(row, allow_nan=False, default=float) + "\n")
            f.flush()

    def write_text(self, step: int, tag: str, markdown: str):
        """A TensorBoard text summary (the Text tab renders markdown)."""
        if not self.enabled or self._events is None:
            return
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb

        event = event_pb2.Event(wall_time=time.time(), step=int(step))
        event.summary.value.extend(text_pb(tag, markdown).value)
        with _disk("the TensorBoard events", self.tb_dir):
            self._events.add_event(event)
            self._events.flush()

    def write(self, step: int, scalars: Mapping[str, Any]):
        """One jsonl line and one TensorBoard event for `step` (flushed before returning)."""
        if not self.enabled:
            return
        if not self._open_now:
            raise RuntimeError("MetricsWriter is closed")
        if "step" in scalars:
            raise ValueError("'step' is reserved: pass it as the step argument")
        values = {str(k): _scalar(str(k), v) for k, v in scalars.items()}
        step = int(step)
        if self._file is not None:
            with _disk(METRICS_FILE, self.workdir):
                self._file.write(json.dumps({"step": step, **values}, allow_nan=False) + "\n")
                self._file.flush()
        for logger in self.extra:
            logger.scalars(step, values)
        if self._events is not None:
            from tensorboard.compat.proto import event_pb2
            from tensorboard.plugins.scalar.summary_v2 import scalar_pb

            event = event_pb2.Event(wall_time=time.time(), step=step)
            for tag, v in values.items():
                if v is not None:
                    event.summary.value.extend(scalar_pb(tag, np.float32(v)).value)
            if event.summary.value:
                with _disk("the TensorBoard events", self.tb_dir):
                    self._events.add_event(event)
                    self._events.flush()
        if self._mirror is not None and self._clock() - self._last_sync >= self.sync_every_s:
            self.sync()

    def sync(self) -> list[str]:
        """Upload the changed files to an object-store workdir now (local workdirs: nothing to do).

        Returns the uploaded paths relative to the workdir.
        """
        if self._mirror is None or not self._open_now:
            return []
        for f in self._open_files():
            f.flush()
        self._last_sync = self._clock()
        return self._mirror.push()

    def _open_files(self) -> list:
        """metrics.jsonl, the extra jsonl files and TensorBoard's events, those open."""
        return [f for f in (self._file, *self._extra.values(), self._events) if f is not None]

    def close(self):
        """Close both files and, for an object-store workdir, upload them a last time."""
        if not self._open_now:  # disabled, or closed already
            return
        self._open_now = False
        with _disk("the metrics and TensorBoard files", self.workdir):
            try:
                for f in self._open_files():
                    f.close()
            finally:
                self._file, self._extra, self._events = None, {}, None
                for logger in self.extra:
                    logger.close()
        if self._mirror is not None:
            try:
                self._mirror.push()
            except Exception:
                log.error("upload to %s failed; the files are kept in %s", self.workdir, self._mirror.local)
                raise
            self._mirror.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
