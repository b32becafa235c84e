"""Code grading (stdin/stdout and assert harnesses) and the code workflow with scripted agents."""
import time

import numpy as np
import pytest

from atgrpo_jax.envs.code_grading import TestVerdict as Verdict
from atgrpo_jax.envs.code_grading import (
    io_tests, load_code_problems, outputs_match, pass_rate, run_assert_tests, run_io_tests)
from atgrpo_jax.envs.code_problems import DATA_SETS, load_problems
from atgrpo_jax.envs.code_workflow import CodeWorkflow, make_code_workflow, mismatch_report
from atgrpo_jax.envs.sandbox import Limits
from atgrpo_jax.envs.workflow import take_branch

FAST = Limits(wall_s=2.0, cpu_s=2.0, memory_mb=512)
ADD = "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a + b)\n"
SUB = ADD.replace("a + b", "a - b")
# Right only when a == 0 or b == 0 ... or when both are equal to 1.
PARTIAL = ADD.replace("print(a + b)", "print(a + b if a * b != 2 else 0)")


def _block(code):
    return f"**Code:**\n```python\n{code}```"


def _tests_text(pairs):
    return "\n".join(f"**Test Input:**\n```\n{i}\n```\n**Test Output:**\n```\n{o}\n```" for i, o in pairs)


# ---------------------------------------------------------------- grading
@pytest.mark.parametrize("actual,expected,match", [
    ("3\n300\n", "3\n300\n", True),
    ("3   \n300\n\n\n", "3\n300", True),  # trailing whitespace and blank lines
    ("3\r\n300\r\n", "3\n300\n", True),
    ("0.3333333\n", "0.33333333\n", True),  # numbers within 1e-6
    ("3 300", "3\n300", True),  # same tokens
    ("300\n3\n", "3\n300\n", False),
    ("3\n", "3\n300\n", False),
    ("", "0\n", False),
    ("YES", "yes", False),
])
def test_outputs_match(actual, expected, match):
    assert outputs_match(actual, expected) is match


def test_run_io_tests_verdicts():
    tests = [("2\n1 2\n3 4\n", "3\n7\n"), ("1\n1 1", "2")]  # the second input has no final newline
    jobs = [(ADD, tests), (SUB, tests), ("print(", tests), ("while True: pass", tests[:1]),
            ("import os\nos.kill(os.getppid(), 9)", tests[:1]), (ADD, [])]
    verdicts = run_io_tests(jobs, FAST, max_workers=4)
    assert [[v.passed for v in vs] for vs in verdicts] == [[True, True], [False, False], [False, False], [False],
                                                           [False], []]
    assert verdicts[1][0].actual == "-1\n-1\n" and verdicts[1][0].error == ""
    assert "SyntaxError" in verdicts[2][0].error and verdicts[3][0].error == "timed out"
    assert "PermissionError" in verdicts[4][0].error
    assert pass_rate(verdicts[0]) == 1.0 and pass_rate(verdicts[5]) == 0.0


def test_mbpp_and_humaneval_reference_solutions_pass_and_mutants_fail():
    mbpp = [p for p in load_code_problems("mbpp") if 11 <= p["task_id"] <= 16]
    jobs = [(p["code"], p["tests"], p["test_setup_code"]) for p in mbpp]
    mutants = [(p["code"] + "\n" + _break(p), p["tests"], p["test_setup_code"]) for p in mbpp]
    humaneval = load_code_problems("humaneval")[:3]
    he_jobs = [(h["prompt"] + h["canonical_solution"], [h["test"] + f"\ncheck({h['entry_point']})"], "")
               for h in humaneval]
    he_wrong = [(h["prompt"] + "    return None\n", job[1], "") for h, job in zip(humaneval, he_jobs)]
    results = run_assert_tests(jobs + mutants + he_jobs + he_wrong, FAST, max_workers=4)
    n = len(jobs)
    assert all(all(r) for r in results[:n]), results[:n]
    assert not any(any(r) for r in results[n:2 * n]), results[n:2 * n]
    assert results[2 * n:2 * n + 3] == [[True]] * 3 and results[2 * n + 3:] == [[False]] * 3


def _break(problem):
    """Redefine the tested function to return None (the name is in the first assert)."""
    name = problem["tests"][0].split("assert ")[1].split("(")[0].strip()
    return f"def {name}(*args, **kwargs):\n    return None\n"


def test_mismatch_report():
    tests = [("1\n1 2", "3"), ("1\n2 2", "5")]
    verdicts = [Verdict(True, "3\n", ""), Verdict(False, "4\n", "")]
    report = mismatch_report(tests, verdicts)
    assert report.startswith("1 of 2 generated tests pass.") and "Expected output:\n5" in report
    assert "Program output:\n4" in report and "1 2" not in report


# ---------------------------------------------------------------- workflow
def _add_problem_index():
    return next(n for n, p in enumerate(load_problems("apps_test")) if p.id == "apps-1069")


def _workflow(**kw):
    kw.setdefault("test_sets", ("apps_test", "mbpp_test", "humaneval"))
    return CodeWorkflow(limits=FAST, max_workers=4, **kw)


def test_data_sets_and_splits():
    sizes = {name: len(load_problems(name)) for name in DATA_SETS}
    assert sizes == {"apps_train": 184, "apps_test": 47, "mbpp_train": 464, "mbpp_test": 500, "humaneval": 164}
    ids = {name: {p.id for p in load_problems(name)} for name in DATA_SETS}
    assert not ids["apps_train"] & ids["apps_test"] and not ids["mbpp_train"] & ids["mbpp_test"]
    assert all(p.solutions for name in ("mbpp_train", "mbpp_test", "humaneval") for p in load_problems(name))
    wf = _workflow()
    pool = 464 + 184
    assert wf.splits == {"valid": len(range(0, pool, 10)), "apps_test": 47, "mbpp_test": 500, "humaneval": 164}
    assert wf.test_splits == ("apps_test", "mbpp_test", "humaneval")
    with pytest.raises(ValueError, match="has 47 problems"):
        wf.reset([47], "apps_test")  # every problem once: an index past the split is an error, not a wrap
    state = wf.reset([_add_problem_index()], "apps_test")
    assert "add these two numbers" in state["problem"][0].statement and state["problem"][0].kind == "io"
    assert state["gt_tests"][0] == tuple(io_tests(load_code_problems("apps")[75]))
    train_ids = {p.id for p in wf._pool("train")}
    assert not train_ids & {p.id for p in wf._pool("valid")} and not train_ids & ids["apps_test"]


def test_coder_rewards_are_pass_rates():
    wf = _workflow()
    state = wf.reset([_add_problem_index()] * 2, "apps_test")
    state["gt_tests"][1] = (("1\n1 1\n", "2\n"), ("1\n1 2\n", "3\n"))  # PARTIAL passes one of these two
    out = wf.step(state, 0, 0, [[_block(ADD), _block(SUB), "no code", _block("import os\nwhile True: os.fork()")],
                                [_block(PARTIAL), _block(ADD), _block("while True: pass"), "```python\n"]])
    total = out.local_reward + out.team_reward
    np.testing.assert_array_equal(total, [[2, 0, 0, 0], [1, 2, 0, 0]])
    np.testing.assert_array_equal(wf.success(out.state), [[True, False, False, False], [False, True, False, False]])
    np.testing.assert_array_equal(~np.char.startswith(out.parsed_as.astype(str), "unparsed"),
                                  [[True, True, False, True], [True, True, True, False]])
    assert not wf.done(out.state).any()  # no generated tests yet
    for name, leaf in out.state.items():
        assert leaf.shape[:2] == (2, 4), name
    assert out.local_reward.dtype == out.team_reward.dtype == np.float32


def test_a_test_no_correct_program_passes_never_earns_reward():
    """The gaming case: against a wrong program, a test with a nonsense expected output used to agree
    with "the program fails" and earn 1.0. APPS ships no reference solution here, so a test is judged
    against the program under test only once it passes every ground-truth test; before that no test
    earns, not even a copy of the problem's own (the reward for copying is gone)."""
    problem = next(p for p in load_problems("apps_train") if len(p.tests) >= 2)
    wf = _workflow(train_sets=("apps_train",))
    index = list(wf._pool("train")).index(problem)
    state = wf.reset([index], "train")
    state["code"][0] = "print('definitely wrong 12345')"
    real = _tests_text([problem.tests[0]])
    nonsense = _tests_text([(problem.tests[0][0], "definitely wrong 12345")])
    invented = _tests_text([("12345\n", "67890\n")])
    out = wf.step(state, 1, 0, [[real, nonsense, invented, _tests_text([problem.tests[0], problem.tests[1]])]])
    np.testing.assert_array_equal(out.local_reward, [[0.0, 0.0, 0.0, 0.0]])
    # With a program that passes the ground truth (state's pass rate 1), real tests earn, wrong ones do not.
    state = wf.reset([_add_problem_index()], "apps_test")
    state = take_branch(wf.step(state, 0, 0, [[_block(ADD)]]).state, np.array([0]))
    out = wf.step(state, 1, 0, [[_tests_text([("1\n2 3", "5")]), _tests_text([("1\n2 3", "6")]),
                                 _tests_text([("1\n2 3", "")]), _tests_text([("1\n2 3", "5"), ("1\n0 0", "1")])]])
    np.testing.assert_array_equal(out.local_reward, [[1.0, 0.0, 0.0, 0.5]])


def test_function_problems_with_reference_solutions():
    """MBPP: the coder's function is judged by the problem's asserts; the tester's asserts by the
    reference solution, whatever the program under test does."""
    wf = _workflow(train_sets=("mbpp_train",))
    problem = wf._pool("train")[0]
    name = problem.tests[0].split("assert ")[1].split("(")[0].strip()
    state = wf.reset([0, 0], "train")
    out = wf.step(state, 0, 0, [[_block(problem.solutions[0]), _block(f"def {name}(*a):\n    return None\n")],
                                ["no code", _block(problem.solutions[0])]])
    np.testing.assert_array_equal(out.local_reward, [[1.0, 0.0], [0.0, 1.0]])
    assert wf.success(out.state)[0, 0] and not wf.success(out.state)[0, 1]
    state = take_branch(out.state, np.array([1, 0]))  # a wrong program, and no program
    right, wrong = problem.tests[0], problem.tests[0].rsplit("==", 1)[0] + "== 'definitely wrong'"
    out = wf.step(state, 1, 0, [[f"```python\n{right}\n```", f"```python\n{wrong}\n{right}\n```"],
                                [f"```python\n{wrong}\n```", "nothing"]])
    np.testing.assert_array_equal(out.local_reward, [[1.0, 0.5], [0.0, -1.0]])
    text = wf.prompts(take_branch(out.state, np.array([0, 0])), 0, 1)[0][1]["content"]
    assert "0 of 1 generated tests pass." in text and right[:40] in text  # the coder sees the failing assert
    humaneval = _workflow().reset([0], "humaneval")
    h = humaneval["problem"][0]
    out = _workflow().step(humaneval, 0, 0, [[_block(h.solutions[0]), _block("def f(): pass")]])
    np.testing.assert_array_equal(wf.success(out.state), [[True, False]])


def test_tester_rewards_termination_and_what_the_coder_sees_next():
    wf = _workflow()
    state = wf.reset([_add_problem_index()], "apps_test")
    out = wf.step(state, 0, 0, [[_block(SUB), _block(ADD)]])
    state = take_branch(out.state, np.array([1]))  # the correct program
    good = [("1\n1 2", "3"), ("2\n5 5\n0 7", "10\n7")]
    bad = [("1\n1 2", "4")]
    out = wf.step(state, 1, 0, [[_tests_text(good), _tests_text(bad), "I have no tests", ""]])
    np.testing.assert_array_equal(out.local_reward[0, 2:], [-1.0, -1.0])  # (validity: the previous test)
    np.testing.assert_array_equal(out.team_reward, [[1.0] * 4])
    np.testing.assert_array_equal(wf.done(out.state), [[True, False, False, False]])
    assert out.state["gen_tests"][0, 0] == tuple(good)
    # Continue from the branch with a wrong test: the coder's prompt shows that mismatch.
    chosen = take_branch(out.state, np.array([1]))
    text = wf.prompts(chosen, 0, 1)[0][1]["content"]
    assert "0 of 1 generated tests pass." in text and "Expected output:\n4" in text
    assert "Program output:\n3" in text and "a + b" in text and "10\n7" not in text
    # The coder "fixes" its program to satisfy the wrong test: the episode ends, unsuccessfully.
    wrong_fix = ADD.replace("print(a + b)", "print(a + b + 1)")
    out = wf.step(chosen, 0, 1, [[_block(wrong_fix), _block(ADD)]])
    np.testing.assert_array_equal(wf.done(out.state), [[True, False]])
    np.testing.assert_array_equal(wf.success(out.state), [[False, True]])


def test_single_agent_variant_and_factory():
    wf = make_code_workflow(single_agent=True, limits={"wall_s": 2.0, "cpu_s": 2.0}, test_sets="apps_test")
    assert [a.name for a in wf.agents] == ["coder"] and wf.name == "code_single"
    state = wf.reset([_add_problem_index()], "apps_test")
    started = time.perf_counter()
    out = wf.step(state, 0, 0, [[_block(ADD), "thinking...", _block("print(input())")]])
    assert time.perf_counter() - started < 10
    np.testing.assert_array_equal(wf.done(out.state), [[True, False, True]])
    np.testing.assert_array_equal(out.local_reward + out.team_reward, [[2, 0, 0]])
    state = take_branch(out.state, np.array([1]))
    assert "no ```python block" in wf.prompts(state, 0, 1)[0][1]["content"]
    with pytest.raises(ValueError, match="unknown code data set"):
        CodeWorkflow(test_sets=("mbpp",))


def test_simultaneous_turns_show_the_tester_the_turns_starting_program():
    wf = _workflow(simultaneous=True)
    state = wf.reset([_add_problem_index()], "apps_test")
    state = take_branch(wf.step(state, 0, 0, [[_block(SUB)]]).state, np.array([0]))
    assert "a - b" not in wf.prompts(state, 1, 0)[0][1]["content"]  # turn 0: the problem alone
    state = take_branch(wf.step(state, 1, 0, [[_tests_text([("1\n1 2", "3")])]]).state, np.array([0]))
    state = take_branch(wf.step(state, 0, 1, [[_block(ADD)]]).state, np.array([0]))
    text = wf.prompts(state, 1, 1)[0][1]["content"]
    assert "a - b" in text and "a + b" not in text and "0 of 1 generated tests pass." in text
    assert "a + b" in _workflow().prompts(state, 1, 1)[0][1]["content"]
