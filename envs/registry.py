"""Workflows by name, for configs: `make_workflow(name, single_agent, **kwargs)`.

Grid names are `<game>_<kind>` with game in plan_path, sokoban, sudoku and kind
in tool_plan (the paper's tool agent + plan agent) or direct (short direct
actions for tiny models); `plan_path_demo` is the CPU demo. `math` and `code`
are the paper's text workflows. single_agent picks each one's one-agent variant.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

_GAMES = ("plan_path", "sokoban", "sudoku")


def _grid(game: str, kind: str) -> Callable[..., Any]:
    def make(single_agent: bool = False, **kwargs):
        from atgrpo_jax.envs.grid_workflows import make_grid_workflow
        return make_grid_workflow(kind + ("_single" if single_agent else ""), game, **kwargs)
    return make


def _demo(single_agent: bool = False, **kwargs):
    from atgrpo_jax.envs.grid_workflows import plan_path_demo
    return plan_path_demo("direct_single" if single_agent else "direct", **kwargs)


def _text(module: str, factory: str) -> Callable[..., Any]:
    def make(single_agent: bool = False, **kwargs):
        return getattr(importlib.import_module(module), factory)(single_agent=single_agent, **kwargs)
    return make


WORKFLOWS: dict[str, Callable[..., Any]] = {
    **{f"{g}_{k}": _grid(g, k) for g in _GAMES for k in ("tool_plan", "direct")},
    "plan_path_demo": _demo,
    "math": _text("atgrpo_jax.envs.math_workflow", "make_math_workflow"),
    "code": _text("atgrpo_jax.envs.code_workflow", "make_code_workflow"),
}


def make_workflow(name: str, single_agent: bool = False, **kwargs):
    if name not in WORKFLOWS:
        raise ValueError(f"unknown workflow {name!r}; known: {sorted(WORKFLOWS)}")
    return WORKFLOWS[name](single_agent=single_agent, **kwargs)
