"""The demo's local view and lenient answers agree with the full grid and the rules."""
import numpy as np
import pytest

from atgrpo_jax.envs.grid_workflows import plan_path_demo
from atgrpo_jax.envs.workflow import take_branch


@pytest.fixture(scope="module")
def wf():
    return plan_path_demo(view="local", lenient=True, plan_len=2, exec_len=2)


def grid_of(wf, state, b):
    import jax
    env = jax.tree.map(lambda x: np.asarray(x)[b], state.env)
    return [list(row) for row in wf.game.render(env).splitlines()]


def expected_view(rows, last):
    (r, c), = [(i, j) for i, row in enumerate(rows) for j, ch in enumerate(row) if ch in "S*"]
    (gr, gc), = [(i, j) for i, row in enumerate(rows) for j, ch in enumerate(row) if ch in "G*"]

    def cell(y, x):
        if not (0 <= y < len(rows) and 0 <= x < len(rows[0])) or rows[y][x] == "#":
            return "#"
        return "G" if rows[y][x] == "G" else "."

    near = f"U{cell(r - 1, c)} D{cell(r + 1, c)} L{cell(r, c - 1)} R{cell(r, c + 1)}"
    return f"G{gr - r:+d}{gc - c:+d} {near} >{last}"


def test_local_view_matches_the_rendered_grid_across_moves(wf):
    rng = np.random.default_rng(0)
    state = wf.reset(np.arange(64), "train")
    last = ["-"] * 64
    for turn in range(3):
        shown = [m[0]["content"] for m in wf.prompts(state, 0, turn)]
        for b in range(64):
            if not wf.done(state)[b]:
                assert shown[b] == expected_view(grid_of(wf, state, b), last[b])
        moves = ["".join(rng.choice(list("UDLR"), 2)) for _ in range(64)]
        out = wf.step(state, 1, turn, [[m] for m in moves])
        state = take_branch(out.state, np.zeros(64, int))
        last = [m[-1] if not d else l for m, l, d in zip(moves, last, wf.done(state))]


@pytest.mark.parametrize("text,moves", [("RD", [3, 1]), ("xR", [3]), ("R", [3]), ("Rx", [3]),
                                        ("UDL", [0, 1]), ("", None), ("zz", None), ("\u00e9U", [0])])
def test_lenient_answers_take_the_move_letters_among_the_first_characters(wf, text, moves):
    assert wf.agents[1].parse(text) == moves


def test_a_random_policy_rarely_succeeds(wf):
    rng = np.random.default_rng(1)
    state = wf.reset(np.arange(64), "test")
    for turn in range(wf.max_turns):
        moves = [["".join(rng.choice(list("UDLR"), 2))] for _ in range(64)]
        state = take_branch(wf.step(state, 1, turn, moves).state, np.zeros(64, int))
    assert wf.success(state).mean() < 0.2
