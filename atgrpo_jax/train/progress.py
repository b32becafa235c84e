"""One console line of progress: step, a few metrics, elapsed time and ETA."""
from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Mapping, Sequence, TextIO


STARTED = time.monotonic()  # (this module is imported as a command starts)


def say(text: str, enabled: bool = True) -> None:
    """A line of what the command is doing, with the seconds since it started: the first minute of a
    run (loading, the first compilations) is otherwise silent."""
    if enabled:
        print(f"[{time.monotonic() - STARTED:6.1f}s] {text}", flush=True)


def _hms(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _short(v: Any) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{x:.3g}" if math.isfinite(x) else "nan"


class ProgressBar:
    """One console line: step, a few metrics, elapsed time and ETA.

    On a terminal the line is redrawn in place (`\\r`); otherwise (a log file,
    a pipe) a plain line is printed every `print_every` steps and at the last
    step. `start_step` is where this process started (after a resume); the ETA
    uses only the steps timed here after the first one (which compiled). `keys` are the metric names shown when
    present, each a name (displayed by its last `/` component) or a (name, label) pair.
    """

    def __init__(self, total_steps: int, *, enabled: bool = True, start_step: int = 0,
                 keys: Sequence[str] = ("success", "reward", "loss"), stream: TextIO | None = None,
                 print_every: int | None = None, clock: Callable[[], float] = time.monotonic):
        self.total = int(total_steps)
        self.enabled = enabled
        self.start_step = int(start_step)
        self.keys = tuple(keys)
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.inplace = bool(isatty and isatty())
        self.print_every = print_every or max(1, self.total // 20)
        self.clock = clock
        self.t0 = clock()
        self._width = 0
        self._first: tuple[int, float] | None = None  # (step, time) of the first step shown

    def line(self, step: int, metrics: Mapping[str, Any] | None = None) -> str:
        metrics = metrics or {}
        now = self.clock()
        elapsed = now - self.t0
        if self._first is None:  # the first step timed here also compiled: the rate starts after it
            self._first = (step, now)
        done = step - self._first[0]
        eta = _hms((self.total - step) * (now - self._first[1]) / done) if done > 0 else "?"
        pct = 100.0 * step / self.total if self.total else 100.0
        parts = [f"step {step}/{self.total} [{pct:3.0f}%]"]
        for k in self.keys:
            key, label = (k, k.rsplit("/", 1)[-1]) if isinstance(k, str) else k
            if key in metrics:
                parts.append(f"{label} {_short(metrics[key])}")
        return "  ".join(parts) + f"  | {_hms(elapsed)} elapsed, ETA {eta}"

    def update(self, step: int, metrics: Mapping[str, Any] | None = None):
        if not self.enabled:
            return
        text = self.line(step, metrics)
        if self.inplace:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = max(self._width, len(text))
        elif step % self.print_every == 0 or step >= self.total or step == self.start_step + 1:
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, text: str):
        """A line of its own (an evaluation's result), kept above an in-place progress line."""
        if not self.enabled:
            return
        if self.inplace and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.enabled and self.inplace and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
