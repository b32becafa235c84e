"""A run's metrics files as data: reading `metrics.jsonl` and the TensorBoard events (`read_metrics`,
`last_logged`, `read_tb_scalars`), and cutting both back to a step on resume (`truncate_metrics`,
`truncate_events`). Writing them is `train/metrics.py:MetricsWriter`; the module docstring there says
what a row holds and how a resume keeps the files equal to an uninterrupted run's."""
from __future__ import annotations

import json
import logging
import os

from atgrpo_jax import workdir as wd

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EPISODES_FILE = "episodes.jsonl"  # what the agents said (train/episodes.py)
JSONL_FILES = (METRICS_FILE, EPISODES_FILE)  # rows with a "step": truncated alike on resume
TB_DIR = "tb"
_EVENTS_PREFIX = "events.out.tfevents."
# Metrics measured by the wall clock (they differ between two runs of the same steps).


def _parse_lines(path: str) -> list[dict]:
    """The complete JSON lines of `path` (local or a URL); a torn (unparsable) line is skipped."""
    rows = []
    with (wd.as_epath(path).open("r") if wd.is_remote(path) else open(path, encoding="utf-8")) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: skipping a torn line (killed while writing?)", path, n)
                continue
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
    return rows


def read_metrics(workdir: str) -> list[dict]:
    """All rows of `workdir/metrics.jsonl` (or of a .jsonl path; local or a URL), in file order."""
    workdir = os.fspath(workdir)
    path = workdir if workdir.endswith(".jsonl") else wd.join(workdir, METRICS_FILE)
    return _parse_lines(path)


def last_logged(workdir: str) -> dict:
    """The newest value of every metric in `workdir/metrics.jsonl` (the last step's, and the last
    evaluation's), as the last step of a run returns them; {} without the file."""
    try:
        rows = read_metrics(workdir)
    except (OSError, ValueError):
        return {}
    out: dict = {}
    for row in rows:
        out.update({k: v for k, v in row.items() if v is not None})
    return out


def truncate_metrics(path: str, keep_up_to_step: int) -> int:
    """Rewrite `path` keeping only rows with step <= keep_up_to_step; returns rows dropped."""
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        total = sum(1 for line in f if line.strip())
    rows = [r for r in _parse_lines(path) if r["step"] <= keep_up_to_step]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: a kill here leaves the old file or the new one
    return total - len(rows)


def truncate_events(tb_dir: str, keep_up_to_step: int) -> int:
    """Rewrite the event files in `tb_dir` without events of steps > keep_up_to_step; returns events dropped."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    if not os.path.isdir(tb_dir):
        return 0
    dropped = 0
    for name in sorted(os.listdir(tb_dir)):
        path = os.path.join(tb_dir, name)
        if not name.startswith(_EVENTS_PREFIX) or not os.path.isfile(path):
            continue
        records = list(RawEventFileLoader(path).Load())  # a torn last record is left out
        keep = []
        for raw in records:
            event = event_pb2.Event.FromString(raw)
            late = event.step > keep_up_to_step and (event.HasField("summary") or event.HasField("session_log"))
            if not late:
                keep.append(raw)
        if len(keep) == len(records) and os.path.getsize(path) == sum(len(r) + 16 for r in records):
            continue  # nothing late, nothing torn
        dropped += len(records) - len(keep)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            writer = RecordWriter(f)
            for raw in keep:
                writer.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return dropped


def read_tb_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Scalars as TensorBoard's own event reader sees them: {tag: [(step, value), ...]}.

    `logdir` is a workdir (its `tb/` is read) or an event directory, local or
    a URL (read through TensorBoard's own fsspec layer, as `tensorboard
    --logdir gs://...` would).
    """
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    logdir = os.fspath(logdir)
    tb_dir = wd.join(logdir, TB_DIR) if wd.isdir(wd.join(logdir, TB_DIR)) else logdir
    acc = ea.EventAccumulator(tb_dir, size_guidance={ea.TENSORS: 0, ea.SCALARS: 0})
    acc.Reload()
    out: dict[str, list[tuple[int, float]]] = {}
    tags = acc.Tags()
    for tag in tags.get(ea.TENSORS, []):
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":  # text (the episodes), ...
            continue
        out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
    for tag in tags.get(ea.SCALARS, []):  # legacy simple_value summaries
        out.setdefault(tag, []).extend((e.step, float(e.value)) for e in acc.Scalars(tag))
    return out
