"""Small helpers shared by the text workflows (math, code, search): object-array state, data files."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from atgrpo_jax.data.readers import iter_jsonl
from atgrpo_jax.envs.workflow import branch

DATA_DIR = Path(__file__).parent / "data"


def obj_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array (numpy would otherwise turn strings into fixed-width unicode)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def clip_tail(text: Any, max_chars: int) -> str:
    """The last max_chars characters of text (marked when cut), for prompts."""
    text = "" if text is None else str(text)
    return text if len(text) <= max_chars else "[...]\n" + text[-max_chars:]


def clip_head(text: Any, max_chars: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= max_chars else text[:max_chars] + "\n[...]"


def clip_middle(text: Any, keep: int) -> str:
    """The first and last `keep` characters of text, the middle marked as cut (the reference's truncation)."""
    text = "" if text is None else str(text)
    return text if len(text) <= 2 * keep else text[:keep] + "\n[...]\n" + text[-keep:]


def response_grid(responses: Sequence[Sequence[Any]], batch: int) -> list[list[str]]:
    """responses[b][k] as strings (non-strings become ""), checked to be [batch][K] with K >= 1."""
    if len(responses) != batch:
        raise ValueError(f"expected responses for {batch} tasks, got {len(responses)}")
    widths = {len(row) for row in responses}
    if len(widths) != 1 or 0 in widths:
        raise ValueError(f"every task needs the same number K >= 1 of responses, got widths {sorted(widths)}")
    return [[r if isinstance(r, str) else "" for r in row] for row in responses]


@functools.lru_cache(maxsize=None)
def load_jsonl(relative_path: str) -> tuple[dict, ...]:
    """Records of a shipped JSONL file under envs/data (cached, read-only tuple); the same reader as
    every other data source (atgrpo_jax.data)."""
    return tuple(iter_jsonl(str(DATA_DIR / relative_path)))


class StepFrame(NamedTuple):
    """What a text workflow's step fills in: the replies, the state branched K ways, [B, K] rewards and
    parse notes, and the (task, branch) pairs of the tasks still running."""

    grid: list[list[str]]
    out: dict
    local: np.ndarray
    team: np.ndarray
    parsed_as: np.ndarray
    active: list[tuple[int, int]]


def step_frame(state: dict, responses: Sequence[Sequence[Any]]) -> StepFrame:
    grid = response_grid(responses, len(state["done"]))
    shape = (len(grid), len(grid[0]))
    parsed_as = obj_array([""] * (shape[0] * shape[1])).reshape(shape)
    active = [(b, j) for b in range(shape[0]) if not state["done"][b] for j in range(shape[1])]
    return StepFrame(grid, branch(state, shape[1]), np.zeros(shape, np.float32), np.zeros(shape, np.float32),
                     parsed_as, active)
