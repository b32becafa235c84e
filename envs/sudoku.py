"""Sudoku 4x4: fill the grid so rows, columns and 2x2 boxes hold 1..4 (pure JAX).

Notation: 4 lines of 4 characters, a digit 1-4 or `.` for an empty cell.
`from_ascii` treats every digit as a given and requires a unique solution.

Actions are placements (row, col, digit) with row, col in 0..3 and digit in
1..4, encoded as the int `(row * 4 + col) * 4 + (digit - 1)` (0..63; see
`encode`). -1 is a no-op pad; any other int is an invalid placement.

A placement is valid when the digit clashes with no other cell of its row,
column and box and the cell is not a given holding another digit (re-stating
a given is a valid placement that changes nothing; a player-filled cell may be
overwritten). Rewards (all in `Params`): -0.01 per valid placement, -0.1 per
invalid one (grid unchanged); +0.1 when a cell becomes equal to the (unique)
solution and -0.1 when a correct cell is overwritten with another digit (i.e.
shaping with potential 0.1 x correct cells); +1 and done when the grid equals
the solution (success); -1 and done after `max_steps` placements unsolved.
A done episode ignores further placements (reward 0).

`Params.rewards = "reference"` scores as the reference system does (docs/paper.md): a placement
is valid only on an empty cell without a clash; valid: -0.01, +0.2 when the cell had one
candidate (+0.1 for two), + 0.5 x the filled fraction it adds, + 0.02 x the change in satisfied
constraints (per row, column and box without a repeat, its filled cells - 1), + 0.1 x the filled
fraction after it, + 0.05 while empty cells remain; invalid: -0.3 (grid unchanged); solved: +2,
and +0.5 more when it took no more placements than there were empty cells; no step limit. A
placement that restates a cell's digit changes nothing and scores 0 (a full-grid answer is read
as placements, and the reference scores a full grid without charging its givens).

Levels: a uniformly random valid grid (one of the 288), then cells are removed
in random order while the puzzle keeps exactly one solution and more than
`min_givens` givens remain. The solution count is exact: the number of the 288
grids that agree with the givens.
"""
from __future__ import annotations

import itertools
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid

SIZE = 4
NUM_ACTIONS = SIZE * SIZE * SIZE


def _all_grids() -> np.ndarray:
    """Every valid 4x4 Sudoku grid (288), built row by row from permutations."""
    perms = list(itertools.permutations(range(1, SIZE + 1)))
    out = []

    def box_ok(rows):
        r = len(rows) - 1
        if r % 2 == 0:
            return True
        return all(len({rows[r - 1][c], rows[r - 1][c + 1], rows[r][c], rows[r][c + 1]}) == 4 for c in (0, 2))

    def extend(rows):
        if len(rows) == SIZE:
            out.append([list(r) for r in rows])
            return
        for p in perms:
            if all(p[c] != row[c] for row in rows for c in range(SIZE)) and box_ok(rows + [p]):
                extend(rows + [p])

    extend([])
    return np.array(out, dtype=np.int32)


ALL_GRIDS = _all_grids()  # [288, 4, 4]


class Params(NamedTuple):
    min_givens: int = 6  # stop removing cells at this many givens
    r_step: float = -0.01
    r_invalid: float = -0.1
    r_correct: float = 0.1
    r_solved: float = 1.0
    r_fail: float = -1.0
    max_steps: int = 40
    max_tries: int = 1000
    rewards: str = "ours"  # or "reference" (the module docstring)


class State(NamedTuple):
    puzzle: jax.Array  # int32 [4, 4], givens (0 = empty)
    grid: jax.Array  # int32 [4, 4], current digits
    solution: jax.Array  # int32 [4, 4]
    steps: jax.Array  # int32, placements made (invalid ones included)
    invalid: jax.Array  # int32
    done: jax.Array  # bool
    success: jax.Array  # bool


def encode(row: int, col: int, digit: int) -> int:
    """Placement -> action int (see the module docstring)."""
    return (row * SIZE + col) * SIZE + (digit - 1)


def decode(action: int) -> tuple[int, int, int]:
    cell, digit = divmod(int(action), SIZE)
    return cell // SIZE, cell % SIZE, digit + 1


def level_arrays(state: State) -> list:
    return [state.puzzle]


def count_solutions(puzzle: jax.Array) -> jax.Array:
    """Exact number of solutions of a 4x4 puzzle (0 = empty cell)."""
    match = (jnp.asarray(ALL_GRIDS) == puzzle[None]) | (puzzle[None] == 0)
    return jnp.sum(jnp.all(match, axis=(1, 2)))


def _make_state(puzzle, solution) -> State:
    zero = jnp.int32(0)
    solved = jnp.all(puzzle == solution)
    return State(puzzle, puzzle, solution, zero, zero, solved, solved)


def _sample(key, params: Params):
    u_grid, u_order = grid.uniform_parts(key, (1, SIZE * SIZE))
    solution = jnp.asarray(ALL_GRIDS)[grid.randint_from(u_grid[0], len(ALL_GRIDS))]

    def remove(puzzle, cell):
        r, c = cell // SIZE, cell % SIZE
        trial = puzzle.at[r, c].set(0)
        keep_out = (jnp.sum(puzzle > 0) > params.min_givens) & (count_solutions(trial) == 1)
        return jnp.where(keep_out, trial, puzzle), None

    puzzle, _ = jax.lax.scan(remove, solution, jnp.argsort(u_order))
    return _make_state(puzzle, solution)


def reset(key: jax.Array, params: Params = Params(), split: str | None = None) -> State:
    """A puzzle with a unique solution; `split` (train, valid, test; None: any) picks that split."""

    def attempt(i):
        state = _sample(jax.random.fold_in(key, i), params)
        return state, grid.split_ok(grid.level_bucket(level_arrays(state)), split)

    def body(carry):
        i, _, _ = carry
        state, ok = attempt(i + 1)
        return i + 1, state, ok

    state, ok = attempt(0)
    cond = lambda c: ~c[2] & (c[0] < params.max_tries)  # noqa: E731
    _, state, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), state, ok))
    return state


def _units() -> np.ndarray:
    """[12, 4, 4] masks of the rows, columns and 2x2 boxes."""
    rr, cc = np.indices((SIZE, SIZE))
    return np.array([rr == i for i in range(SIZE)] + [cc == i for i in range(SIZE)]
                    + [(rr // 2 == i // 2) & (cc // 2 == i % 2) for i in range(SIZE)])


UNITS = _units()


def constraints_satisfied(g: jax.Array) -> jax.Array:
    """The reference's count: for each unit without a repeated digit, its filled cells - 1 (if > 1)."""
    counts = jnp.stack([jnp.sum(UNITS & (g == d)[None], axis=(1, 2)) for d in range(1, SIZE + 1)], -1)
    n = counts.sum(-1)
    return jnp.sum(jnp.where(jnp.all(counts <= 1, -1) & (n > 1), n - 1, 0))


def _reference_reward(state: State, new_grid, peers, valid, restate, steps):
    """One placement's reward in the reference scheme (module docstring); solved bonuses added by the caller."""
    candidates = sum((~jnp.any(peers & (state.grid == d))).astype(jnp.int32) for d in range(1, SIZE + 1))
    bonus = jnp.where(candidates == 1, 0.2, jnp.where(candidates <= 2, 0.1, 0.0))
    filled = jnp.sum(new_grid > 0)
    gain = constraints_satisfied(new_grid) - constraints_satisfied(state.grid)
    good = (-0.01 + bonus + 0.5 / (SIZE * SIZE) + 0.02 * gain + 0.1 * filled / (SIZE * SIZE)
            + jnp.where(filled < SIZE * SIZE, 0.05, 0.0))
    solved = jnp.all(new_grid == state.solution)
    empties = jnp.sum(state.puzzle == 0)
    return (jnp.where(valid, good, jnp.where(restate, 0.0, -0.3))
            + jnp.where(solved, 2.0 + jnp.where(steps <= empties, 0.5, 0.0), 0.0))


def _step_one(params: Params):
    rr, cc = np.indices((SIZE, SIZE))
    if params.rewards not in ("ours", "reference"):
        raise ValueError(f"sudoku Params.rewards must be 'ours' or 'reference', got {params.rewards!r}")
    reference = params.rewards == "reference"

    def step_one(state: State, action):
        in_range = (action >= 0) & (action < NUM_ACTIONS)
        a = jnp.clip(action, 0, NUM_ACTIONS - 1)
        r, c, digit = a // (SIZE * SIZE), (a // SIZE) % SIZE, a % SIZE + 1
        peers = (rr == r) | (cc == c) | ((rr // 2 == r // 2) & (cc // 2 == c // 2))
        peers &= ~((rr == r) & (cc == c))
        clash = jnp.any(peers & (state.grid == digit))
        given = state.puzzle[r, c]
        old = state.grid[r, c]
        valid = in_range & ~clash & ((given == 0) | (given == digit))
        restate = in_range & (old == digit)
        if reference:  # empty cells only; a restated digit is neither valid nor counted
            valid = in_range & ~clash & (old == 0)
        active = ~state.done & (action != grid.NOOP) & ~(reference & restate)
        new_grid = jnp.where((rr == r) & (cc == c) & valid & active, digit, state.grid)  # no scatter
        sol = state.solution[r, c]
        became = valid & (digit == sol) & (old != sol)
        lost = valid & (digit != sol) & (old == sol)
        steps = state.steps + 1
        solved = jnp.all(new_grid == state.solution)
        timeout = ~solved & (steps >= params.max_steps) & (not reference)
        if reference:
            reward = _reference_reward(state, new_grid, peers, valid, restate, steps)
        else:
            reward = (
                jnp.where(valid, params.r_step, params.r_invalid)
                + jnp.where(became, params.r_correct, 0.0)
                - jnp.where(lost, params.r_correct, 0.0)
                + jnp.where(solved, params.r_solved, 0.0)
                + jnp.where(timeout, params.r_fail, 0.0)
            )
        new = state._replace(  # puzzle and solution never change
            grid=new_grid,
            steps=jnp.where(active, steps, state.steps),
            invalid=state.invalid + (active & ~valid).astype(jnp.int32),
            done=state.done | (active & (solved | timeout)),
            success=state.success | (active & solved),
        )
        return new, jnp.where(active, reward, 0.0).astype(jnp.float32)

    return step_one


def step(state: State, action, params: Params = Params()):
    """Apply one placement or a padded [L] placement array -> (state, reward, done, info)."""
    return grid.apply_actions(_step_one(params), state, action)


# ---------------------------------------------------------------- text


def from_ascii(text: str, params: Params = Params()) -> State:
    """Parse the notation above (all digits are givens; the solution must be unique)."""
    rows = text.split("\n")
    if len(rows) != SIZE or any(len(r) != SIZE for r in rows):
        raise ValueError(f"sudoku puzzle must be 4 lines of 4 characters: {text!r}")
    if any(ch not in ".1234" for row in rows for ch in row):
        raise ValueError(f"sudoku cells are 1-4 or '.': {text!r}")
    puzzle = np.array([[0 if ch == "." else int(ch) for ch in row] for row in rows], np.int32)
    matches = np.all((ALL_GRIDS == puzzle) | (puzzle == 0), axis=(1, 2))
    if matches.sum() != 1:
        raise ValueError(f"sudoku puzzle has {int(matches.sum())} solutions, needs exactly one")
    solution, zero = ALL_GRIDS[np.argmax(matches)], np.int32(0)
    solved = np.bool_((puzzle == solution).all())
    return jax.device_put(State(puzzle, puzzle.copy(), solution, zero, zero, solved, solved))


def render(state: State, which: str = "grid", row_sep: str = "\n") -> str:
    """Current grid (or `which="puzzle"`: the givens) of one unbatched state."""
    cells = np.asarray(state.grid if which == "grid" else state.puzzle)
    return row_sep.join("".join(str(v) if v else "." for v in row) for row in cells)


def status(state: State) -> str:
    """What the rendering leaves implicit: empty cells and which digits are givens."""
    empty = int((np.asarray(state.grid) == 0).sum())
    return f"Empty cells: {empty}. Puzzle givens:\n{render(state, which='puzzle')}"


# ---------------------------------------------------------------- answers (never raise)


def _is_int_row(item, n: int) -> bool:
    return isinstance(item, (list, tuple)) and len(item) == n and all(
        isinstance(x, int) and not isinstance(x, bool) for x in item)


def _placement(r: int, c: int, v: int) -> int:
    if 0 <= r < SIZE and 0 <= c < SIZE and 1 <= v <= SIZE:
        return encode(r, c, v)
    return NUM_ACTIONS  # an invalid placement (penalized by the game)


def parse_list(text: str, max_actions: int) -> list[int] | None:
    """'[[row, col, digit], ...]' or a full grid '[[1,2,3,4], ...]' -> placement codes, or None."""
    value = grid.literal_list(text)
    if not value:
        return None
    if len(value) == SIZE and all(_is_int_row(row, SIZE) for row in value):
        cells = [(r, c, v) for r, row in enumerate(value) for c, v in enumerate(row) if v != 0]
        return [_placement(*cell) for cell in cells][:max_actions]
    return [_placement(*item) if _is_int_row(item, 3) else NUM_ACTIONS for item in value[:max_actions]]


def parse_direct(text: str, max_len: int) -> list[int] | None:
    """One placement written 'rcd' (row, column, digit), e.g. '013'."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    digits = re.sub(r"[\s,]", "", text)
    if not re.fullmatch(r"[0-3][0-3][1-4]", digits):
        return None
    return [encode(int(digits[0]), int(digits[1]), int(digits[2]))]


def show_actions(codes: list[int] | None) -> str:
    if codes is None:
        return "none (nothing parsed)"
    return str([list(decode(a)) if 0 <= a < NUM_ACTIONS else "invalid" for a in codes])


def short(codes: list[int]) -> str:
    return "".join(str(x) for x in decode(codes[0]))


def direct_format(max_len: int) -> str:
    return "1 move rcd"


# ---------------------------------------------------------------- what the workflows need (envs/games.py)

TITLE = "Sudoku"
RULES = (
    "Sudoku 4x4. Fill the grid with digits 1-4 so every row, column and 2x2 box holds each "
    "digit once. '.' is an empty cell; the givens cannot change. Rows and columns are numbered "
    "0-3. A placement is [row, col, digit]."
)
MAX_ACTIONS = 16
TOOL_PENALTY = -1.0  # the tool agent's reward when nothing parses: the reference's Sudoku value (other games -2)
ANSWER_FORMAT = "a list of placements [[row, col, digit], ...] or the full grid [[1,2,3,4], ...]"
GRID_ANSWER_FORMAT = "the whole solved grid, a list of its 4 rows [[1,2,3,4], ...]"  # whole_grid_answer
GRID_ANSWER_EXAMPLE = "[[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]"
ANSWER_EXAMPLE = "[[0, 1, 3], [2, 2, 4]]"
