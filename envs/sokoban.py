"""Sokoban: push every box onto a goal (pure JAX; XSB notation).

XSB: `#` wall, `@` player, `+` player on goal, `$` box, `*` box on goal, `.`
goal, space floor; one row per line. Boxes, goals and walls are boolean grids,
so any box count fits one state shape (6x6 one box by default; Boxoban 10x10
four-box levels load with `BOXOBAN`).

Rewards per move (as the reference system): -0.01 for a valid move, -0.05 for
an invalid one (wall, border, blocked push, unknown action; nothing moves);
+1 when a push puts a box onto a goal, -0.5 when it takes one off; shaping
lambda * (gamma * Phi(next) - Phi(current)) with lambda 0.1, gamma 0.99 and Phi
= -(sum over boxes of the Manhattan distance to the nearest goal) -- only box
positions are shaped, not the player's; +10 and done when every box is on a
goal (success); -5 and done when `max_steps` moves pass unsolved. A done
episode ignores further moves (reward 0).

Levels come from reverse play: carve a room by a random walk of
`room_walk_steps` (25) steps, put the boxes on their goals (solved) and the
player on a free cell, then walk the player backwards `reverse_steps` (25)
times, pulling a box that is right behind it with probability `p_pull`. Every
reverse move undoes a legal forward move, so every level is solvable.
`reverse_walks` such walks run from the same start; the state with the largest
total box-to-own-goal distance, every box at least `min_box_distance` (2) from
its goal, is kept, and the player then strolls a few steps without pulling so
it does not always start next to a box. Rooms where no walk gets there are
rejected and redrawn.
"""
from __future__ import annotations

import importlib.resources
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid


class Params(NamedTuple):
    height: int = 6
    width: int = 6
    num_boxes: int = 1
    reverse_steps: int = 25
    reverse_walks: int = 32  # independent reverse walks; the best state of all is kept
    min_box_distance: int = 2
    p_pull: float = 1.0
    p_change_direction: float = 0.35
    room_walk_steps: int = 25  # steps of the random walk that carves the room
    player_walk_steps: int = 3
    r_step: float = -0.01
    r_invalid: float = -0.05
    r_box_on_goal: float = 1.0
    r_box_off_goal: float = -0.5
    r_win: float = 10.0
    r_fail: float = -5.0
    gamma: float = 0.99
    lambda_pot: float = 0.1
    max_steps: int = 200
    max_tries: int = 200  # rejection-sampling cap (see reset)


BOXOBAN = Params(height=10, width=10, num_boxes=4)
BOXOBAN_FILES = {
    "unfiltered_test": "boxoban_unfiltered_test_000.txt",
    "medium_valid": "boxoban_medium_valid_000.txt",
}


class State(NamedTuple):
    walls: jax.Array  # bool [H, W]
    goals: jax.Array  # bool [H, W]
    boxes: jax.Array  # bool [H, W]
    player: jax.Array  # int32 [2]
    goal_dist: jax.Array  # int32 [H, W], Manhattan distance to the nearest goal (fixed per level)
    steps: jax.Array  # int32
    invalid: jax.Array  # int32
    done: jax.Array  # bool
    success: jax.Array  # bool


def level_arrays(state: State) -> list:
    return [state.walls, state.goals, state.boxes, state.player]


def goal_distance(goals, xp=jnp):
    """Manhattan distance from every cell to its nearest goal (0 everywhere if no goal)."""
    h, w = goals.shape
    rr, cc = np.indices((h, w)).reshape(2, -1)
    d = np.abs(rr[:, None] - rr[None]) + np.abs(cc[:, None] - cc[None])
    d = xp.min(xp.where(goals.reshape(-1)[None], d, h * w * 4), axis=1)
    return xp.where(xp.any(goals), d, 0).reshape(h, w).astype(xp.int32)


def _make_state(walls, goals, boxes, player, xp=jnp) -> State:
    zero = xp.int32(0)
    solved = ~xp.any(boxes & ~goals)
    return State(walls, goals, boxes, xp.asarray(player, xp.int32), goal_distance(goals, xp), zero, zero,
                 solved, solved)


def _step_one(params: Params):
    def step_one(state: State, action):
        h, w = state.walls.shape
        delta, is_move = grid.move_delta(action)
        target, beyond = state.player + delta, state.player + 2 * delta
        t_in, b_in = grid.in_bounds(target, h, w), grid.in_bounds(beyond, h, w)
        layers = (state.walls, state.boxes, state.goals, state.goal_dist)
        wall_t, box_t, goal_t, dist_t = (grid.cell(x, target) for x in layers)
        wall_b, box_b, goal_b, dist_b = (grid.cell(x, beyond) for x in layers)
        pushing = t_in & box_t
        valid = is_move & t_in & ~wall_t & (~pushing | (b_in & ~wall_b & ~box_b))
        push = valid & pushing
        active = ~state.done & (action != grid.NOOP)
        # Only a push changes the boxes: one masked update of the grid, no scatter.
        rr, cc = np.indices((h, w))
        moved = (state.boxes & ~((rr == target[0]) & (cc == target[1]))) | ((rr == beyond[0]) & (cc == beyond[1]))
        boxes = jnp.where(push & active, moved, state.boxes)
        onto = push & ~goal_t & goal_b
        off = push & goal_t & ~goal_b
        phi_old = -jnp.sum(jnp.where(state.boxes, state.goal_dist, 0)).astype(jnp.float32)
        phi_new = phi_old - jnp.where(push, dist_b - dist_t, 0).astype(jnp.float32)
        steps = state.steps + 1
        won = ~jnp.any(boxes & ~state.goals)
        timeout = ~won & (steps >= params.max_steps)
        reward = (
            jnp.where(valid, params.r_step, params.r_invalid)
            + jnp.where(onto, params.r_box_on_goal, 0.0)
            + jnp.where(off, params.r_box_off_goal, 0.0)
            + params.lambda_pot * (params.gamma * phi_new - phi_old)
            + jnp.where(won, params.r_win, 0.0)
            + jnp.where(timeout, params.r_fail, 0.0)
        )
        new = state._replace(
            boxes=boxes,
            player=jnp.where(valid & active, target, state.player),
            steps=jnp.where(active, steps, state.steps),
            invalid=state.invalid + (active & ~valid).astype(jnp.int32),
            done=state.done | (active & (won | timeout)),
            success=state.success | (active & won),
        )
        return new, jnp.where(active, reward, 0.0).astype(jnp.float32)

    return step_one


def step(state: State, action, params: Params = Params()):
    """Apply one move or a padded [L] move array -> (state, reward, done, info)."""
    return grid.apply_actions(_step_one(params), state, action)


# ---------------------------------------------------------------- generation

# 3x3 carving stamps centred on the walker: a cell, pairs, an L and a square.
_STAMPS = np.array(
    [
        [[0, 0, 0], [0, 1, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 0, 0]],
        [[0, 0, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 1]],
    ],
    dtype=bool,
)


def _carve_room(u_pos, u_walk, params: Params):
    """Floor mask from a random walk inside the border (the border stays wall)."""
    h, w = params.height, params.width
    pos0 = 1 + grid.randint_from(u_pos, jnp.array([h - 2, w - 2]))
    dirs = grid.randint_from(u_walk[:, 0], 4)
    change = u_walk[:, 1] < params.p_change_direction
    stamps = grid.randint_from(u_walk[:, 2], len(_STAMPS))
    rr, cc = jnp.meshgrid(jnp.arange(h), jnp.arange(w), indexing="ij")
    interior = (rr > 0) & (rr < h - 1) & (cc > 0) & (cc < w - 1)

    def stamp(floor, pos, s):
        dr, dc = rr - pos[0] + 1, cc - pos[1] + 1
        inside = (dr >= 0) & (dr < 3) & (dc >= 0) & (dc < 3)
        mark = jnp.asarray(_STAMPS)[s][jnp.clip(dr, 0, 2), jnp.clip(dc, 0, 2)]
        return floor | (inside & mark & interior)

    def walk(carry, xs):
        floor, pos, d = carry
        new_d, ch, s = xs
        d = jnp.where(ch, new_d, d)
        pos = jnp.clip(pos + jnp.asarray(grid.DELTAS)[d], 1, jnp.array([h - 2, w - 2]))
        return (stamp(floor, pos, s), pos, d), None

    floor0 = stamp(jnp.zeros((h, w), bool), pos0, 0)
    (floor, _, _), _ = jax.lax.scan(walk, (floor0, pos0, dirs[0]), (dirs, change, stamps))
    return floor


def _reverse_play(u_play, u_stroll, floor, goal_pos, player, params: Params):
    """Pull boxes backwards from their goals; keep the most scrambled valid state."""
    h, w = floor.shape

    def reverse_move(player, boxes, a, may_pull):
        d = jnp.asarray(grid.DELTAS)[a]
        target, behind = player + d, player - d
        free = grid.in_bounds(target, h, w) & grid.cell(floor, target)
        free &= ~jnp.any(jnp.all(boxes == target, axis=1))
        hit = jnp.all(boxes == behind, axis=1)
        pull = free & may_pull & jnp.any(hit)
        boxes = jnp.where((hit & pull)[:, None], player, boxes)
        return jnp.where(free, target, player), boxes

    def walk(carry, u):
        player, boxes, best = carry
        player, boxes = reverse_move(player, boxes, grid.randint_from(u[0], 4), u[1] < params.p_pull)
        dist = jnp.abs(boxes - goal_pos).sum(axis=1)
        score = dist.sum()
        better = jnp.all(dist >= params.min_box_distance) & (score >= best[2])
        best = jax.tree.map(lambda x, y: jnp.where(better, x, y), (player, boxes, score), best)
        return (player, boxes, best), None

    def one_walk(u_walk):
        best0 = (player, goal_pos, jnp.int32(-1))
        (_, _, best), _ = jax.lax.scan(walk, (player, goal_pos, best0), u_walk)
        return best

    # Several independent walks; keep the best state of all (a cheap stand-in
    # for the exhaustive reverse search of gym-sokoban style generators).
    walks = jax.vmap(one_walk)(u_play)
    pick = jnp.argmax(walks[2])
    player, boxes, score = jax.tree.map(lambda x: x[pick], walks)

    def stroll(carry, u):  # moves without pulling keep the level solvable
        return reverse_move(*carry, grid.randint_from(u, 4), False), None

    (player, boxes), _ = jax.lax.scan(stroll, (player, boxes), u_stroll)
    return player, boxes, score >= 0


def _sample(key, params: Params):
    h, w, n = params.height, params.width, params.num_boxes
    n_walk = params.room_walk_steps
    n_play = params.reverse_walks * params.reverse_steps * 2
    sizes = (2, 3 * n_walk, h * w, n_play, params.player_walk_steps)
    u_pos, u_walk, u_place, u_play, u_stroll = grid.uniform_parts(key, sizes)
    floor = _carve_room(u_pos, u_walk.reshape(n_walk, 3), params)
    _, cells = jax.lax.top_k(jnp.where(floor.ravel(), u_place, -1.0), n + 1)
    coords = jnp.stack([cells // w, cells % w], axis=1).astype(jnp.int32)
    goal_pos, player = coords[:n], coords[n]
    player, box_pos, found = _reverse_play(
        u_play.reshape(params.reverse_walks, params.reverse_steps, 2), u_stroll, floor, goal_pos, player, params
    )
    goals = jnp.zeros((h, w), bool).at[goal_pos[:, 0], goal_pos[:, 1]].set(True)
    boxes = jnp.zeros((h, w), bool).at[box_pos[:, 0], box_pos[:, 1]].set(True)
    ok = (floor.sum() >= n + 1) & found
    return _make_state(~floor, goals, boxes, player), ok


def reset(key: jax.Array, params: Params = Params(), split: str | None = None) -> State:
    """A solvable level by reverse play; `split` (train, valid, test; None: any) picks that split.

    Tries new keys until every box is at least min_box_distance from its goal
    (and the split matches); after max_tries the last try is returned, which is
    still solvable (the default 6x6 one-box setting never gets there in tests).
    """

    def attempt(i):
        state, ok = _sample(jax.random.fold_in(key, i), params)
        return state, ok & grid.split_ok(grid.level_bucket(level_arrays(state)), split)

    def body(carry):
        i, _, _ = carry
        state, ok = attempt(i + 1)
        return i + 1, state, ok

    state, ok = attempt(0)
    cond = lambda c: ~c[2] & (c[0] < params.max_tries)  # noqa: E731
    _, state, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), state, ok))
    return state


# ---------------------------------------------------------------- text

_XSB = {"#": (1, 0, 0, 0), " ": (0, 0, 0, 0), ".": (0, 1, 0, 0), "$": (0, 0, 1, 0),
        "*": (0, 1, 1, 0), "@": (0, 0, 0, 1), "+": (0, 1, 0, 1)}  # wall, goal, box, player


def from_ascii(text: str, params: Params = Params()) -> State:
    """Parse an XSB level of exactly params.height x params.width cells."""
    rows = text.split("\n")
    if len(rows) != params.height or any(len(r) != params.width for r in rows):
        raise ValueError(f"sokoban level must be {params.height}x{params.width}: {text!r}")
    cells = np.zeros((params.height, params.width, 4), bool)
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch not in _XSB:
                raise ValueError(f"sokoban: unknown cell {ch!r} at ({r}, {c})")
            cells[r, c] = _XSB[ch]
    players = np.argwhere(cells[..., 3])
    if len(players) != 1:
        raise ValueError(f"sokoban level needs exactly one player, found {len(players)}")
    return jax.device_put(_make_state(cells[..., 0], cells[..., 1], cells[..., 2], players[0], xp=np))


def render(state: State, row_sep: str = "\n") -> str:
    """XSB text of one (unbatched) state."""
    walls, goals, boxes = (np.asarray(x) for x in (state.walls, state.goals, state.boxes))
    player = tuple(np.asarray(state.player).tolist())
    rows = []
    for r in range(walls.shape[0]):
        chars = []
        for c in range(walls.shape[1]):
            if walls[r, c]:
                chars.append("#")
            elif (r, c) == player:
                chars.append("+" if goals[r, c] else "@")
            elif boxes[r, c]:
                chars.append("*" if goals[r, c] else "$")
            else:
                chars.append("." if goals[r, c] else " ")
        rows.append("".join(chars))
    return row_sep.join(rows)


def status(state: State) -> str:
    """One line of facts that the rendering leaves implicit."""
    boxes, goals = np.asarray(state.boxes), np.asarray(state.goals)
    return f"Boxes on goals: {int((boxes & goals).sum())}/{int(boxes.sum())}."


def load_boxoban(which: str = "medium_valid") -> list[str]:
    """The 1000 levels of a shipped Boxoban file, each as 10 XSB lines (no header)."""
    if which not in BOXOBAN_FILES:
        raise ValueError(f"unknown Boxoban file {which!r}; choose from {sorted(BOXOBAN_FILES)}")
    text = importlib.resources.files("atgrpo_jax.envs").joinpath("data", BOXOBAN_FILES[which]).read_text()
    levels, current = [], []
    for line in text.split("\n"):
        if line.startswith(";"):
            current = []
        elif line == "" and current:
            levels.append("\n".join(current))
            current = []
        elif line:
            current.append(line)
    if current:
        levels.append("\n".join(current))
    return levels


# ---------------------------------------------------------------- what the workflows need (envs/games.py)

TITLE = "Sokoban"
RULES = (
    "Sokoban. Legend: '#' wall, ' ' floor, '.' goal, '$' box, '*' box on goal, '@' you, "
    "'+' you on a goal. Rows are numbered from 0 at the top.\n"
    "Moves: 'U', 'D', 'L', 'R'. Walking into a box pushes it one cell if the cell behind it "
    "is free (not a wall or box); boxes cannot be pulled. Put every box on a goal; "
    "avoid pushing a box into a corner that is not a goal."
)
MAX_ACTIONS = 100
ANSWER_FORMAT, ANSWER_EXAMPLE = grid.MOVES_ANSWER_FORMAT, grid.MOVES_EXAMPLE
parse_list, parse_direct, parse_lenient = grid.moves_from_list_text, grid.direct_moves, grid.lenient_moves
show_actions, short, direct_format = grid.show_moves, grid.letters_of, grid.direct_moves_format
