"""Code grading (stdin/stdout and assert harnesses) and the code workflow with scripted agents."""
import time

import numpy as np
import pytest

from atgrpo_jax.envs.code_grading import TestVerdict as Verdict
from atgrpo_jax.envs.code_grading import (
    io_tests, load_code_problems, outputs_match, pass_rate, run_assert_tests, run_io_tests)
from atgrpo_jax.envs.code_workflow import CodeWorkflow, make_code_workflow, mismatch_report, split_indices
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
def _add_problem_index(split="apps"):
    problems = load_code_problems("apps")
    pool = split_indices(len(problems), split)
    return next(n for n, i in enumerate(pool) if problems[i]["id"] == "apps-1069")


def _workflow(**kw):
    return CodeWorkflow(limits=FAST, max_workers=4, **kw)


def test_splits_are_disjoint_and_cover_the_data():
    n = len(load_code_problems("apps"))
    train, valid, test = (set(split_indices(n, s)) for s in ("train", "valid", "apps"))
    assert not train & test and not train & valid and not valid & test
    assert len(train) + len(valid) + len(test) == n == 231 and len(test) == 47 and len(valid) == 19
    wf = _workflow()
    assert wf.splits == {"valid": 19, "apps": 47} and wf.test_splits == ("apps",)
    with pytest.raises(ValueError, match="has 47 problems"):
        wf.reset([47], "apps")  # every problem once: an index past the split is an error, not a wrap
    state = wf.reset([_add_problem_index()], "apps")
    assert "add these two numbers" in state["problem"][0]
    assert state["gt_tests"][0] == tuple(io_tests(load_code_problems("apps")[75]))


def test_coder_rewards_are_pass_rates():
    wf = _workflow()
    state = wf.reset([_add_problem_index()] * 2, "apps")
    state["gt_tests"][1] = (("1\n1 1\n", "2\n"), ("1\n1 2\n", "3\n"))  # PARTIAL passes one of these two
    out = wf.step(state, 0, 0, [[_block(ADD), _block(SUB), "no code", _block("import os\nwhile True: os.fork()")],
                                [_block(PARTIAL), _block(ADD), _block("while True: pass"), "```python\n"]])
    total = out.local_reward + out.team_reward
    np.testing.assert_array_equal(total, [[2, 0, 0, 0], [1, 2, 0, 0]])
    np.testing.assert_array_equal(out.success, [[True, False, False, False], [False, True, False, False]])
    np.testing.assert_array_equal(out.info["parsed"], [[True, True, False, True], [True, True, True, False]])
    assert not out.done.any()  # no generated tests yet
    for name, leaf in out.state.items():
        assert leaf.shape[:2] == (2, 4), name
    assert out.local_reward.dtype == out.team_reward.dtype == np.float32


def test_tester_rewards_termination_and_what_the_coder_sees_next():
    wf = _workflow()
    state = wf.reset([_add_problem_index()], "apps")
    out = wf.step(state, 0, 0, [[_block(SUB), _block(ADD)]])
    state = take_branch(out.state, np.array([1]))  # the correct program
    good = [("1\n1 2", "3"), ("2\n5 5\n0 7", "10\n7")]
    bad = [("1\n1 2", "4")]
    responses = [[_tests_text(good), _tests_text(bad), _tests_text(good + bad), "I have no tests", ""]]
    out = wf.step(state, 1, 0, responses)
    np.testing.assert_allclose(out.local_reward, [[1.0, 0.0, 2 / 3, -1.0, -1.0]])
    np.testing.assert_array_equal(out.team_reward, [[1.0] * 5])
    np.testing.assert_array_equal(out.done, [[True, False, False, False, False]])
    assert out.state["gen_tests"][0, 0] == tuple(good)

    # Continue from the branch with a wrong test: the coder's prompt shows that mismatch.
    chosen = take_branch(out.state, np.array([1]))
    text = wf.prompts(chosen, 0, 1)[0][1]["content"]
    assert "0 of 1 generated tests pass." in text and "Expected output:\n4" in text
    assert "Program output:\n3" in text and "a + b" in text and "10\n7" not in text
    # The coder "fixes" its program to satisfy the wrong test: the episode ends, unsuccessfully.
    wrong_fix = ADD.replace("print(a + b)", "print(a + b + 1)")
    out = wf.step(chosen, 0, 1, [[_block(wrong_fix), _block(ADD)]])
    np.testing.assert_array_equal(out.done, [[True, False]])
    np.testing.assert_array_equal(out.success, [[False, True]])


def test_tester_against_a_wrong_program_and_without_a_program():
    wf = _workflow()
    state = wf.reset([_add_problem_index()] * 2, "apps")
    out = wf.step(state, 0, 0, [[_block(SUB)], ["no code at all"]])
    state = take_branch(out.state, np.array([0, 0]))
    good = _tests_text([("1\n1 2", "3")])
    out = wf.step(state, 1, 0, [[good, _tests_text([("1\n2 1", "1")])], [good, "nothing"]])
    # Wrong program: a test that fails it agrees with the ground truth; one it passes does not.
    np.testing.assert_array_equal(out.local_reward, [[1.0, 0.0], [0.0, -1.0]])
    np.testing.assert_array_equal(out.team_reward, [[0.0, 0.0], [0.0, 0.0]])
    # The program passes every test of branch (0, 1): by the rule, that ends the episode (unsuccessfully).
    np.testing.assert_array_equal(out.done, [[False, True], [False, False]])
    assert not out.success.any()


def test_single_agent_variant_and_factory():
    wf = make_code_workflow(single_agent=True, limits={"wall_s": 2.0, "cpu_s": 2.0})
    assert [a.name for a in wf.agents] == ["coder"] and wf.name == "code_single"
    state = wf.reset([_add_problem_index()], "apps")
    started = time.perf_counter()
    out = wf.step(state, 0, 0, [[_block(ADD), "thinking...", _block("print(input())")]])
    assert time.perf_counter() - started < 10
    np.testing.assert_array_equal(out.done, [[True, False, True]])
    np.testing.assert_array_equal(out.local_reward + out.team_reward, [[2, 0, 0]])
    state = take_branch(out.state, np.array([1]))
    assert "no ```python block" in wf.prompts(state, 0, 1)[0][1]["content"]
    with pytest.raises(ValueError):
        CodeWorkflow(dataset="mbpp")
