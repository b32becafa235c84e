"""Grid roles' answer parsers (envs/grid_roles.py) on hostile and fuzzed text."""
import os
import sys

from atgrpo_jax.envs import grid_roles
from atgrpo_jax.envs.games import make_game

sys.path.insert(0, os.path.dirname(__file__))  # grid_helpers (importlib import mode)
from grid_helpers import EXPECTED, HOSTILE, fuzz_strings  # noqa: E402


def test_hostile_plan_answers_parse_as_documented():
    game = make_game("plan_path")
    for name, text in HOSTILE.items():
        assert grid_roles.actions_from_answer(text, game) == EXPECTED[name], name


def test_fuzz_parsers_never_raise():
    from atgrpo_jax.envs.parsers import extract_code_block

    games = [make_game(name) for name in ("plan_path", "sokoban", "sudoku")]
    texts = fuzz_strings(3000, seed=0)
    for text in texts:
        extract_code_block(text)
        for game in games:
            for parsed in (grid_roles.actions_from_answer(text, game), grid_roles.actions_from_output(text, game),
                           game.parse_direct(text, 4), game.parse_list(text)):
                assert parsed is None or (isinstance(parsed, list) and all(isinstance(a, int) for a in parsed))
