"""What the compiler says about a program: memory per chip, FLOPs and bytes, collectives.

Peak memory per chip is XLA's buffer assignment: arguments + outputs - outputs aliased to donated
arguments + temporaries, plus the state that stays on the chip beside the program (`Program.
resident`: in sampling the train state; in the update the sampler's copy of the weights). FLOPs,
bytes and libtpu's `optimal_seconds` come from the compiled cost analysis, which counts a while
loop's body once: for the decode segment that is one decode step (and its write-back).
Collectives are counted in the compiled program's text (each op once, as written: an op inside
the layer loop counts once, though it runs once per layer).
"""
from __future__ import annotations

import dataclasses
import math
import re

from atgrpo_jax.plan.programs import Program

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_ARRAY = re.compile(r"\b(pred|[subf]\d+|bf16|f8e\w+)\[([\d,]*)\]")
_BITS = {"pred": 8, "bf16": 16}


def _array_bytes(dtype: str, dims: str) -> int:
    bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype.split("e")[0]) or 8)
    return math.prod(int(d) for d in dims.split(",") if d) * bits // 8


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count", "bytes"}} of the collectives in a compiled program's text: bytes of each op's
    result (an async op's largest buffer), summed."""
    out = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if not m:
            continue
        sizes = [_array_bytes(dt, dims) for dt, dims in _ARRAY.findall(m.group(1))]
        entry = out[m.group(2)]
        entry["count"] += 1
        entry["bytes"] += (max(sizes) if m.group(3) else sum(sizes)) if sizes else 0
    return out


@dataclasses.dataclass
class Analysis:
    program: Program
    program_bytes: int  # the program's own peak per chip (arguments, outputs, temporaries)
    compiled_peak: int  # with the state that stays beside it
    flops: float
    bytes_accessed: float
    optimal_s: float | None  # libtpu's estimate of one run at the chip's peaks (TPU only; None where it
    # gives none: it reports a negative number for programs with loops)
    collectives: dict
    compile_s: float
    text: str = ""  # the compiled program (kept when asked: tests read it)


def analyze(program: Program, keep_text: bool = False) -> Analysis:
    """Compile `program` for its mesh's devices and read what the compiler reports."""
    compiled = program.compiled()
    seconds = program.compile_s
    m = compiled.memory_analysis()
    own = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
    text = compiled.as_text()
    optimal = cost.get("optimal_seconds")
    return Analysis(program, int(own), int(own + program.resident), float(cost.get("flops", 0.0)),
                    float(cost.get("bytes accessed", 0.0)), float(optimal) if optimal and optimal > 0 else None,
                    collectives(text), seconds, text if keep_text else "")
