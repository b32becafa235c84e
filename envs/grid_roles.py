"""The roles of the grid workflows (grid_workflows.py): how each answers, is parsed and is rewarded.

Rewards (`make_roles`, one row per role; docs/paper.md): a role's local reward is
its step reward r when its answer parses, else its `penalty`; its team reward is
the environment's reward: for a role whose actions move the environment that is
the same r (so the plan agent earns 2r in all, or the penalty when nothing
parses: its empty answer moves nothing), for a role that only simulates its
actions on a copy (the tool agent, the planner) it is the reward of the
environment's latest real step (a constant within the group). A "step reward"
is the sum of the game's per-move rewards over the answer's actions (cut to
`game.max_actions`). Turns after the environment is done get zero rewards and
no sandbox runs.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from atgrpo_jax.envs.games import GridGame

ACTIONS_MARKER = "**Actions List**:"
NO_MOVE = "-"  # the last move shown before the first one
DEFAULT_TOOL_PENALTY = -2.0  # the tool agent's unparsed reward for games without their own TOOL_PENALTY
MAX_TURNS = 10_000  # a sanity bound on WorkflowConfig.max_turns
_LIST_CHARS = 20_000  # an output's text after the actions marker that is parsed


@dataclasses.dataclass(frozen=True)
class Role:
    """How one role answers and is rewarded, with the values its workflow's config gives it."""

    answer: str  # "code" (a program prints the actions), "direct" (a few letters), "list" (#### [...])
    moves_env: bool  # its actions step the real environment (else they are simulated on a copy)
    penalty: float  # its local reward when nothing parses
    max_len: int | None = None  # direct answers: their maximal length
    system: str = ""  # the system prompt of long prompts


TOOL_SYSTEM = ("You are the tool agent of a two-agent team. You solve puzzles by writing Python "
               "code; a plan agent checks your result and makes the final move.")
PLAN_SYSTEM = ("You are the plan agent of a two-agent team. A tool agent wrote code for the task; "
               "check its actions against the state, correct them if needed, and give the final actions.")

TOOL_ALONE_SYSTEM = "You solve grid puzzles by writing Python code; the actions your program prints are played."


def make_roles(c: "WorkflowConfig") -> dict[str, Role]:
    """Every role, with its penalty and answer length from the config."""
    return {
        "tool": Role("code", moves_env=False, penalty=c.tool_penalty, system=TOOL_SYSTEM),
        "plan": Role("list", moves_env=True, penalty=c.plan_penalty, system=PLAN_SYSTEM),
        "solver": Role("list", moves_env=True, penalty=c.plan_penalty, system="You solve grid puzzles step by step."),
        "planner": Role("direct", moves_env=False, penalty=c.format_penalty, max_len=c.plan_len),
        "executor": Role("direct", moves_env=True, penalty=c.format_penalty, max_len=c.exec_len),
        "actor": Role("direct", moves_env=True, penalty=c.format_penalty, max_len=c.exec_len),
        "tool_alone": Role("code", moves_env=True, penalty=c.tool_penalty, system=TOOL_ALONE_SYSTEM),
        "planner_alone": Role("direct", moves_env=True, penalty=c.format_penalty, max_len=c.plan_len),
    }


KINDS = {"tool_plan": ("tool", "plan"), "tool_plan_single": ("solver",),
         "direct": ("planner", "executor"), "direct_single": ("actor",),
         "tool_single": ("tool_alone",), "planner_single": ("planner_alone",)}
SINGLE = {("tool_plan", "plan"): "tool_plan_single", ("tool_plan", "tool"): "tool_single",
          ("direct", "executor"): "direct_single", ("direct", "planner"): "planner_single"}


def single_kind(kind: str, role: str = "") -> str:
    """The single-agent kind of `kind` that trains `role` alone ("": the kind's default one-agent variant)."""
    if not role:
        return f"{kind}_single"
    if (kind, role) not in SINGLE:
        roles = [r for k, r in SINGLE if k == kind]
        raise ValueError(f"env.kwargs.alone={role!r}: {kind} has no such role; choose one of {roles}")
    return SINGLE[(kind, role)]


@dataclasses.dataclass
class WorkflowConfig:
    max_turns: int = 4
    seed: int = 0
    tool_penalty: float | None = None  # None: the game's TOOL_PENALTY (the reference's: Sudoku -1), else the default
    tool_empty_reward: float = 0.0  # the tool agent's local reward for printing an empty list [] (the reference's)
    plan_penalty: float = -2.0
    format_penalty: float = -1.0
    plan_len: int = 4
    exec_len: int = 2
    sandbox_limits: Any = None  # sandbox.Limits; None = its defaults (20 s wall clock)
    sandbox_workers: int | None = None
    view: str = "grid"  # direct prompts: "grid" (rows joined by '/') or "local" (games with local_view)
    lenient: bool = False  # direct answers: the UDLR letters among the first max_len characters


def actions_from_output(stdout: str, game: GridGame) -> list[int] | None:
    """Actions from the last `**Actions List**:` line a program printed; [] for an empty list `[]`
    (which the tool agent's prompt allows), None when nothing parses."""
    if not isinstance(stdout, str):
        return None
    at = stdout.rfind(ACTIONS_MARKER)
    if at < 0:
        at = stdout.rfind("Actions List:")
        if at < 0:
            return None
    rest = stdout[at:].split(":", 1)[1][:_LIST_CHARS]
    if rest.strip().split("\n", 1)[0].replace(" ", "") == "[]":
        return []
    return game.parse_list(rest)


def actions_from_answer(text: str, game: GridGame) -> list[int] | None:
    """Actions after the last `####` line outside code blocks (None if absent or empty)."""
    from atgrpo_jax.envs.parsers import extract_after_marker

    rest = extract_after_marker(text, "####")
    actions = game.parse_list(rest) if rest is not None else None
    return actions or None
