"""Grid workflows: hostile answers stepped, rewards, branch flow, the demo's difficulty (parsers: test_grid_roles)."""
import os
import string
import sys

import jax
import numpy as np
import pytest

from atgrpo_jax.envs import grid, grid_workflows as gw, plan_path, reference_steppers, solvers
from atgrpo_jax.envs.workflow import take_branch

sys.path.insert(0, os.path.dirname(__file__))  # grid_helpers (importlib import mode)
from grid_helpers import EXPECTED, HOSTILE, fuzz_strings  # noqa: E402

PLAN_PENALTY, FORMAT_PENALTY = -2.0, -1.0
DEMO_BK, SOLVER_BK = (3, 4), (2, 13)  # one compiled step per workflow across tests


N_DEMO = 2000


@pytest.fixture(scope="module")
def demo():
    return gw.plan_path_demo("direct")


@pytest.fixture(scope="module")
def demo_levels(demo):
    """One batched reset (one compilation); tests slice the tasks they need."""
    return demo.reset(range(N_DEMO), "train")


def _first(state, n):
    return jax.tree.map(lambda x: x[:n], state)


@pytest.fixture(scope="module")
def solver_wf():
    return gw.make_grid_workflow("tool_plan_single", "plan_path")


def _reference_reward(env, b, actions, params):
    ref = reference_steppers.PlanPathRef(grid.unstack_state(env, b), params)
    return sum(ref.step_many(actions)), ref


def test_hostile_answers_step_with_documented_penalty(solver_wf):
    names = list(HOSTILE)
    state = solver_wf.reset([11, 12], "train")
    out = solver_wf.step(state, 0, 0, [[HOSTILE[n] for n in names]] * 2)
    params = solver_wf.game.params
    for j, name in enumerate(names):
        for b in range(2):
            if EXPECTED[name] is None:
                assert out.local_reward[b, j] == PLAN_PENALTY and out.team_reward[b, j] == 0.0, name
            else:
                expected, _ = _reference_reward(state.env, b, EXPECTED[name], params)
                assert out.team_reward[b, j] == pytest.approx(expected, abs=1e-5), name
                assert out.local_reward[b, j] == pytest.approx(expected, abs=1e-5), name  # 2r in all


def test_fuzz_through_workflow_steps(demo, demo_levels, solver_wf):
    """Fuzz answers through real steps, in the [B, K] shapes the other tests compile."""
    texts = fuzz_strings(600, seed=1)
    for wf, agent, (b, k) in ((demo, 0, DEMO_BK), (demo, 1, DEMO_BK), (solver_wf, 0, SOLVER_BK)):
        state = _first(demo_levels, b) if wf is demo else wf.reset(range(b), "train")
        penalty = FORMAT_PENALTY if wf is demo else PLAN_PENALTY
        for start in range(0, len(texts) - b * k, b * k):
            batch = np.array(texts[start:start + b * k], dtype=object).reshape(b, k).tolist()
            out = wf.step(state, agent, 0, batch)
            assert out.local_reward.shape == (b, k) and np.isfinite(out.local_reward).all()
            assert np.all((out.local_reward == penalty) == np.char.startswith(out.parsed_as.astype(str), "unparsed"))


def test_direct_flow_shapes_selection_and_prompts(demo, demo_levels):
    state = _first(demo_levels, 3)
    assert state.env.walls.shape == (3, 6, 6) and state.history.shape == (3,)
    compiled = demo.compiled_step_count()
    for content in [m[0]["content"] for agent in (0, 1) for m in demo.prompts(state, agent, 0)]:
        assert len(content) < 150 and all(ch in string.printable and ch not in "\t\n\r\x0b\x0c" for ch in content)
    out = demo.step(state, 0, 0, [["UR", "DDLL", "R", "?"]] * 3)  # planner: simulated only
    assert out.local_reward.shape == (3, 4) and np.all(out.team_reward == 0)
    assert out.local_reward[0, 3] == FORMAT_PENALTY
    assert np.array_equal(out.state.env.pos, np.repeat(np.asarray(state.env.pos)[:, None], 4, 1))
    state = take_branch(out.state, np.array([1, 1, 0]))
    assert "Plan:DDLL" in demo.prompts(state, 1, 0)[0][0]["content"]
    # executor: K different moves; the selected branch is what the next prompt shows
    out = demo.step(state, 1, 0, [["U", "D", "L", "R"]] * 3)
    assert out.state.env.pos.shape == (3, 4, 2) and out.state.history.shape == (3, 4)
    for b in range(3):
        for k, move in enumerate("UDLR"):
            expected, ref = _reference_reward(state.env, b, [grid.LETTERS.index(move)], demo.game.params)
            assert out.team_reward[b, k] == pytest.approx(expected, abs=1e-6)
            assert tuple(np.asarray(out.state.env.pos)[b, k]) == ref.pos
    best = (out.local_reward + out.team_reward).argmax(1)
    chosen = take_branch(out.state, best)
    for b in range(3):
        shown = demo.prompts(chosen, 0, 1)[b][0]["content"]
        rows = plan_path.render(jax.tree.map(lambda x: np.asarray(x)[b, best[b]], out.state.env), row_sep="/")
        assert rows in shown
    demo.step(chosen, 0, 1, [["L"] * 4] * 3)
    assert demo.compiled_step_count() - compiled <= 1  # four steps, same B and K: one compilation


def test_reset_is_deterministic_and_splits_are_disjoint(demo, demo_levels):
    again = demo.reset(range(N_DEMO), "train")
    assert np.array_equal(again.env.walls, demo_levels.env.walls) and np.array_equal(again.env.goal, demo_levels.env.goal)
    test = demo.reset(range(N_DEMO), "test")
    renders = lambda s: {plan_path.render(grid.unstack_state(s.env, i)) for i in range(N_DEMO)}  # noqa: E731
    assert not renders(demo_levels) & renders(test)
    opt = np.asarray(demo_levels.env.optimal)
    assert opt.min() >= 2 and opt.max() <= 8  # the demo's distance bounds
    with pytest.raises(ValueError):
        demo.reset([0], "validation")


def test_demo_random_policy_is_weak_and_oracle_solves(demo, demo_levels):
    """Random 1..exec_len moves per turn (reference stepper) vs BFS moves in chunks."""
    n, cfg, params, state = N_DEMO, demo.config, demo.game.params, demo_levels
    rng = np.random.default_rng(0)
    random_wins = oracle_wins = 0
    for i in range(n):
        level = grid.unstack_state(state.env, i)
        ref = reference_steppers.PlanPathRef(level, params)
        for _ in range(cfg.max_turns):
            ref.step_many(rng.integers(0, 4, size=rng.integers(1, cfg.exec_len + 1)))
        random_wins += ref.success
        path = solvers.plan_path_shortest(level.walls, level.pos, level.goal)
        oracle = reference_steppers.PlanPathRef(level, params)
        for t in range(cfg.max_turns):
            oracle.step_many(path[t * cfg.exec_len:(t + 1) * cfg.exec_len])
        oracle_wins += oracle.success
    rate = random_wins / n
    print(f"demo random-policy success: {rate:.3f}")
    assert 0.01 < rate < 0.20
    assert oracle_wins == n


def test_sudoku_answers():
    direct = gw.make_grid_workflow("direct_single", "sudoku")
    solver = gw.make_grid_workflow("tool_plan_single", "sudoku")
    state = solver.reset([5], "train")
    s = grid.unstack_state(state.env, 0)
    empty = [(r, c) for r in range(4) for c in range(4) if s.puzzle[r, c] == 0]
    r, c = empty[0]
    good = f"{r}{c}{s.solution[r, c]}"
    out = direct.step(state, 0, 0, [[good, f"{r} {c} {s.solution[r, c]}", "44 1", "0001", ""]])
    assert out.local_reward[0, 0] == pytest.approx(0.09, abs=1e-6)
    assert out.local_reward[0, 1] == out.local_reward[0, 0]
    assert list(out.local_reward[0, 2:]) == [FORMAT_PENALTY] * 3
    full = "#### " + str(s.solution.tolist())
    triples = "#### " + str([[r, c, int(s.solution[r, c])] for r, c in empty])
    out = solver.step(state, 0, 0, [[full, triples, "#### [[9, 9, 9]]", "", ""]])  # same K: one compile
    assert np.all(solver.success(out.state)[0, :2]) and not solver.success(out.state)[0, 2]
    assert out.team_reward[0, 2] == pytest.approx(-0.1)


BFS_PROGRAM = '''```python
import sys
from collections import deque
rows = sys.stdin.read().split("\\n")
cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
start = next(p for p, ch in cells.items() if ch == "S")
goal = next(p for p, ch in cells.items() if ch == "G")
moves = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
prev, queue = {start: None}, deque([start])
while queue:
    cur = queue.popleft()
    for name, (dr, dc) in moves.items():
        nxt = (cur[0] + dr, cur[1] + dc)
        if cells.get(nxt, "#") != "#" and nxt not in prev:
            prev[nxt] = (cur, name)
            queue.append(nxt)
path, cur = [], goal
while prev[cur] is not None:
    cur, name = prev[cur]
    path.append(name)
print("**Actions List**:", path[::-1])
```'''


def test_tool_then_plan_with_sandbox(solver_wf):
    from atgrpo_jax.envs.sandbox import Limits

    # same game and seed as solver_wf: shares its compiled reset/step; same [B, K] too
    wf = gw.make_grid_workflow("tool_plan", "plan_path", sandbox_limits=Limits(wall_s=10, cpu_s=10))
    b, k = SOLVER_BK
    compiled = wf.compiled_step_count()  # the cache is shared with every workflow of this game in the process
    state = wf.reset(range(b), "train")
    tool_answers = [BFS_PROGRAM, "```python\nraise SystemExit(3)\n```", "no code here",
                    '```python\nprint("**Actions List**: [U, R")\n```'] + ["..."] * (k - 4)
    out = wf.step(state, 0, 0, [tool_answers, ["no code"] * k])
    level = grid.unstack_state(state.env, 0)
    path = solvers.plan_path_shortest(level.walls, level.pos, level.goal)
    expected, ref = _reference_reward(state.env, 0, path, wf.game.params)
    assert ref.success and out.local_reward[0, 0] == pytest.approx(expected, abs=1e-5)
    assert np.all(out.local_reward[0, 1:] == -2.0) and np.all(out.local_reward[1] == -2.0)
    assert np.all(out.team_reward == 0) and not wf.done(out.state).any()  # the tool agent only simulates
    state = take_branch(out.state, np.array([0, 0]))
    plan_prompt = wf.prompts(state, 1, 0)[0][1]["content"]
    assert "sys.stdin.read()" in plan_prompt and "Actions parsed from it: [" in plan_prompt
    assert "no Python code block" in wf.prompts(state, 1, 0)[1][1]["content"]
    answer = "The tool agent is right.\n#### " + str([grid.LETTERS[m] for m in path])
    out = wf.step(state, 1, 0, [[answer] + ["I give up"] * (k - 1)] * b)
    assert wf.done(out.state)[0, 0] and wf.success(out.state)[0, 0] and not wf.done(out.state)[0, 1]
    assert out.local_reward[0, 0] == pytest.approx(expected, abs=1e-5)
    assert out.team_reward[0, 0] == pytest.approx(expected, abs=1e-5)
    assert out.local_reward[0, 1] == -2.0
    # a finished task gets zero rewards and runs nothing
    done_state = take_branch(out.state, np.array([0, 0]))
    again = wf.step(done_state, 0, 1, [[BFS_PROGRAM] * k] * b)
    assert wf.done(done_state)[0] and np.all(again.local_reward[0] == 0.0)
    assert wf.compiled_step_count() - compiled <= 1  # three steps, one B and K: at most one compilation


@pytest.fixture
def corridor():
    import importlib.util
    import os

    from atgrpo_jax.envs.games import GAMES
    spec = importlib.util.spec_from_file_location("corridor_game", os.path.join(os.path.dirname(__file__),
                                                                                "corridor_game.py"))
    corridor_game = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corridor_game)
    GAMES.register("corridor", corridor_game)  # the one registry line a new game needs
    yield corridor_game
    GAMES._items.pop("corridor")


def test_a_new_game_is_one_module_and_one_registry_line(corridor):
    """Its workflows exist by name, play, and reward by its own rules."""
    from atgrpo_jax.envs.workflow_registry import make_workflow

    for name, single, roles in (("corridor_direct", False, ("planner", "executor")),
                                ("corridor_direct", True, ("actor",)),
                                ("corridor_tool_plan", True, ("solver",))):
        wf = make_workflow(name, single_agent=single, max_turns=2, exec_len=4)
        assert tuple(a.name for a in wf.agents) == roles
        state = wf.reset([0, 1, 2], "train")
        prompts = wf.prompts(state, 0, 0)
        assert len(prompts) == 3 and ("Corridor" in str(prompts[0]) or "corridor" in str(prompts[0]))
        direct = wf.roles[-1].answer == "direct"
        right, bump = ("RRRR", "U") if direct else ('#### ["R", "R", "R", "R"]', '#### ["U"]')
        out = wf.step(state, len(roles) - 1, 0, [[right, bump]] * 3)  # 4 moves right reach the end
        assert wf.success(out.state)[:, 0].all() and not wf.success(out.state)[:, 1].any()
        assert (out.team_reward[:, 0] > 0.9).all() and (out.team_reward[:, 1] < 0).all()


def paper_rewards(role, r_own, parsed, r_env_last):
    """(local, team) of a grid role as the paper defines them (written from its text, not from the code):
    the plan agent's answer steps the environment and earns 2x its step reward in all, -2 when nothing
    parses; the tool agent's actions are simulated on a copy (its step reward, -2 when nothing parses)
    and it adds the team's reward, the environment's (which the tool agent does not move)."""
    if role == "plan":
        return (r_own, r_own) if parsed else (-2.0, 0.0)
    return (r_own if parsed else -2.0), r_env_last


def test_reward_pairs_follow_the_paper_turn_after_turn(solver_wf):
    """Two turns of tool -> plan on Plan-Path; every (local, team) pair against the paper's rule, with
    step rewards from the reference stepper. The plan agent's total is 2r (it was 3r: local 2r + team r)."""
    from atgrpo_jax.envs.sandbox import Limits

    wf = gw.make_grid_workflow("tool_plan", "plan_path", sandbox_limits=Limits(wall_s=10, cpu_s=10))
    b, k = SOLVER_BK
    state = wf.reset(range(b), "train")
    params, r_env_last = wf.game.params, np.zeros(b)
    prints = lambda moves: f"```python\nprint('**Actions List**: {moves}')\n```"  # noqa: E731
    for turn in range(2):
        tools = [prints('["U", "U"]'), prints('["R"]'), "no code", prints("nothing")] + ["..."] * (k - 4)
        out = wf.step(state, 0, turn, [tools] * b)
        for task in range(b):
            for j, moves in enumerate([[0, 0], [3], None, None] + [None] * (k - 4)):
                r = _reference_reward(state.env, task, moves, params)[0] if moves else 0.0
                want = paper_rewards("tool", r, moves is not None, r_env_last[task])
                assert (out.local_reward[task, j], out.team_reward[task, j]) == pytest.approx(want, abs=1e-5)
        state = take_branch(out.state, np.zeros(b, int))
        plans = ['#### ["D", "D", "L"]', '#### ["U"]', "no answer"] + ['#### ["L"]'] * (k - 3)
        out = wf.step(state, 1, turn, [plans] * b)
        for task in range(b):
            for j, moves in enumerate([[1, 1, 2], [0], None] + [[2]] * (k - 3)):
                r = _reference_reward(state.env, task, moves, params)[0] if moves else 0.0
                want = paper_rewards("plan", r, moves is not None, r_env_last[task])
                assert (out.local_reward[task, j], out.team_reward[task, j]) == pytest.approx(want, abs=1e-5)
        state = take_branch(out.state, np.zeros(b, int))
        r_env_last = out.team_reward[:, 0]  # the real step of the branch the episode continues from
    assert (r_env_last != 0).all()  # the second turn's tool groups did see a real step's reward


def test_a_parsed_answer_beats_the_format_penalty_whenever_its_step_reward_exceeds_minus_1(solver_wf):
    """With the old pairs (local 2r + team r = 3r) an unparsed answer (-2) beat a parsed one for
    r in (-1, -0.67); with the paper's 2r it does not. Nine bumps into the top edge, next to the goal:
    each -0.1 for the invalid move + 0.01 of shaping (gamma - 1) * Phi at distance 1, r = -0.81."""
    rows = ["SG........"] + [".........."] * 9
    env = grid.stack_states([plan_path.from_ascii("\n".join(rows))])
    texts = np.array([""], dtype=object)
    state = gw.GridState(env, texts, texts.copy(), np.zeros(1, np.float32), np.array([gw.NO_MOVE], dtype=object),
                         texts.copy())
    out = solver_wf.step(state, 0, 0, [['#### ' + str(["U"] * 9), "nothing"]])
    total = out.local_reward + out.team_reward
    assert out.team_reward[0, 0] == pytest.approx(9 * (-0.1 + 0.01), abs=1e-5)
    assert total[0, 0] == pytest.approx(-1.62, abs=1e-5) and total[0, 1] == -2.0  # parsed beats unparsed
    assert 3 * out.team_reward[0, 0] < -2.0  # (as 3r, it would not have)


@pytest.mark.parametrize("game, unparsed", [("plan_path", -2.0), ("sudoku", -1.0)])
def test_tool_agent_empty_list_earns_0_and_nothing_parsed_the_references_penalty(game, unparsed):
    """The reference's tool-agent rewards: `[]` (its prompt allows it) is a move-less answer worth 0,
    not a format error; a program that prints no list gets -2 (Sudoku: -1)."""
    from atgrpo_jax.envs.sandbox import Limits

    wf = gw.make_grid_workflow("tool_plan", game, sandbox_limits=Limits(wall_s=10, cpu_s=10))
    b, k = SOLVER_BK
    state = wf.reset(range(b), "train")
    prints = lambda text: f"```python\nprint({text!r})\n```"  # noqa: E731
    tools = [prints("**Actions List**: []"), prints("**Actions List**:  [ ]"), prints("no list"), "no code",
             prints("**Actions List**: none")] + ["..."] * (k - 5)
    out = wf.step(state, 0, 0, [tools] * b)
    np.testing.assert_array_equal(out.local_reward[:, :2], 0.0)
    np.testing.assert_array_equal(out.local_reward[:, 2:], unparsed)
    assert out.parsed_as[0, 0] == "an empty action list []" and out.parsed_as[0, 2].startswith("unparsed")
    assert gw.make_grid_workflow("tool_plan", game, tool_penalty=-3.0).config.tool_penalty == -3.0  # an option


def test_a_role_alone_in_its_single_agent_environment(solver_wf):
    """`env.kwargs.alone=ROLE` with single_agent: that role alone, its actions stepping the game (the paper's
    "trained alone" ablation): the tool agent's BFS program solves the level by itself."""
    from atgrpo_jax.envs.workflow_registry import make_workflow
    from atgrpo_jax.envs.sandbox import Limits

    wf = make_workflow("plan_path_tool_plan", single_agent=True, alone="tool",
                       sandbox_limits=Limits(wall_s=10, cpu_s=10))
    assert [a.name for a in wf.agents] == ["tool_alone"] and "Python code" in wf.prompts(
        wf.reset(range(1), "train"), 0, 0)[0][0]["content"]
    b, k = SOLVER_BK
    state = wf.reset(range(b), "train")
    out = wf.step(state, 0, 0, [[BFS_PROGRAM] + ["no code"] * (k - 1)] * b)
    level = grid.unstack_state(state.env, 0)
    expected, ref = _reference_reward(state.env, 0, solvers.plan_path_shortest(level.walls, level.pos, level.goal),
                                      wf.game.params)
    assert wf.done(out.state)[0, 0] and wf.success(out.state)[0, 0] and ref.success
    assert out.local_reward[0, 0] == pytest.approx(expected, abs=1e-5) == out.team_reward[0, 0]
    assert np.all(out.local_reward[:, 1:] == -2.0)
    planner = make_workflow("plan_path_demo", single_agent=True, alone="planner")
    assert [a.name for a in planner.agents] == ["planner_alone"] and planner.roles[0].moves_env
    with pytest.raises(ValueError, match="needs env.single_agent"):
        make_workflow("plan_path_tool_plan", alone="tool")
    with pytest.raises(ValueError, match=r"choose one of \['executor', 'planner'\]"):
        make_workflow("plan_path_demo", single_agent=True, alone="plan")
