"""A resumed run's history must be whole: metrics.jsonl holds every row up to the step it resumes
from, or the run says why not and stops (`--new_history`: it starts a new file instead, beside a note
saying where it begins and what became of the old one)."""
from __future__ import annotations

import json
import time

from atgrpo_jax import workdir as wd
from atgrpo_jax.errors import UsageError
from atgrpo_jax.train.metrics_files import METRICS_FILE

NOTE_FILE = "metrics.note.txt"


def history_problem(workdir: str, start: int, log_every: int) -> str | None:
    """What is wrong with `workdir`'s metrics.jsonl for a run resuming at step `start` that wrote a row
    every `log_every` steps (None: nothing): missing, unreadable, a line that is not a row (but a torn
    last one, a kill in the middle of a write), or no row of the last step it logged."""
    path = wd.join(workdir, METRICS_FILE)
    if not wd.exists(path):
        return f"{METRICS_FILE} is missing"
    try:
        lines = [line for line in wd.as_epath(path).read_bytes().decode("utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        return f"{METRICS_FILE} cannot be read ({e})"
    steps = set()
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            steps.add(int(row["step"]))
        except (ValueError, KeyError, TypeError):
            if n < len(lines):
                return f"{METRICS_FILE}:{n} is not a metrics row"
    logged = start - start % max(log_every, 1)
    if logged and logged not in steps:
        return f"{METRICS_FILE} has no row of step {logged}"
    return None


def check_history(workdir: str, start: int, log_every: int, new_history: bool) -> str:
    """UsageError when a run resuming at `start` would continue a history that is not whole, unless
    `new_history`: then the old file is moved aside (if there is one) and a note written; returns the
    line to print about it ("" when the history is whole)."""
    problem = history_problem(workdir, start, log_every)
    if problem is None:
        return ""
    if not new_history:
        raise UsageError(f"--workdir {workdir}: {problem}, though the run resumes at step {start}: its rows "
                         "up to there would be lost. Put the file back, or pass "
                         f"--new_history to start a new {METRICS_FILE} from step {start + 1} (a note beside it "
                         "says so)")
    path, kept = wd.join(workdir, METRICS_FILE), ""
    if wd.exists(path):
        kept = f"{METRICS_FILE}.damaged-{int(time.time())}"
        wd.as_epath(path).rename(wd.join(workdir, kept))
    note = (f"{METRICS_FILE} begins at step {start + 1}: when the run resumed at step {start}, {problem}"
            + (f" (kept as {kept})" if kept else "") + ".\n")
    previous = wd.as_epath(wd.join(workdir, NOTE_FILE)).read_text() if wd.exists(wd.join(workdir, NOTE_FILE)) else ""
    wd.write_text(wd.join(workdir, NOTE_FILE), previous + note)
    return f"note: {note.strip()} ({NOTE_FILE})"
