"""A toy grid game for the test that adding a game takes one module and one registry line:
walk right along a corridor of `length` cells to its end ('R' moves, 'L' goes back, U/D bump)."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid


class Params(NamedTuple):
    length: int = 5


class State(NamedTuple):
    pos: jax.Array  # int32
    start: jax.Array  # int32
    steps: jax.Array
    invalid: jax.Array
    done: jax.Array
    success: jax.Array


def reset(key, params: Params = Params(), split=None) -> State:
    start = jax.random.randint(key, (), 0, params.length - 1)
    z = jnp.int32(0)
    return State(start, start, z, z, jnp.bool_(False), jnp.bool_(False))


def level_arrays(state):
    return [state.start]


def step(state, actions, params: Params = Params()):
    def step_one(s, a):
        delta = jnp.where(a == grid.RIGHT, 1, jnp.where(a == grid.LEFT, -1, 0))
        valid = (delta != 0) & (s.pos + delta >= 0) & (s.pos + delta < params.length)
        active = ~s.done & (a != grid.NOOP)
        pos = jnp.where(valid & active, s.pos + delta, s.pos)
        won = pos == params.length - 1
        new = s._replace(pos=pos, steps=s.steps + active, invalid=s.invalid + (active & ~valid),
                         done=s.done | (active & won), success=s.success | (active & won))
        return new, jnp.where(active, jnp.where(won, 1.0, -0.01), 0.0).astype(jnp.float32)
    return grid.apply_actions(step_one, state, actions)


def render(state, row_sep="\n"):
    cells = ["." for _ in range(int(np.asarray(state.pos)) + 1)]
    return "".join(cells[:-1]) + "@"


def status(state):
    return f"You are at cell {int(np.asarray(state.pos))}."


TITLE, RULES, MAX_ACTIONS = "Corridor", "Walk right ('R') to the last cell of the corridor.", 8
ANSWER_FORMAT, ANSWER_EXAMPLE = grid.MOVES_ANSWER_FORMAT, grid.MOVES_EXAMPLE
parse_list, parse_direct = grid.moves_from_list_text, grid.direct_moves
show_actions, short, direct_format = grid.show_moves, grid.letters_of, grid.direct_moves_format
