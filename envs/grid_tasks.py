"""One adapter per grid game, so the grid workflows treat all three alike.

A `GridGame` bundles a game module with its params and what the workflows need
from it: rules text for prompts, a rendering, and the parsers that turn an
answer into an int action list (see `grid` for the move codes and
`sudoku.encode` for placements). Parsers never raise; they return None when
nothing parses.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from atgrpo_jax.envs import grid, plan_path, sokoban, sudoku

_MODULES = {"plan_path": plan_path, "sokoban": sokoban, "sudoku": sudoku}


@dataclasses.dataclass(frozen=True)
class GridGame:
    name: str  # "plan_path" | "sokoban" | "sudoku"
    params: Any
    max_actions: int  # padded length of one answer's action array

    @property
    def module(self):
        return _MODULES[self.name]

    # ------------------------------------------------------------ rendering

    def render(self, state: Any, row_sep: str = "\n") -> str:
        """The game's notation for one unbatched (host) state."""
        if self.name == "sokoban":
            return sokoban.render(state).replace("\n", row_sep)
        return self.module.render(state, row_sep=row_sep)

    def status(self, state: Any) -> str:
        """One line of facts that the rendering leaves implicit."""
        if self.name == "plan_path":
            pos, goal = np.asarray(state.pos).tolist(), np.asarray(state.goal).tolist()
            return f"You are at (row {pos[0]}, col {pos[1]}); the goal is at (row {goal[0]}, col {goal[1]})."
        if self.name == "sokoban":
            boxes, goals = np.asarray(state.boxes), np.asarray(state.goals)
            return f"Boxes on goals: {int((boxes & goals).sum())}/{int(boxes.sum())}."
        empty = int((np.asarray(state.grid) == 0).sum())
        return f"Empty cells: {empty}. Puzzle givens:\n{sudoku.render(state, which='puzzle')}"

    def rules(self) -> str:
        """The task for the long (tool/plan) prompts."""
        if self.name == "plan_path":
            return (
                "Path planning on a grid. Legend: '#' wall, '.' free cell, 'S' you, 'G' goal "
                "('*' you on the goal). Rows are numbered from 0 at the top, columns from 0 at the left.\n"
                "Moves: 'U' (row - 1), 'D' (row + 1), 'L' (col - 1), 'R' (col + 1). A move into a wall "
                "or off the grid is wasted. Reach G; a shortest path earns a bonus."
            )
        if self.name == "sokoban":
            return (
                "Sokoban. Legend: '#' wall, ' ' floor, '.' goal, '$' box, '*' box on goal, '@' you, "
                "'+' you on a goal. Rows are numbered from 0 at the top.\n"
                "Moves: 'U', 'D', 'L', 'R'. Walking into a box pushes it one cell if the cell behind it "
                "is free (not a wall or box); boxes cannot be pulled. Put every box on a goal; "
                "avoid pushing a box into a corner that is not a goal."
            )
        return (
            "Sudoku 4x4. Fill the grid with digits 1-4 so every row, column and 2x2 box holds each "
            "digit once. '.' is an empty cell; the givens cannot change. Rows and columns are numbered "
            "0-3. A placement is [row, col, digit]."
        )

    def answer_format(self) -> str:
        if self.name == "sudoku":
            return 'a list of placements [[row, col, digit], ...] or the full grid [[1,2,3,4], ...]'
        return 'a list of moves such as ["U", "R", "D", "L"]'

    # ------------------------------------------------------------ parsing

    def parse_list(self, text: str) -> list[int] | None:
        """A bracketed answer (tool output or plan answer) -> action codes, or None."""
        if self.name != "sudoku":
            return grid.moves_from_list_text(text, self.max_actions)
        value = grid.literal_list(text)
        if not value:
            return None
        if len(value) == sudoku.SIZE and all(_is_int_row(row, sudoku.SIZE) for row in value):
            cells = [(r, c, v) for r, row in enumerate(value) for c, v in enumerate(row) if v != 0]
            return [_placement(*cell) for cell in cells][: self.max_actions]
        return [_placement(*item) if _is_int_row(item, 3) else sudoku.NUM_ACTIONS
                for item in value[: self.max_actions]]

    def parse_direct(self, text: str, max_len: int) -> list[int] | None:
        """A short direct answer: 1..max_len letters of UDLR, or one 'rcd' placement (Sudoku)."""
        if not isinstance(text, str) or len(text) > 64:
            return None
        if self.name != "sudoku":
            return grid.moves_from_letters(text.strip(), max_len)
        digits = re.sub(r"[\s,]", "", text)
        if not re.fullmatch(r"[0-3][0-3][1-4]", digits):
            return None
        return [sudoku.encode(int(digits[0]), int(digits[1]), int(digits[2]))]

    def show_actions(self, codes: list[int] | None) -> str:
        """Action codes as the model would write them."""
        if codes is None:
            return "none (nothing parsed)"
        if self.name == "sudoku":
            return str([list(sudoku.decode(a)) if 0 <= a < sudoku.NUM_ACTIONS else "invalid" for a in codes])
        return "[" + ", ".join(f'"{grid.LETTERS[a]}"' if 0 <= a <= 3 else '"?"' for a in codes) + "]"


def _is_int_row(item: Any, n: int) -> bool:
    return isinstance(item, (list, tuple)) and len(item) == n and all(
        isinstance(x, int) and not isinstance(x, bool) for x in item)


def _placement(r: int, c: int, v: int) -> int:
    if 0 <= r < sudoku.SIZE and 0 <= c < sudoku.SIZE and 1 <= v <= sudoku.SIZE:
        return sudoku.encode(r, c, v)
    return sudoku.NUM_ACTIONS  # an invalid placement (penalized by the game)


def make_game(name: str, params: Any = None, max_actions: int | None = None) -> GridGame:
    """The adapter for `name` with default params and answer lengths."""
    if name not in _MODULES:
        raise ValueError(f"unknown grid game {name!r}; choose from {sorted(_MODULES)}")
    params = _MODULES[name].Params() if params is None else params
    default_len = {"plan_path": 64, "sokoban": 100, "sudoku": 16}[name]
    return GridGame(name, params, max_actions or default_len)
