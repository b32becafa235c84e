"""recipe = "paper" | "reference": each switch, on the inputs where the two recipes differ, with both
outcomes asserted (docs/paper.md, "Recipes")."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from atgrpo_jax.envs import plan_path
from atgrpo_jax.envs.code_workflow import CodeWorkflow
from atgrpo_jax.envs.grid_roles import actions_from_answer, reference_tool_actions
from atgrpo_jax.envs.math_workflow import MathWorkflow
from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.envs.sandbox import Limits, RunResult
from atgrpo_jax.envs.workflow import episodes_per_problem, take_branch
from atgrpo_jax.train.config import ConfigError
from atgrpo_jax.train.paper import paper_config
from atgrpo_jax.train.setup import scored_as, scoring_of
from atgrpo_jax.train.update import make_optimizer
from atgrpo_jax.train.validate import resolve
from tiny_config import tiny

RECIPES = ("paper", "reference")


def small(recipe: str = "paper", **changes):
    """The tests' tiny config under `recipe`."""
    return tiny(recipe=recipe, **changes)


# ---------------------------------------------------------------- run settings


def test_the_recipe_settles_every_switch_left_at_none_and_keeps_the_ones_set():
    paper, reference = resolve(small()), resolve(small("reference"))
    assert not any(paper.reference.to_dict().values()) and all(reference.reference.to_dict().values())
    assert (paper.optim.master_dtype, reference.optim.master_dtype) == ("float32", "param_dtype")  # row 7
    one_back = resolve(small("reference", **{"reference.lr_schedule": False, "optim.master_dtype": "float32"}))
    assert one_back.reference.logprobs_at_t1 and not one_back.reference.lr_schedule
    assert one_back.optim.master_dtype == "float32"
    assert resolve(small(**{"reference.logprobs_at_t1": True})).reference.logprobs_at_t1  # an ablation of one


@pytest.mark.parametrize("changes,message", [
    ({"recipe": "referense"}, "config.recipe: unknown 'referense' (did you mean 'reference'?)"),
    ({"reference.lr_schedule": "yes"}, "config.reference.lr_schedule: must be True, False or None"),
    ({"recipe": "reference", "system.staleness": 1}, "config.system.staleness: N >= 1 takes the importance ratio"),
])
def test_bad_recipe_settings_are_named(changes, message):
    c = small()
    for key, value in changes.items():
        node, leaf = (c, key) if "." not in key else (c[key.split(".")[0]], key.split(".")[1])
        node[leaf] = value
    with pytest.raises(ConfigError) as e:
        resolve(c)
    assert str(e.value).startswith(message)


def vendored_verl(scheduler_steps, warmup, total, floor):
    """The reference's vendored verl cosine (verl/utils/torch_functional.py), restated: the warm-up
    starts at the floor, and the result is clamped at the floor."""
    if scheduler_steps < warmup:
        return floor + (1 - floor) * scheduler_steps / max(1, warmup)
    progress = (scheduler_steps - warmup) / max(1, total - warmup)
    return max(floor, math.cos(math.pi * progress) * (1 - floor) / 2 + (1 + floor) / 2)


def test_row_8_the_schedule_per_step_under_both_recipes():
    c = paper_config("plan_path", "qwen3-1.7b")
    per_recipe = {}
    for recipe in RECIPES:
        _, lr_at = make_optimizer(c.optim, c.train.steps, as_reference_runs=recipe == "reference")
        per_recipe[recipe] = np.array([lr_at(s) for s in range(1, 201)]) / c.optim.lr
    paper, reference = per_recipe["paper"], per_recipe["reference"]
    # the reference as it runs: total_training_steps stays -1, so the cosine turns half a period per step
    np.testing.assert_allclose(reference, [vendored_verl(s - 1, 10, -1, 0.3) for s in range(1, 201)], atol=1e-12)
    assert reference[0] == pytest.approx(0.3) and reference[9] == pytest.approx(0.93)  # warm-up from the floor
    np.testing.assert_allclose(reference[10:16], [1, 0.3, 1, 0.3, 1, 0.3], atol=1e-12)  # then it alternates
    assert paper[0] == 0 and paper[10] == 1 and np.all(np.diff(paper[10:]) < 0) and paper[-1] > 0.3  # smooth


def test_row_8_with_one_adapter_per_agent_each_update_steps_the_shared_scheduler_under_the_reference():
    """L2: the reference calls update_actor once per agent (names sorted), each stepping one scheduler; its
    warm-up of 10 scheduler steps ends after 5 training steps, then the plan agent (first by name) always
    trains at lr and the tool agent always at 0.3 x lr."""
    from atgrpo_jax.train.roles import scheduler_turns

    names, per_agent = ("tool", "plan"), {}
    for recipe, switches in (("paper", {}), ("reference", {}), ("reference", {"reference.shared_scheduler": False})):
        c = paper_config("plan_path", "qwen3-1.7b")
        c.recipe, c.policy.sharing = recipe, "lora"
        for key, value in switches.items():
            c[key.split(".")[0]][key.split(".")[1]] = value
        c = resolve(c, weights=False)
        lrs = [make_optimizer(c.optim, c.train.steps, c.reference.lr_schedule, turn)[1]
               for turn in scheduler_turns(c, names, len(names))]
        per_agent[recipe, bool(switches)] = np.array([[lr(s) / c.optim.lr for s in range(1, 21)] for lr in lrs])
    tool, plan = per_agent["reference", False]
    np.testing.assert_allclose(plan[:5], [0.3 + 0.7 * p / 10 for p in (0, 2, 4, 6, 8)])  # warm-up in 5 steps
    np.testing.assert_allclose(tool[:5], [0.3 + 0.7 * p / 10 for p in (1, 3, 5, 7, 9)])
    np.testing.assert_allclose(plan[5:], 1.0, atol=1e-12)
    np.testing.assert_allclose(tool[5:], 0.3, atol=1e-12)
    tool, plan = per_agent["paper", False]
    np.testing.assert_array_equal(tool, plan)  # each adapter its own schedule: the same rate
    assert tool[0] == 0 and tool[10] == 1 and np.all(np.diff(tool[10:]) < 0)
    tool, plan = per_agent["reference", True]  # the switch back alone: the reference's alternation, shared
    np.testing.assert_array_equal(tool, plan)
    np.testing.assert_allclose(plan[10:14], [1, 0.3, 1, 0.3], atol=1e-12)
    frozen = resolve(small("reference", **{"policy.sharing": "lora", "policy.frozen_agents": ("tool",)}))
    assert scheduler_turns(frozen, names, 2) == [(0, 1), (0, 1)]  # a frozen agent's update never runs


def test_row_6_the_update_scores_at_temperature_1_under_the_reference():
    c = resolve(paper_config("plan_path", "qwen3-1.7b"), weights=False)
    sampling = [c.rollout.agent("tool"), c.rollout.agent("plan")]
    assert scored_as(c, sampling) == sampling  # the paper's: the distribution the tokens were drawn from
    assert scoring_of(scored_as(c, sampling), None).repetition_penalty
    c = c.replace_at("reference.logprobs_at_t1", True)
    at_t1 = scored_as(c, sampling)
    assert [(s.inv_temp, s.top_p, s.top_k, s.repetition_penalty) for s in at_t1] == [(1.0, 1.0, 0, 1.0)] * 2
    how = scoring_of(at_t1, None)
    assert (how.top_k, how.top_p, how.repetition_penalty) == (0, False, False)
    assert [s.temperature for s in sampling] == [1.5, 1.5]  # the sampler still draws at 1.5


# ---------------------------------------------------------------- the workflows' switches


def grid(recipe: str, game: str = "plan_path"):
    return make_workflow(f"{game}_tool_plan", recipe=recipe)


U, D, L, R, BAD = 0, 1, 2, 3, 4


@pytest.mark.parametrize("answer,paper,reference", [
    ('#### ["U","R"]\nThat is my answer.', [U, R], None),  # the reference's answer runs to the end of the text
    ('#### ["U","R"].', [U, R], None),
    ('####["U"]', [U], None),  # no space after ####
    ("#### U R D", [U, R, D], None),  # bare moves
    ('#### ["u","r"]', [U, R], [BAD, BAD]),  # lower case: invalid moves to the reference
    ('#### ["UP"]', [U], [BAD]),
    ('#### ["U"]\n#### ["R"]', [R], [U]),  # the reference: the first list (the rest a Python comment)
    ('#### ["U", "R"]', [U, R], [U, R]),
    ("#### [U, R]", [U, R], [U, R]),
    ("no answer", None, None),
])
def test_row_3_the_plan_agents_answer_under_both_recipes(answer, paper, reference):
    for recipe, want in (("paper", paper), ("reference", reference)):
        wf = grid(recipe)
        assert actions_from_answer(answer, wf.game, wf.config.strict_answer) == want, recipe


def run(stdout="", stderr="", timed_out=False, exit_code=0):
    return RunResult(stdout, stderr, exit_code, timed_out, False, False, None, 0.1)


@pytest.mark.parametrize("result,paper,reference", [
    (run('**Actions List**: ["U", "R"]\n'), [U, R], [U, R]),
    (run('**Actions List**: ["U", "R"]\n', stderr="DeprecationWarning: x"), [U, R], None),  # any stderr
    (run('**Actions List**: ["U"]\n', timed_out=True, exit_code=None), [U], None),
    (run('Actions: ["D", "L"]\n'), None, [D, L]),
    (run('thinking...\n["L"]\n'), None, [L]),  # a bare list line
    (run('**Actions List**: ["up"]\nActions: ["U"]\n'), [U], [U]),  # Plan-Path: exact letters, else the next
])
def test_row_4_the_tool_agents_output_under_both_recipes(result, paper, reference):
    from atgrpo_jax.envs.grid_roles import actions_from_output

    wf = grid("reference")
    assert actions_from_output(result.stdout, wf.game) == paper
    assert reference_tool_actions(result.as_reference_reports, wf.game) == reference


def test_row_16_a_tool_reply_without_a_block_runs_whole_under_the_reference():
    from atgrpo_jax.envs.parsers import extract_code_block, reference_program

    reply = 'print("**Actions List**: [\\"U\\"]")'
    assert extract_code_block(reply) is None and reference_program(reply) == reply
    assert reference_program("```python\nx = 1\nprint(x)", unclosed_blocks=True) == "x = 1\nprint(x)"
    for recipe, runs in (("paper", False), ("reference", True)):
        assert grid(recipe).config.whole_reply_program is runs
        assert MathWorkflow(test_sets=("aime24",), recipe=recipe).whole_reply_program is runs


def test_row_17_a_sokoban_timeout_counts_as_success_under_the_reference():
    for recipe, success in (("paper", False), ("reference", True)):
        wf = grid(recipe, "sokoban")
        state = wf.reset([0], "test")
        timed_out = state._replace(env=state.env._replace(done=jnp.ones_like(state.env.done),
                                                          success=jnp.zeros_like(state.env.success)))
        assert wf.success(timed_out).tolist() == [success] and not wf.success(state)[0]


def test_row_1_the_next_agent_sees_what_the_first_passed_on_a_turn_later_under_the_reference():
    """Every prompt is rendered at the start of the turn in the reference: the executor sees the planner's
    proposal of the turn before (none at turn 0), where the paper's tree shows this turn's selected one."""
    from atgrpo_jax.envs.workflow import take_branch

    shown = {}
    for recipe in ("paper", "reference"):
        wf = make_workflow("plan_path_direct", recipe=recipe)
        assert wf.config.handoff_next_turn is (recipe == "reference")
        state, seen = wf.reset([0], "test"), []
        for turn, proposal in enumerate(("UR", "DL")):
            state = take_branch(wf.step(state, 0, turn, [[proposal]]).state, np.zeros(1, int))
            seen.append(wf.prompts(state, 1, turn)[0][-1]["content"].split("Plan:")[1].split()[0])
            state = take_branch(wf.step(state, 1, turn, [["xx"]]).state, np.zeros(1, int))  # unparsed: no move
        shown[recipe] = seen
    assert shown == {"paper": ["UR", "DL"], "reference": ["?", "UR"]}


def test_row_2_plan_path_shows_only_the_static_level_under_the_reference():
    """The reference shows the walls and the level's start and goal; where the walker is now is never
    shown, so a walker that moved sees the prompt it saw before the move."""
    prompts = {}
    for recipe in ("paper", "reference"):
        wf = grid(recipe)
        state = wf.reset([0], "test")
        moved = state._replace(env=state.env._replace(pos=state.env.goal))
        prompts[recipe] = [wf.prompts(s_, 1, 0)[0][-1]["content"] for s_ in (state, moved)]
        assert wf.config.static_observation is (recipe == "reference")
    start, goal = state.env.start[0].tolist(), state.env.goal[0].tolist()
    before, after = prompts["reference"]
    assert before == after and f"Start: {tuple(start)},  Goal: {tuple(goal)}" in before
    board = before.split("```")[1]
    assert set(board.strip()) <= {".", "#", "\n"}  # no S, G or * marks
    before, after = prompts["paper"]
    assert before != after and f"You are at (row {start[0]}, col {start[1]})" in before and "*" in after.split("```")[1]
    env0 = jax.tree.map(lambda x: x[0], grid("reference").reset([0], "test").env)
    assert grid("reference")._board(env0) == plan_path.static_view(env0)  # a program's standard input: the same view
    sokoban = grid("reference", "sokoban")
    assert "Current state" in sokoban.prompts(sokoban.reset([0], "test"), 1, 0)[0][-1]["content"]  # no static view


FAST = Limits(wall_s=2.0, cpu_s=2.0, memory_mb=512)


def math_step(recipe: str, agent: int, responses: list[str]):
    wf = MathWorkflow(test_sets=("aime24",), limits=FAST, max_workers=2, recipe=recipe)
    state = wf.reset([0], "aime24")
    state["reference"][0] = "42"
    return wf.step(state, agent, 0, [responses])


def test_row_10_the_math_answer_under_both_recipes():
    replies = ["The answer is $42$.", "so \\boxed{42}", "I cannot tell."]
    paper, reference = (math_step(r, 0, replies) for r in RECIPES)
    assert paper.state["reasoner_answer"][0].tolist() == ["", "42", ""]
    assert reference.state["reasoner_answer"][0].tolist() == ["42", "42", ""]
    np.testing.assert_array_equal(paper.local_reward, [[0, 1, 0]])
    np.testing.assert_array_equal(reference.local_reward, [[1, 1, 0]])


def test_rows_10_and_11_the_math_tool_agent_under_both_recipes():
    programs = ['```python\nprint(42)\nprint("Done")\n```',  # the reference reads 42; ours the last line
                "```python\nraise SystemExit(3)\n```",  # fails, prints nothing
                "I would compute it by hand."]  # no block: the reference runs it (and it fails)
    paper, reference = (math_step(r, 1, programs) for r in RECIPES)
    assert paper.state["tool_answer"][0].tolist() == ["Done", "", ""]
    assert reference.state["tool_answer"][0, 0] == "42"
    np.testing.assert_array_equal(paper.local_reward, [[0, -1, -1]])  # wrong; failed; no program
    np.testing.assert_array_equal(reference.local_reward, [[1, 0, 0]])  # right; a failure scores as wrong


def test_rows_13_and_16_the_code_workflow_under_both_recipes():
    from atgrpo_jax.envs.parsers import extract_code_block, python_block

    untagged = "```\nprint(input())\n```"
    assert extract_code_block(untagged) == "print(input())" and python_block(untagged) is None
    assert python_block("```python\nx = 1\n```\n```python\ny = 2\n```") == "y = 2"
    for recipe, strict in (("paper", False), ("reference", True)):
        wf = CodeWorkflow(train_sets=("mbpp_train",), test_sets=("humaneval",), recipe=recipe)
        assert (wf.python_blocks_only, wf.one_eval_sample) == (strict, strict)
        assert episodes_per_problem(wf, 5) == (1 if strict else 5)  # the reference's avg@1
    explicit = CodeWorkflow(train_sets=("mbpp_train",), test_sets=("humaneval",), recipe="reference",
                            one_eval_sample=False)
    assert episodes_per_problem(explicit, 5) == 5  # one switch flipped back alone


def test_a_workflow_factory_without_a_recipe_argument_is_built_without_one(tmp_path, monkeypatch):
    (tmp_path / "my_flows.py").write_text("def factory(single_agent=False, **kwargs):\n"
                                          "    return sorted(kwargs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert make_workflow("my_flows:factory", recipe="reference", size=3) == ["size"]
    with pytest.raises(ValueError, match="recipe: unknown 'pepper'"):
        make_workflow("plan_path_tool_plan", recipe="pepper")


def test_row_15_math_draws_each_steps_problems_at_random_under_the_reference():
    from atgrpo_jax.envs.workflow import TRAIN_TASK_STRIDE

    paper, reference = (MathWorkflow(test_sets=("aime24",), recipe=r) for r in RECIPES)
    pool = len(paper._pool("train"))
    ids = lambda step, n=8: [step * TRAIN_TASK_STRIDE + j for j in range(n)]  # noqa: E731
    walk = paper._rows(ids(3), "train", pool)
    assert walk == [(3 * TRAIN_TASK_STRIDE + j) % pool for j in range(8)]  # consecutive problems
    drawn = [reference._rows(ids(s, pool), "train", pool) for s in (3, 4)]
    assert sorted(drawn[0]) == list(range(pool))  # a step's draws are distinct: a permutation of the pool
    assert drawn[0] != drawn[1] and drawn[0] != sorted(drawn[0])  # at random, anew each step
    assert reference._rows(ids(3, 4), "train", pool) == drawn[0][:4]  # a function of the task id alone
    assert reference._rows([0, 1], "aime24", 30) == [0, 1]  # evaluation splits: their problems in order


def test_row_15_mini_batches_keep_the_collected_order_under_the_reference():
    from types import SimpleNamespace

    from atgrpo_jax.train.batch import policy_batch

    g, k = 6, 2
    samples = SimpleNamespace(mask=np.ones((g, k), bool), response_len=np.ones((g, k), int),
                              sample_agent=np.zeros((g, k), int), prompt_len=np.ones(g, int),
                              prompt_of=np.repeat(np.arange(g)[:, None], k, 1),
                              sample_prompt_len=lambda: np.ones((g, k), int))
    batch = lambda shuffle: policy_batch(samples, np.zeros((g, k)), np.ones(g, bool), np.ones(1, bool), 4,  # noqa
                                         np.random.default_rng(0) if shuffle else None).group
    assert batch(False).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert batch(True)[::2].tolist() != list(range(g))  # the paper recipe shuffles the groups
    assert resolve(small("reference")).reference.unshuffled_minibatches
    assert not resolve(small()).reference.unshuffled_minibatches


def test_row_9_the_reference_trains_one_lora_adapter_on_the_shared_model():
    assert resolve(small()).policy.sharing == "shared"
    assert resolve(small("reference")).policy.sharing == "shared_lora"
    assert resolve(small("reference", **{"policy.sharing": "per_role"})).policy.sharing == "per_role"  # L2 stays
    assert resolve(small("reference", **{"reference.lora_on_shared": False})).policy.sharing == "shared"


def test_row_12_math_turns_show_every_earlier_turn_under_the_reference():
    long_reasoning = "step " * 300 + "\\boxed{42}"
    prompts = {}
    for recipe in RECIPES:
        wf = MathWorkflow(test_sets=("aime24",), limits=FAST, max_workers=2, recipe=recipe)
        state = wf.reset([0], "aime24")
        for turn, reply in enumerate([long_reasoning, "so \\boxed{41}"]):
            state = take_branch(wf.step(state, 0, turn, [[reply]]).state, np.zeros(1, int))
            state = take_branch(wf.step(state, 1, turn, [["```python\nprint(7)\n```"]]).state, np.zeros(1, int))
        prompts[recipe] = wf.prompts(state, 0, 2)[0][1]["content"]
    reference, paper = prompts["reference"], prompts["paper"]
    assert "Turn 1, its answer: 42" in reference and "Turn 2, its answer: 41" in reference
    assert reference.count("Turn 1, the program") == 1 and "Turn 2, its result: 7" in reference
    assert "[...]" in reference and len(reference) < len(long_reasoning) + 1000  # cut to its head and tail
    assert "Turn 1" not in paper and "Your previous solution" in paper  # the latest replies only


def test_row_12_the_sudoku_tool_agent_is_asked_for_the_whole_grid_under_the_reference():
    from atgrpo_jax.envs import sudoku

    asks = {}
    for recipe in RECIPES:
        wf = grid(recipe, "sudoku")
        asks[recipe] = wf.prompts(wf.reset([0], "test"), 0, 0)[0][1]["content"]
    assert sudoku.GRID_ANSWER_EXAMPLE in asks["reference"] and sudoku.GRID_ANSWER_FORMAT in asks["reference"]
    assert sudoku.ANSWER_EXAMPLE in asks["paper"] and sudoku.GRID_ANSWER_FORMAT not in asks["paper"]
    assert sudoku.parse_list(sudoku.GRID_ANSWER_EXAMPLE, 16) is not None  # a whole grid parses
