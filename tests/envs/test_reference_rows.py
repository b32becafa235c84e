"""recipe = "reference" against "paper" on the reference's own inputs, one switch at a time: the plan agent's
answer and the tool agent's output (rows 3, 3b, 4), math grading (row 10) and the code evaluation set
(row 13) of docs/paper.md, "Recipes". Each test feeds the same strings to both recipes and asserts both
outcomes, then flips the one switch back alone."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from atgrpo_jax.envs.code_workflow import CodeWorkflow
from atgrpo_jax.envs.grid import INVALID
from atgrpo_jax.envs.grid_roles import FORMAT_PENALTY, FormatError, actions_from_output, reference_tool_actions
from atgrpo_jax.envs.math_grading import grade, verify_as_written
from atgrpo_jax.envs.math_workflow import MathWorkflow
from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.envs.sandbox import Limits
from atgrpo_jax.envs.workflow import take_branch

RECIPES = ("paper", "reference")
U, D, L, R = 0, 1, 2, 3
FAST = Limits(wall_s=5.0, cpu_s=5.0, memory_mb=512)


def grid(recipe: str, game: str = "plan_path", **switches):
    # seed 1: jitted steps of their own (test_grid_workflows.py counts the compiled variants of seed 0's)
    return make_workflow(f"{game}_tool_plan", recipe=recipe, sandbox_limits=FAST, sandbox_workers=2, seed=1,
                         **switches)


def plan_step(wf, answer: str):
    """The plan agent (agent 1) answering `answer` on test level 0: (its reward local + team, the new state)."""
    state = wf.reset([0], "test")
    out = wf.step(state, 1, 0, [[answer]])
    return float(out.local_reward[0, 0] + out.team_reward[0, 0]), state, out


def played(wf, state, moves) -> float:
    """The game's own reward for `moves` on the level (its step called directly, no workflow)."""
    env = jax.tree.map(lambda x: x[0], state.env)
    padded = jnp.full(max(len(moves), 1), -1, jnp.int32).at[:len(moves)].set(jnp.asarray(moves, jnp.int32))
    return float(wf.game.module.step(env, padded, wf.game.params)[1])


# ---------------------------------------------------------------- row 3: a plan answer the step cannot read


@pytest.mark.parametrize("answer,paper_moves,items", [
    ("#### [1, 2]", [INVALID, INVALID], [1, 2]),
    ('#### ["U", 1]', [U, INVALID], ["U", 1]),
    ("#### [true]", [INVALID], [True]),
    ('#### [["U"]]', [INVALID], [["U"]]),
])
def test_row_3_a_list_of_non_moves_is_a_format_error_under_the_reference(answer, paper_moves, items):
    """The reference's plan agent keeps the game step's -1 as its own reward and its reward adds the
    environment's -1 (local -1, team -1), where an answer that does not parse is -2 and 0."""
    paper, reference = grid("paper"), grid("reference")
    assert paper._parse(paper.roles[1], answer) == paper_moves
    assert reference._parse(reference.roles[1], answer) == FormatError(items)
    paper_reward, state, paper_out = plan_step(paper, answer)
    step_reward = played(paper, state, paper_moves)
    assert float(paper_out.local_reward[0, 0]) == pytest.approx(step_reward)  # played: the step's reward, twice
    assert float(paper_out.team_reward[0, 0]) == pytest.approx(step_reward)
    assert paper_reward == pytest.approx(2 * step_reward)
    reference_reward, _, reference_out = plan_step(reference, answer)
    assert float(reference_out.local_reward[0, 0]) == FORMAT_PENALTY == -1.0  # the format
    assert float(reference_out.team_reward[0, 0]) == FORMAT_PENALTY  # the step's reward: the team's
    assert reference_reward == -2.0
    assert float(reference_out.state.last_reward[0, 0]) == FORMAT_PENALTY  # what the next tool agent's team sees
    assert str(reference_out.parsed_as[0, 0]) == "unparsed: a list the game cannot read as actions"
    start = np.asarray(state.env.pos[0])
    np.testing.assert_array_equal(np.asarray(reference_out.state.env.pos[0, 0]), start)  # nothing moved
    _, _, unparsed = plan_step(reference, "#### U R D")  # no answer at all: -2 local, the empty step's 0 team
    assert (float(unparsed.local_reward[0, 0]), float(unparsed.team_reward[0, 0])) == (-2.0, 0.0)
    flipped = grid("reference", format_errors=False)  # the one switch back: items read as invalid moves
    assert flipped._parse(flipped.roles[1], answer) == paper_moves
    _, _, flipped_out = plan_step(flipped, answer)
    assert float(flipped_out.local_reward[0, 0]) == pytest.approx(step_reward)
    assert float(flipped_out.team_reward[0, 0]) == pytest.approx(step_reward)
    on_paper = grid("paper", format_errors=True)  # the switch alone on the paper's answer parser
    assert on_paper._parse(on_paper.roles[1], answer) == FormatError(items)


def test_row_3_two_answer_lines_play_the_first_under_the_reference():
    """The reference's pattern captures from the first `#### ` to the end; Python's literal_eval (3.9 to
    3.13, the reference runs 3.12) reads the second `####` line as a comment, so the first list counts."""
    answer = '#### ["U"]\n#### ["R","D"]'
    assert grid("reference")._parse(grid("reference").roles[1], answer) == [U]
    assert grid("paper")._parse(grid("paper").roles[1], answer) == [R, D]  # the paper's: the last `####` line


def test_row_3b_a_70_move_answer_plays_every_move_under_the_reference():
    moves = ["U", "D"] * 35
    answer = "#### " + str(moves).replace("'", '"')
    codes = [U, D] * 35
    paper, reference = grid("paper"), grid("reference")
    assert paper.game.max_actions == 64
    assert paper._parse(paper.roles[1], answer) == codes[:64]
    assert reference._parse(reference.roles[1], answer) == codes
    paper_reward, state, _ = plan_step(paper, answer)
    reference_reward, _, out = plan_step(reference, answer)
    assert paper_reward == pytest.approx(2 * played(paper, state, codes[:64]), abs=1e-5)
    assert reference_reward == pytest.approx(2 * played(reference, state, codes), abs=1e-5)
    assert reference_reward != pytest.approx(paper_reward)
    assert int(out.state.env.steps[0, 0]) - int(state.env.steps[0]) == 70  # every move counted
    flipped = grid("reference", uncut_answers=False)
    assert flipped._parse(flipped.roles[1], answer) == codes[:64]


# ---------------------------------------------------------------- row 4: what the tool agent's output gives


def test_row_4_sokoban_numbers_are_a_format_error_and_a_sudoku_empty_list_parses_under_the_reference():
    paper, reference = grid("paper", "sokoban"), grid("reference", "sokoban")
    output = "**Actions List**: [1, 2]\n"
    assert actions_from_output(output, paper.parse_game, paper.config.format_errors) == [INVALID, INVALID]
    got = reference_tool_actions(output, reference.parse_game, reference.config.format_errors)
    assert got == FormatError([1, 2])
    flipped = grid("reference", "sokoban", format_errors=False)
    assert reference_tool_actions(output, flipped.parse_game, flipped.config.format_errors) == [INVALID, INVALID]
    sudoku = grid("reference", "sudoku")
    assert reference_tool_actions("**Actions List**: []\n", sudoku.parse_game, sudoku.config.format_errors) == []
    assert reference_tool_actions("Actions: []\n", sudoku.parse_game) is None  # only the marked line takes []
    # the marked line's non-greedy `\[.*?\]` stops at the first `]`: a nested list there never parses, a bare
    # line of one is read, and one that is neither a grid nor triples is a format error
    assert reference_tool_actions("**Actions List**: [[0, 1, 2]]\n", sudoku.parse_game, True) is None
    assert reference_tool_actions("[[0, 1]]\n", sudoku.parse_game, True) == FormatError([[0, 1]])


@pytest.mark.full  # sandbox runs and two games' compiles; the parsers above keep row 4 in the default tier
def test_row_4_the_tool_agents_reward_for_a_format_error_and_an_empty_sudoku_list():
    program = "```python\nprint('**Actions List**: [1, 2]')\n```"
    rewards = {}
    for recipe in RECIPES:
        wf = grid(recipe, "sokoban")
        state = wf.reset([0], "test")
        out = wf.step(state, 0, 0, [[program]])
        rewards[recipe] = float(out.local_reward[0, 0])
        if recipe == "paper":
            assert rewards[recipe] == pytest.approx(played(wf, state, [INVALID, INVALID]))
    assert rewards["reference"] == FORMAT_PENALTY
    empty = "```python\nprint('**Actions List**: []')\n```"
    for recipe in RECIPES:
        wf = grid(recipe, "sudoku")
        assert float(wf.step(wf.reset([0], "test"), 0, 0, [[empty]]).local_reward[0, 0]) == 0.0


# ---------------------------------------------------------------- row 10: math grading


PAIRS = [("\\frac{1}{2}", "\\dfrac{1}{2}"), ("(1,2)", "(1,2)"), ("2\\sqrt{3}", "2\\sqrt{3}"),
         ("\\text{(A)}", "A"), ("3, 5", "5, 3"), ("\\pi/2", "\\frac{\\pi}{2}")]


@pytest.mark.parametrize("answer,truth", PAIRS)
def test_row_10_the_ground_truth_as_written_under_the_reference(answer, truth):
    reply = f"So the answer is \\boxed{{{answer}}}."
    assert grade(answer, truth)  # the paper's: the truth in `$` and a normalizing fallback
    assert not verify_as_written(reply, truth)  # the reference's verify(parse(reply), parse(truth))
    assert verify_as_written(reply, f"${truth}$")  # the same truth wrapped matches: the wrapping is the difference


def test_row_10_the_reasoners_reward_under_both_recipes():
    replies = [f"\\boxed{{{answer}}}" for answer, _ in PAIRS]
    got = {}
    for recipe, switches in (("paper", {}), ("reference", {}), ("reference", {"verify_as_written": False})):
        wf = MathWorkflow(test_sets=("aime24",), limits=FAST, max_workers=2, recipe=recipe, **switches)
        state = wf.reset([0] * len(PAIRS), "aime24")
        state["reference"][:] = [truth for _, truth in PAIRS]
        got[recipe, bool(switches)] = wf.step(state, 0, 0, [[r] for r in replies]).local_reward[:, 0].tolist()
    assert got["paper", False] == [1.0] * 6
    assert got["reference", False] == [0.0] * 6
    assert got["reference", True] == [1.0] * 6  # the one switch back


def test_row_11_a_failing_programs_traceback_is_parsed_for_an_answer_under_the_reference():
    """The reference parses a failing program's "error: ..." output like any other: a traceback's "line 3"
    verifies against a ground truth of 3."""
    program = '```python\nx = 1\ny = 2\nraise ValueError("no")\n```'
    rewards = {}
    for recipe in RECIPES:
        wf = MathWorkflow(test_sets=("aime24",), limits=FAST, max_workers=2, recipe=recipe)
        state = wf.reset([0], "aime24")
        state["reference"][0] = "3"
        out = wf.step(state, 1, 0, [[program]])  # agent 1: the tool agent (the reasoner goes first)
        rewards[recipe] = (float(out.local_reward[0, 0]), str(out.state["tool_answer"][0, 0]))
    assert rewards == {"paper": (-1.0, ""), "reference": (1.0, "3")}


# ---------------------------------------------------------------- row 13: the code evaluation set


def test_row_13_the_reference_evaluates_a_multiple_of_five_problems():
    sizes = {}
    for recipe, switches in (("paper", {}), ("reference", {}), ("reference", {"drop_eval_remainder": False})):
        wf = CodeWorkflow(train_sets=("mbpp_train",), test_sets=("humaneval",), recipe=recipe, **switches)
        sizes[recipe, bool(switches)] = wf.splits["humaneval"]
    assert sizes == {("paper", False): 164, ("reference", False): 160, ("reference", True): 164}
    reference = CodeWorkflow(train_sets=("mbpp_train",), test_sets=("humaneval",), recipe="reference")
    reference.reset([159], "humaneval")
    with pytest.raises(ValueError, match="humaneval' has 160 problems"):
        reference.reset([160], "humaneval")


# ---------------------------------------------------------------- X1: when an episode ends


def test_x1_a_math_episode_ends_only_after_the_reasoners_step_under_the_reference():
    """Tool 7, reasoner 5 at turn 0; tool 5 at turn 1: the paper's episode ends there, the reference's
    reasoner still replies at turn 1 and is scored."""
    program = "```python\nprint({})\n```"
    done_after = {}
    for recipe, switches in (("paper", {}), ("reference", {}), ("reference", {"end_checked_after_both": False})):
        wf = MathWorkflow(test_sets=("aime24",), limits=FAST, max_workers=2, recipe=recipe, tool_first=True,
                          **switches)
        state = wf.reset([0], "aime24")
        state["reference"][0] = "5"
        replies = [(0, 0, program.format(7)), (1, 0, "so \\boxed{5}"), (0, 1, program.format(5))]
        for agent, turn, reply in replies:
            state = take_branch(wf.step(state, agent, turn, [[reply]]).state, np.zeros(1, int))
        done_after[recipe, bool(switches)] = bool(wf.done(state)[0])
        if recipe == "reference" and not switches:
            out = wf.step(state, 1, 1, [["again \\boxed{5}"]])  # the reasoner's turn-1 reply, scored
            assert out.local_reward[0, 0] == 1.0 and wf.done(out.state)[0]
    assert done_after == {("paper", False): True, ("reference", False): False, ("reference", True): True}


def test_x1_a_code_episode_ends_only_after_the_test_writers_step_under_the_reference():
    from atgrpo_jax.envs.code_problems import load_problems

    add = next(n for n, p in enumerate(load_problems("apps_test")) if p.id == "apps-1069")
    program = ("**Code:**\n```python\nt = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n"
               "    print(a + b)\n```")
    tests = "**Test Input:**\n```\n1\n2 3\n```\n**Test Output:**\n```\n5\n```"
    done_after_coder = {}
    for recipe in RECIPES:
        wf = CodeWorkflow(train_sets=("mbpp_train",), test_sets=("apps_test",), limits=FAST, max_workers=2,
                          recipe=recipe)
        state = wf.reset([add], "apps_test")
        state = take_branch(wf.step(state, 0, 0, [["no code yet"]]).state, np.zeros(1, int))
        state = take_branch(wf.step(state, 1, 0, [[tests]]).state, np.zeros(1, int))
        state = take_branch(wf.step(state, 0, 1, [[program]]).state, np.zeros(1, int))  # passes the test
        done_after_coder[recipe] = bool(wf.done(state)[0])
        if recipe == "reference":
            assert wf.done(wf.step(state, 1, 1, [[tests]]).state)[0]  # the test writer's step ends it
    assert done_after_coder == {"paper": True, "reference": False}


# ---------------------------------------------------------------- X2: what a game's program and prompt see


def test_x2_the_tool_program_reads_nothing_and_prompts_show_no_history_under_the_reference():
    program = "```python\nimport sys\ndata = sys.stdin.read()\nprint(len(data))\nprint('**Actions List**: [\"U\"]')\n```"
    seen = {}
    for recipe, switches in (("paper", {}), ("reference", {}), ("reference", {"blind_program": False,
                                                                             "no_move_history": False})):
        wf = grid(recipe, **switches)
        state = wf.reset([0], "test")
        out = wf.step(state, 0, 0, [[program]])
        # what the plan agent is shown of the run (this turn's, or with handoff_next_turn the next turn's)
        handoff = str(out.state.handoff[0, 0]) + str(out.state.pending[0, 0])
        state = take_branch(wf.step(take_branch(out.state, np.zeros(1, int)), 1, 0, [['#### ["U"]']]).state,
                            np.zeros(1, int))
        tool_prompt = wf.prompts(state, 0, 1)[0][-1]["content"]
        read = int(re.search(r"Its output:\n```\n(\d+)", handoff).group(1))  # characters it read on stdin
        seen[recipe, bool(switches)] = (read, "Earlier turns" in tool_prompt, "standard input" in tool_prompt)
    board_chars = seen["paper", False][0]
    assert board_chars and board_chars > 50  # the paper's: the board on standard input
    assert seen["paper", False][1:] == (True, True)
    assert seen["reference", False] == (0, False, False)
    assert seen["reference", True][1:] == (True, True) and seen["reference", True][0] > 50  # both back
