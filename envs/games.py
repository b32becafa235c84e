"""Grid games by name. Each game is one module that owns its rules; adding a game is one
module and one `GAMES.register` line below (its workflows then exist by name, e.g.
`<game>_direct`, `<game>_tool_plan`: see envs/workflow_registry.py).

A game module provides:
  Params, State                        NamedTuples: static settings; one level's arrays
  reset(key, params, split) -> State  a random solvable level of split train, valid or test (grid.split_ok)
  step(state, actions, params)         -> (state, reward, done, info); jittable, vmappable
  level_arrays(state) -> list          the arrays that identify a level (hashed for the split)
  render(state, row_sep="\\n") -> str   the board in the game's notation
  status(state) -> str                 facts the rendering leaves implicit
  TITLE, RULES                         a title for one-line prompts; the task for long prompts
  ANSWER_FORMAT, ANSWER_EXAMPLE        how an action list is written (tool output, plan answer)
  MAX_ACTIONS                          default padded length of one answer's action array
  parse_list(text, max_actions)        a bracketed action list -> int action codes, or None
  parse_direct(text, max_len)          a short direct answer -> action codes, or None
  direct_format(max_len) -> str        what a direct answer looks like ("1-2 moves UDLR")
  show_actions(codes) -> str           codes as the model writes them
  short(codes) -> str                  a direct answer, compactly (what a planner hands over)
and, optionally, local_view(state, last_move) -> str (the agent's surroundings only) and
TOOL_PENALTY (the tool agent's reward when nothing parses; default -2).
Parsers never raise; they return None when nothing parses.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from atgrpo_jax.envs import plan_path, sokoban, sudoku
from atgrpo_jax.registry import Registry

GAMES: Registry = Registry("game")
GAMES.register("plan_path", plan_path)
GAMES.register("sokoban", sokoban)
GAMES.register("sudoku", sudoku)


@dataclasses.dataclass(frozen=True)
class GridGame:
    """A game with its settings: what the grid workflows play (hashable: jitted steps are
    cached per game)."""

    name: str
    params: Any
    max_actions: int  # padded length of one answer's action array

    @property
    def module(self):
        return GAMES[self.name]

    def render(self, state: Any, row_sep: str = "\n") -> str:
        return self.module.render(state, row_sep=row_sep)

    def parse_list(self, text: str) -> list[int] | None:
        return self.module.parse_list(text, self.max_actions) if isinstance(text, str) else None

    def parse_direct(self, text: str, max_len: int) -> list[int] | None:
        return self.module.parse_direct(text, max_len) if isinstance(text, str) else None

    def show_actions(self, codes: list[int] | None) -> str:
        return self.module.show_actions(codes)


def make_game(name: str, params: Any = None, max_actions: int | None = None) -> GridGame:
    """The game `name` with its default params and answer length unless given."""
    module = GAMES[name]
    if hasattr(params, "to_dict"):  # a ConfigDict from env.kwargs
        params = params.to_dict()
    if isinstance(params, dict):  # fields of the game's Params (configs write them as a dict)
        params = module.Params(**params)
    return GridGame(name, module.Params() if params is None else params, max_actions or module.MAX_ACTIONS)
