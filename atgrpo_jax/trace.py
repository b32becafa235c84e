"""A timeline of what each pool and the host workers did: Chrome / Perfetto trace JSON.

    tracer = Tracer()
    with tracer.span("decode agent 0", track="pool policy_tool", tasks=8):
        ...
    tracer.write("trace.json")          # open in ui.perfetto.dev or chrome://tracing
    tracer.busy_seconds("pool policy_tool")

Spans are complete events ("ph": "X") on one row ("tid") per track; each also enters a
`jax.profiler.TraceAnnotation`, so a JAX profile taken at the same time shows the same names.
A disabled tracer records nothing and costs nearly nothing.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time

import jax

from atgrpo_jax import workdir as wd


class Tracer:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self._events: list[dict] = []
        self._tracks: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def span(self, name: str, track: str, **args):
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            with jax.profiler.TraceAnnotation(f"{track}: {name}"):
                yield
        finally:
            end = time.perf_counter()
            with self._lock:
                tid = self._tracks.setdefault(track, len(self._tracks))
                self._events.append({"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": (start - self.t0) * 1e6,
                                     "dur": (end - start) * 1e6, "args": args})

    def spans(self, track_prefix: str = "") -> list[tuple[float, float]]:
        """(start, end) in seconds of the spans on tracks starting with `track_prefix`."""
        with self._lock:
            ids = {tid for name, tid in self._tracks.items() if name.startswith(track_prefix)}
            return [(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in self._events if e["tid"] in ids]

    def records(self, name_prefix: str = "") -> list[tuple[str, str, float, float, dict]]:
        """(track, name, start s, duration s, args) of the spans whose name starts with
        `name_prefix`, in the order they started."""
        with self._lock:
            track = {tid: name for name, tid in self._tracks.items()}
            rows = [(track[e["tid"]], e["name"], e["ts"] / 1e6, e["dur"] / 1e6, e["args"])
                    for e in self._events if e["name"].startswith(name_prefix)]
        return sorted(rows, key=lambda r: r[2])

    def busy_seconds(self, track_prefix: str) -> float:
        """Time covered by at least one span of those tracks (overlaps counted once)."""
        return sum(e - s for s, e in union(self.spans(track_prefix)))

    def tracks(self) -> list[str]:
        with self._lock:
            return list(self._tracks)

    def to_json(self) -> dict:
        with self._lock:
            names = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": track}}
                     for track, tid in self._tracks.items()]
            return {"traceEvents": names + list(self._events), "displayTimeUnit": "ms"}

    def write(self, path: str):
        wd.makedirs(wd.dirname(path))
        wd.write_text(path, json.dumps(self.to_json()))


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The time covered by `spans`, as disjoint sorted intervals."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def overlap_seconds(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The summed time each span of `a` runs while at least one span of `b` does (so at most
    the summed length of `a`)."""
    total = 0.0
    for s1, e1 in a:
        for s2, e2 in union(b):
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total
