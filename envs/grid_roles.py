"""The roles of the grid workflows (grid_workflows.py): how each answers, is parsed and is rewarded.

Rewards (`make_roles`, one row per role; docs/paper.md): a role's local reward is
its step reward r when its answer parses, else its `penalty`; its team reward is
the environment's reward: for a role whose actions move the environment that is
the same r (so the plan agent earns 2r in all, or the penalty when nothing
parses: its empty answer moves nothing), for a role that only simulates its
actions on a copy (the tool agent, the planner) it is the reward of the
environment's latest real step (a constant within the group). A "step reward"
is the sum of the game's per-move rewards over the answer's actions (cut to
`game.max_actions`, or with `uncut_answers` all of them). Turns after the
environment is done get zero rewards and no sandbox runs.

With `format_errors` (the reference's state.step, docs/paper.md "Recipes"), a
list whose items the game's step cannot read as actions (a move game's list
with an item that is not a string, a Sudoku list that is neither a full grid
nor [row, col, digit] triples) moves nothing and is a `FormatError`: its
role's local reward is `FORMAT_PENALTY`, and where it was to step the
environment (the plan agent) that step's reward, the team reward, is
`FORMAT_PENALTY` too (-1 and -1, where an answer that does not parse is -2 and
0: docs/paper.md "Recipes", row 3a).
"""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any

from atgrpo_jax.envs.games import GridGame
from atgrpo_jax.envs.grid import INVALID, LETTERS, literal_list
from atgrpo_jax.envs.parsers import extract_after_marker
from atgrpo_jax.envs.workflow import as_reference

ACTIONS_MARKER = "**Actions List**:"
NO_MOVE = "-"  # the last move shown before the first one
DEFAULT_TOOL_PENALTY = -2.0  # the tool agent's unparsed reward for games without their own TOOL_PENALTY
MAX_TURNS = 10_000  # a sanity bound on WorkflowConfig.max_turns
_LIST_CHARS = 20_000  # an output's text after the actions marker that is parsed
MOVE_GAMES = ("plan_path", "sokoban")  # games whose actions are U/D/L/R moves
MOVES = tuple(LETTERS)  # a move's code is its index
# With uncut_answers, how many actions of one answer are read at most: more than a 2048-token reply can spell
UNCUT_MAX_ACTIONS = 4096
# The reference's state.step reward for a list it cannot read as actions (docs/paper.md, "Recipes", row 4)
FORMAT_PENALTY = -1.0


@dataclasses.dataclass(frozen=True)
class FormatError:
    """An action list (printed, or a plan answer) the game's step rejects as a whole (with `format_errors`): no
    move, FORMAT_PENALTY as the role's local reward and as the reward of the environment step it was to take."""

    items: list


def step_reads(items: list, game: GridGame) -> bool:
    """Whether the reference's state.step reads `items` as actions: in the move games every item is a
    string (unknown ones are invalid moves), in Sudoku the list is a full grid of digits 1..size or
    [row, col, digit] triples; anything else it scores as an invalid format."""
    if game.name in MOVE_GAMES:
        return all(isinstance(item, str) for item in items)
    size = getattr(game.module, "SIZE", None)
    if len(items) == size and all(isinstance(row, list) and len(row) == size for row in items):
        try:
            return all(1 <= int(value) <= size for row in items for value in row)
        except (TypeError, ValueError):
            return False
    return all(isinstance(item, list) and len(item) == 3 for item in items)


def _unreadable(text: str | None, game: GridGame) -> bool:
    """Whether the first bracketed list of `text` is one the game's step rejects (`step_reads`)."""
    items = literal_list(text) if isinstance(text, str) else None
    return isinstance(items, list) and not step_reads(items, game)


@dataclasses.dataclass(frozen=True)
class Role:
    """How one role answers and is rewarded, with the values its workflow's config gives it."""

    answer: str  # "code" (a program prints the actions), "direct" (a few letters), "list" (#### [...])
    moves_env: bool  # its actions step the real environment (else they are simulated on a copy)
    penalty: float  # its local reward when nothing parses
    max_len: int | None = None  # direct answers: their maximal length
    system: str = ""  # long prompts: the name of its system prompt's template, envs/prompts/grid/<system>.system.j2


def make_roles(c: "WorkflowConfig") -> dict[str, Role]:
    """Every role, with its penalty and answer length from the config."""
    return {
        "tool": Role("code", moves_env=False, penalty=c.tool_penalty, system="tool"),
        "plan": Role("list", moves_env=True, penalty=c.plan_penalty, system="plan"),
        "solver": Role("list", moves_env=True, penalty=c.plan_penalty, system="solver"),
        "planner": Role("direct", moves_env=False, penalty=c.format_penalty, max_len=c.plan_len),
        "executor": Role("direct", moves_env=True, penalty=c.format_penalty, max_len=c.exec_len),
        "actor": Role("direct", moves_env=True, penalty=c.format_penalty, max_len=c.exec_len),
        "tool_alone": Role("code", moves_env=True, penalty=c.tool_penalty, system="tool_alone"),
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
    prompt_dir: str = ""  # a directory of prompt templates replacing the shipped ones (envs/prompt_templates.py)
    recipe: str = "paper"  # the switches below left at None follow it (envs/workflow.py: RECIPES)
    strict_answer: bool | None = None  # True (reference): the plan agent's answer is everything from its first
    # `#### ` line to the end, and only a bracketed list parses: `#### ["U"]` then more text, two `####` lines,
    # `####["U"]` or `#### U R` give no answer, and items other than U/D/L/R are invalid moves; False: the last
    # `####` line outside code, lists or bare moves, lower case and words (up, left) read as moves
    whole_reply_program: bool | None = None  # True (reference): a tool reply without a code block runs whole (an
    # unclosed block too); False: a reply without a ```python (or untagged) block runs nothing
    reference_tool_output: bool | None = None  # True (reference): a program whose run wrote anything to stderr
    # (or timed out) gives no actions; else the last `**Actions List**: [...]`, then `Actions: [...]`, then the
    # first bare `[...]` line of its output; False: the last `**Actions List**:` line, whatever stderr says
    done_is_success: bool | None = None  # True (reference): an episode whose environment is done succeeded,
    # so a Sokoban level that ran out of moves (max_steps) counts as solved; False: only a solved level
    handoff_next_turn: bool | None = None  # True (reference): every agent's prompt is rendered at the start of
    # the turn, so what the first agent passes on (a program's result, a proposal) reaches the next agent one turn
    # later (nothing at turn 0); False: the next agent sees this turn's selected branch's
    static_observation: bool | None = None  # True (reference): Plan-Path's prompts (and a program's standard
    # input) show the walls and the level's start and goal, never where the walker is now; False: the current
    # cell marked and stated. Games without a static view (Sokoban, Sudoku) show their state either way
    whole_grid_answer: bool | None = None  # True (reference): the Sudoku tool agent is asked to print the whole
    # solved grid; False: its placements (either parses). Games without a grid answer ask for moves either way
    format_errors: bool | None = None  # True (reference): a list the game's step cannot read as actions (`[1, 2]`,
    # `["U", 1]`, `[true]` in a move game) is a format error: nothing moves, the role's local reward is
    # FORMAT_PENALTY and so is the team reward where its actions were to step the environment (the plan agent:
    # -1 and -1); False: each such item is an invalid move
    uncut_answers: bool | None = None  # True (reference): every action of an answer is played, however many;
    # False: the first game.max_actions (Plan-Path 64, Sokoban 100, Sudoku 16)
    blind_program: bool | None = None  # True (reference): the tool agent's program reads nothing on its standard
    # input (and its prompt does not offer it); False: the board (the prompt's view of it) on standard input
    no_move_history: bool | None = None  # True (reference): prompts show no earlier turns; False: an "Earlier
    # turns" list of the moves played and their rewards

    def __post_init__(self):
        self.strict_answer = as_reference(self.strict_answer, self.recipe)
        self.done_is_success = as_reference(self.done_is_success, self.recipe)
        self.reference_tool_output = as_reference(self.reference_tool_output, self.recipe)
        self.whole_reply_program = as_reference(self.whole_reply_program, self.recipe)
        self.static_observation = as_reference(self.static_observation, self.recipe)
        self.whole_grid_answer = as_reference(self.whole_grid_answer, self.recipe)
        self.handoff_next_turn = as_reference(self.handoff_next_turn, self.recipe)
        self.format_errors = as_reference(self.format_errors, self.recipe)
        self.uncut_answers = as_reference(self.uncut_answers, self.recipe)
        self.blind_program = as_reference(self.blind_program, self.recipe)
        self.no_move_history = as_reference(self.no_move_history, self.recipe)


def actions_from_output(stdout: str, game: GridGame, format_errors: bool = False) -> list[int] | FormatError | None:
    """Actions from the last `**Actions List**:` line a program printed; [] for an empty list `[]`
    (which the tool agent's prompt allows), None when nothing parses; `format_errors`: a FormatError
    for a list the game's step rejects (`step_reads`)."""
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
    if format_errors and _unreadable(rest, game):
        return FormatError(literal_list(rest))
    return game.parse_list(rest)


def _tool_candidate_ok(items: list, game: GridGame, kind: str) -> bool:
    """Whether the reference's output parser keeps a candidate list (`stateful/utils.py:100-174`):
    Plan-Path needs every item one of U, D, L, R; Sudoku a non-empty list whose first item is a list,
    or, on the `**Actions List**:` line only, a list of triples (so `[]` there parses); Sokoban any list."""
    if game.name == "plan_path":
        return all(isinstance(a, str) and a in MOVES for a in items)
    if game.name == "sudoku":
        rows = bool(items) and isinstance(items[0], list)
        if kind == "marked":
            return (rows and all(isinstance(row, list) and row for row in items)) or \
                all(isinstance(step, list) and len(step) == 3 for step in items)
        return rows
    return True


def _as_actions(items: list, game: GridGame, format_errors: bool) -> list[int] | FormatError:
    """A list the reference accepted, as action codes; with `format_errors`, a FormatError where the
    game's step rejects it; in the move games an item other than "U", "D", "L", "R" is an invalid move."""
    if format_errors and not step_reads(items, game):
        return FormatError(items)
    if game.name in MOVE_GAMES:
        return [MOVES.index(a) if isinstance(a, str) and a in MOVES else INVALID for a in items][:game.max_actions]
    return [] if not items else game.parse_list(json.dumps(items))


def reference_tool_actions(output: str, game: GridGame, format_errors: bool = False) -> list[int] | FormatError | None:
    """The tool agent's actions as the reference system reads its program's output (`as_reference_reports`
    of the run): none from an "error:..." (stderr) output; else the last `**Actions List**: [...]`, then
    the last `Actions: [...]`, then the first line that is a bracketed list, each kept or skipped as
    `_tool_candidate_ok` says; the kept list as `_as_actions` reads it."""
    if not isinstance(output, str) or output.startswith("error:"):
        return None
    candidates = [("marked", m[-1]) for m in [re.findall(r"\*\*Actions List\*\*:\s*(\[.*?\])", output, re.DOTALL)]
                  if m]
    candidates += [("plain", m[-1]) for m in [re.findall(r"Actions:\s*(\[.*?\])", output, re.DOTALL)] if m]
    lines = [line.strip() for line in output.strip().split("\n")]
    candidates += [("line", line) for line in lines if line.startswith("[") and line.endswith("]")]
    for kind, text in candidates:
        try:
            items = ast.literal_eval(text)
        except Exception:  # noqa: BLE001 - the reference's eval() failing: the next candidate
            continue
        if isinstance(items, list) and _tool_candidate_ok(items, game, kind):
            return _as_actions(items, game, format_errors)
    return None


def actions_from_answer(text: str, game: GridGame, strict: bool = False,
                        format_errors: bool = False) -> list[int] | FormatError | None:
    """Actions after the last `####` line outside code blocks (None if absent or empty); `strict`:
    as the reference reads them (`reference_answer`); `format_errors`: a FormatError for a list the
    game's step rejects (`step_reads`), which the reference scores -1 for the format and -1 as the
    step's team reward (docs/paper.md, "Recipes", row 3a)."""

    if strict:
        return reference_answer(text, game, format_errors)
    rest = extract_after_marker(text, "####")
    if format_errors and _unreadable(rest, game):
        return FormatError(literal_list(rest))
    actions = game.parse_list(rest) if rest is not None else None
    return actions or None


_REFERENCE_ANSWER = re.compile(r"(?m)^\s*####\s+(.+)$", re.DOTALL)


def reference_answer(text: str, game: GridGame, format_errors: bool = False) -> list[int] | FormatError | None:
    """The plan agent's actions as the reference system reads them (`stateful/utils.py:22-65`): everything
    from the first `#### ` line to the end of the text must be one bracketed list (a Python or JSON literal,
    or bare U/D/L/R items; Python's literal_eval reads a second `####` line after the list as a comment, so
    the first list counts); then as `_as_actions` reads it (a FormatError where the game's step rejects it)."""
    found = _REFERENCE_ANSWER.findall(text) if isinstance(text, str) else []
    body = found[-1].strip() if found else ""
    if not (body.startswith("[") and body.endswith("]")):
        return None
    items = None
    for load in (ast.literal_eval, json.loads):
        try:
            value = load(body)
        except Exception:  # noqa: BLE001 - a malformed literal is no answer
            continue
        if isinstance(value, list):
            items = value
            break
    if items is None and game.name in MOVE_GAMES:
        bare = [item.strip().strip("\"'") for item in body[1:-1].split(",")]
        items = [item for item in bare if item] if all(item in MOVES for item in bare if item) else None
    if not items:
        return None
    return _as_actions(items, game, format_errors)
