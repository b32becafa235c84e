"""Plan-Path: walk from a start cell to a goal on a grid with walls (pure JAX).

Notation (one row per line, no separators): `#` wall, `.` free cell, `S` the
agent (its current position), `G` the goal, `*` the agent standing on the
goal. `from_ascii` takes the agent's cell as the start.

Rewards per move (as the reference system): -0.01 for a valid move, -0.1 for an
invalid one (wall, border, unknown action; the agent stays), plus potential
shaping lambda * (gamma * Phi(next) - Phi(current)) with Phi = -Manhattan
distance to the goal (gamma 0.99, lambda 1; an invalid move still pays
(gamma - 1) * Phi); +1 on reaching the goal and +0.5 more when the number of
moves taken (invalid ones included) equals the BFS optimum; -1 and done when
`max_steps` moves pass without reaching the goal. Success: the agent is on the
goal. A done episode ignores further moves (reward 0).

Levels: each cell is a wall with probability `wall_prob`; start and goal are
distinct free cells whose BFS distance lies in [min_distance, max_distance]
(rejection sampling in a `lax.while_loop`); the optimum is a BFS distance
transform from the goal, computed in JAX and stored in the state.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid
from atgrpo_jax.envs.solvers import plan_path_distance


class Params(NamedTuple):
    height: int = 10
    width: int = 10
    wall_prob: float = 0.22
    min_distance: int = 1  # BFS distance bounds of generated start/goal pairs
    max_distance: int = 0  # 0 = no upper bound
    r_step: float = -0.01
    r_invalid: float = -0.1
    r_goal: float = 1.0
    r_optimal: float = 0.5
    r_fail: float = -1.0
    gamma: float = 0.99
    lambda_pot: float = 1.0
    max_steps: int = 10_000
    max_tries: int = 1000  # rejection-sampling cap (never reached in practice)


class State(NamedTuple):
    walls: jax.Array  # bool [H, W]
    pos: jax.Array  # int32 [2], the agent
    goal: jax.Array  # int32 [2]
    start: jax.Array  # int32 [2]
    optimal: jax.Array  # int32, BFS moves from start to goal
    steps: jax.Array  # int32, moves taken (invalid ones included)
    invalid: jax.Array  # int32, invalid moves taken
    done: jax.Array  # bool
    success: jax.Array  # bool


def bfs_distance(walls: jax.Array, target: jax.Array) -> jax.Array:
    """Moves from every cell to `target` (int32 [H, W]); H*W+1 where unreachable."""
    h, w = walls.shape
    inf = h * w + 1
    dist0 = jnp.full((h, w), inf, jnp.int32).at[target[0], target[1]].set(0)
    dist0 = jnp.where(walls, inf, dist0)

    def relax(carry):
        dist, _, it = carry
        pad = jnp.pad(dist, 1, constant_values=inf)
        nbr = jnp.minimum(
            jnp.minimum(pad[:-2, 1:-1], pad[2:, 1:-1]), jnp.minimum(pad[1:-1, :-2], pad[1:-1, 2:])
        )
        new = jnp.where(walls, inf, jnp.minimum(dist, nbr + 1))
        return new, jnp.any(new != dist), it + 1

    dist, _, _ = jax.lax.while_loop(lambda c: c[1] & (c[2] < h * w), relax, (dist0, True, 0))
    return dist


def level_arrays(state: State) -> list:
    """The arrays that identify a level (for the split hash)."""
    return [state.walls, state.start, state.goal]


def _manhattan(a, b):
    return jnp.abs(a[0] - b[0]) + jnp.abs(a[1] - b[1])


def _make_state(walls, start, goal, optimal) -> State:
    zero = jnp.int32(0)
    return State(
        walls=walls,
        pos=start,
        goal=goal,
        start=start,
        optimal=jnp.asarray(optimal, jnp.int32),
        steps=zero,
        invalid=zero,
        done=jnp.bool_(False),
        success=jnp.bool_(False),
    )


def _sample(key, params: Params):
    h, w = params.height, params.width
    u_walls, u_start, u_goal = grid.uniform_parts(key, (h * w, h * w, h * w))
    walls = (u_walls < params.wall_prob).reshape(h, w)
    free = ~walls.ravel()
    start = jnp.argmax(jnp.where(free, u_start, -1.0))  # uniform over free cells
    goal = jnp.argmax(jnp.where(free & (jnp.arange(h * w) != start), u_goal, -1.0))
    start = jnp.stack([start // w, start % w]).astype(jnp.int32)
    goal = jnp.stack([goal // w, goal % w]).astype(jnp.int32)
    optimal = bfs_distance(walls, goal)[start[0], start[1]]
    ok = (free.sum() >= 2) & (optimal <= h * w) & (optimal >= max(params.min_distance, 1))
    if params.max_distance > 0:
        ok &= optimal <= params.max_distance
    return _make_state(walls, start, goal, optimal), ok


def reset(key: jax.Array, params: Params = Params(), split: str | None = None) -> State:
    """A random solvable level; `split` (train, valid, test; None: any) restricts it to that split."""

    def attempt(i):
        state, ok = _sample(jax.random.fold_in(key, i), params)
        return state, ok & grid.split_ok(grid.level_bucket(level_arrays(state)), split)

    def cond(carry):
        i, _, ok = carry
        return ~ok & (i < params.max_tries)

    def body(carry):
        i, _, _ = carry
        state, ok = attempt(i + 1)
        return i + 1, state, ok

    state, ok = attempt(0)
    _, state, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), state, ok))
    return state


def _step_one(params: Params):
    def step_one(state: State, action):
        h, w = state.walls.shape
        delta, is_move = grid.move_delta(action)
        target = state.pos + delta
        valid = is_move & grid.in_bounds(target, h, w) & ~grid.cell(state.walls, target)
        active = ~state.done & (action != grid.NOOP)
        new_pos = jnp.where(valid, target, state.pos)
        phi_old = -_manhattan(state.pos, state.goal).astype(jnp.float32)
        phi_new = -_manhattan(new_pos, state.goal).astype(jnp.float32)
        steps = state.steps + 1
        at_goal = jnp.all(new_pos == state.goal)
        timeout = ~at_goal & (steps >= params.max_steps)
        reward = (
            jnp.where(valid, params.r_step, params.r_invalid)
            + params.lambda_pot * (params.gamma * phi_new - phi_old)
            + jnp.where(at_goal, params.r_goal, 0.0)
            + jnp.where(at_goal & (steps == state.optimal), params.r_optimal, 0.0)
            + jnp.where(timeout, params.r_fail, 0.0)
        )
        new = state._replace(  # walls, goal, start and optimum never change
            pos=jnp.where(active, new_pos, state.pos),
            steps=jnp.where(active, steps, state.steps),
            invalid=state.invalid + (active & ~valid).astype(jnp.int32),
            done=state.done | (active & (at_goal | timeout)),
            success=state.success | (active & at_goal),
        )
        return new, jnp.where(active, reward, 0.0).astype(jnp.float32)

    return step_one


def step(state: State, action, params: Params = Params()):
    """Apply one move or a padded [L] move array -> (state, reward, done, info)."""
    return grid.apply_actions(_step_one(params), state, action)


# ---------------------------------------------------------------- text


def from_ascii(text: str, params: Params = Params()) -> State:
    """Parse the notation above; the grid must be params.height x params.width."""
    rows = text.split("\n")
    if len(rows) != params.height or any(len(r) != params.width for r in rows):
        raise ValueError(f"plan_path level must be {params.height}x{params.width}: {text!r}")
    walls = np.zeros((params.height, params.width), bool)
    agent, goal = [], []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch not in "#.SG*":
                raise ValueError(f"plan_path: unknown cell {ch!r} at ({r}, {c})")
            walls[r, c] = ch == "#"
            if ch in "S*":
                agent.append((r, c))
            if ch in "G*":
                goal.append((r, c))
    if len(agent) != 1 or len(goal) != 1:
        raise ValueError("plan_path level needs exactly one agent (S/*) and one goal (G/*)")
    optimal = plan_path_distance(walls, agent[0], goal[0])  # host BFS: no compile per level
    if optimal is None:
        raise ValueError("plan_path level: the goal is not reachable from the agent")
    start, goal_pos = np.array(agent[0], np.int32), np.array(goal[0], np.int32)
    on_goal, zero = np.bool_(agent[0] == goal[0]), np.int32(0)
    return jax.device_put(State(walls, start, goal_pos, start, np.int32(optimal), zero, zero, on_goal, on_goal))


def status(state: State) -> str:
    """One line of facts that the rendering leaves implicit."""
    pos, goal = np.asarray(state.pos).tolist(), np.asarray(state.goal).tolist()
    return f"You are at (row {pos[0]}, col {pos[1]}); the goal is at (row {goal[0]}, col {goal[1]})."


def local_view(state: State, last_move: str = "-") -> str:
    """Plan-Path seen from the agent: goal offset, the four neighbours, the last move.

    'G+0-1 U# D. LG R. >R' = the goal is 1 column left; up is a wall or the
    edge, down and right are free, left is the goal; the last move played was
    R ('-' before the first).
    """
    walls, (r, c), (gr, gc) = np.asarray(state.walls), np.asarray(state.pos).tolist(), np.asarray(state.goal).tolist()
    h, w = walls.shape

    def cell(dr, dc):
        y, x = r + dr, c + dc
        if not (0 <= y < h and 0 <= x < w) or walls[y, x]:
            return "#"
        return "G" if (y, x) == (gr, gc) else "."

    near = " ".join(f"{name}{cell(dr, dc)}" for name, (dr, dc) in zip("UDLR", ((-1, 0), (1, 0), (0, -1), (0, 1))))
    return f"G{gr - r:+d}{gc - c:+d} {near} >{last_move}"


def render(state: State, row_sep: str = "\n") -> str:
    """The notation above for one (unbatched) state."""
    walls = np.asarray(state.walls)
    pos, goal = tuple(np.asarray(state.pos).tolist()), tuple(np.asarray(state.goal).tolist())
    rows = []
    for r in range(walls.shape[0]):
        chars = []
        for c in range(walls.shape[1]):
            if (r, c) == pos:
                chars.append("*" if pos == goal else "S")
            elif (r, c) == goal:
                chars.append("G")
            else:
                chars.append("#" if walls[r, c] else ".")
        rows.append("".join(chars))
    return row_sep.join(rows)


def static_view(state: State) -> str:
    """The reference's observation (recipe "reference"): the walls alone, then the level's start and goal
    as (row, col); where the walker is now is never shown."""
    walls = np.asarray(state.walls)
    grid_text = "\n".join("".join("#" if w else "." for w in row) for row in walls)
    start, goal = tuple(np.asarray(state.start).tolist()), tuple(np.asarray(state.goal).tolist())
    return f"Grid ('.' free, '#' blocked):\n```\n{grid_text}\n```\nStart: {start},  Goal: {goal}\n"


# ---------------------------------------------------------------- what the workflows need (envs/games.py)

TITLE = "Path S to G, # wall"
RULES = (
    "Path planning on a grid. Legend: '#' wall, '.' free cell, 'S' you, 'G' goal "
    "('*' you on the goal). Rows are numbered from 0 at the top, columns from 0 at the left.\n"
    "Moves: 'U' (row - 1), 'D' (row + 1), 'L' (col - 1), 'R' (col + 1). A move into a wall "
    "or off the grid is wasted. Reach G; a shortest path earns a bonus."
)
MAX_ACTIONS = 64
ANSWER_FORMAT, ANSWER_EXAMPLE = grid.MOVES_ANSWER_FORMAT, grid.MOVES_EXAMPLE
parse_list, parse_direct, parse_lenient = grid.moves_from_list_text, grid.direct_moves, grid.lenient_moves
show_actions, short, direct_format = grid.show_moves, grid.letters_of, grid.direct_moves_format
