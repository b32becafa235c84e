"""Where device time goes: a JAX profile of a call, summarized per kernel.

`profile_kernels(fn)` runs fn under `jax.profiler.trace` and reads the trace JSON that JAX
writes beside the raw profile (no TensorBoard plugin needed). On a GPU the device's events are
its kernels, one timeline per CUDA stream; the summary gives how many kernels ran, how long the
device was busy against the wall time the kernels spanned (the rest is launch gaps: host-side
overhead), the kernels that only copy bytes (`COPY_KERNEL`), and the kernels that took the most
time. On a CPU there is no device timeline and
the summary says so: the same code runs in the test suite.
"""
from __future__ import annotations

import collections
import gzip
import json
import re
import tempfile
from pathlib import Path

# Kernels that only move bytes: copies, memcpys and (dynamic-)slice fusions, e.g. a layer's
# weights or cache sliced out of a stacked array (docs/sampler_performance.md). Not
# dynamic-update-slices: those are the cache writes, in place.
COPY_KERNEL = re.compile(r"copy|memcpy|(?<!update.)slice", re.IGNORECASE)


def _device_events(trace: dict) -> dict[str, list[dict]]:
    """Complete events per timeline ("process / thread" name) of the device processes."""
    names, threads = {}, {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e.get("tid"))] = e["args"]["name"]
    lines: dict[str, list[dict]] = collections.defaultdict(list)
    for e in trace.get("traceEvents", []):
        process = names.get(e.get("pid"), "")
        if e.get("ph") == "X" and "/device:" in process:
            lines[f"{process} / {threads.get((e['pid'], e.get('tid')), e.get('tid'))}"].append(e)
    return lines


def _busy(events: list[dict]) -> float:
    """Microseconds covered by at least one event (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for e in sorted(events, key=lambda e: e["ts"]):
        start, stop = e["ts"], e["ts"] + e.get("dur", 0.0)
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarize(trace: dict, calls: int = 1, top: int = 15) -> dict:
    """Per call: kernels, device-busy and spanned seconds, and the `top` kernels by time.

    Kernels are the events of the device's stream timelines (names with "Stream"); where a
    device has none of those (other platforms), all of its timelines count."""
    lines = _device_events(trace)
    if not lines:
        processes = sorted({e["args"]["name"] for e in trace.get("traceEvents", [])
                            if e.get("ph") == "M" and e.get("name") == "process_name"})
        return {"device_timelines": [], "processes": processes,
                "note": "no device timeline in the profile (a CPU run, or no GPU tracer)"}
    streams = {k: v for k, v in lines.items() if "stream" in k.lower()} or lines
    kernels = [e for events in streams.values() for e in events]
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(e.get("dur", 0.0))
    span = max(e["ts"] + e.get("dur", 0.0) for e in kernels) - min(e["ts"] for e in kernels)
    busy = _busy(kernels)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    copies = [e for e in kernels if COPY_KERNEL.search(e["name"])]
    return {"device_timelines": sorted(lines), "kernel_timelines": sorted(streams), "calls": calls,
            "kernels_per_call": len(kernels) / calls, "busy_s_per_call": busy * 1e-6 / calls,
            "span_s_per_call": span * 1e-6 / calls, "busy_fraction": busy / span if span else None,
            "copy_kernels_per_call": len(copies) / calls,
            "copy_s_per_call": sum(e.get("dur", 0.0) for e in copies) * 1e-6 / calls,
            "top": [{"name": name[:160], "count_per_call": len(d) / calls, "s_per_call": sum(d) * 1e-6 / calls,
                     "mean_us": sum(d) / len(d)} for name, d in ranked]}


def read_trace(folder: str) -> dict:
    """The trace JSON JAX wrote under `folder` (plugins/profile/<run>/<host>.trace.json.gz)."""
    found = sorted(Path(folder).glob("plugins/profile/*/*.trace.json.gz"))
    if not found:
        raise FileNotFoundError(f"no *.trace.json.gz under {folder}/plugins/profile")
    with gzip.open(found[-1]) as f:
        return json.load(f)


def profile_kernels(fn, calls: int = 1, top: int = 15) -> dict:
    """Run fn() `calls` times under the profiler (results waited for) and summarize its kernels.
    A profile that cannot be taken or read is reported as {"error": ...}: it is a diagnosis,
    never a reason to lose the timings measured around it."""
    import jax
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with jax.profiler.trace(tmp):
                for _ in range(calls):
                    jax.block_until_ready(fn())
            return summarize(read_trace(tmp), calls, top)
    except Exception as e:  # noqa: BLE001 - any failure of the profiler or of the call
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
