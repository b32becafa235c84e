"""The test writer's reward: only real tests earn (not degenerate, pass a correct program, fail a mutant)."""
import ast

import pytest
from atgrpo_jax.envs.code_mutants import MAX_MUTANTS, degenerate, entry_point, mutants
from atgrpo_jax.envs.code_problems import load_problems, real_tests, run_tests
from atgrpo_jax.envs.sandbox import Limits

FAST = Limits(wall_s=2.0, cpu_s=2.0, memory_mb=512)
ADD = "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a + b)\n"


def _mbpp():
    return load_problems("mbpp_train")[0]  # find_Min_Sum: the sum of a number's prime factors


def test_mutants_are_wrong_programs_of_the_right_shape():
    p = _mbpp()
    name = entry_point(p)
    assert name == "find_Min_Sum" and entry_point(load_problems("humaneval")[0]) == "has_close_elements"
    ms = mutants(p.solutions[0], "function", name)
    assert 3 <= len(ms) <= MAX_MUTANTS and len(set(ms)) == len(ms) and p.solutions[0] not in ms
    assert ms == mutants(p.solutions[0], "function", name)  # deterministic (and cached)
    for m in ms:
        ast.parse(m)
    # Most mutants fail one of the problem's own tests (a point mutation can be equivalent on three tests,
    # and a mutant's endless loop answers as the correct program does: code_mutants.typed).
    runs = run_tests([(p, m, p.tests) for m in ms], FAST, max_workers=4)
    assert sum(not all(v.passed for v in verdicts) for verdicts in runs) >= len(ms) // 2, \
        [[v.passed for v in r] for r in runs]
    assert mutants(ADD, "io")[:2] == ("pass\n", "print(0)\n") and len(mutants(ADD, "io", max_mutants=2)) == 2


@pytest.mark.parametrize("test,why", [
    ("assert True", "asserts a constant"),
    ("assert 1 == 1", "asserts a constant"),
    ("assert find_Min_Sum(12) == find_Min_Sum(12)", "compares a value with itself"),
    ("assert len([1, 2]) == 2", "never calls the entry point"),
    ("x = find_Min_Sum(12)", "no assert"),
    ("assert find_Min_Sum(12) == 7", ""),
])
def test_degenerate_asserts(test, why):
    assert degenerate("function", test, "find_Min_Sum") == why


def test_degenerate_io_tests_and_asserts_without_an_entry_point():
    assert degenerate("io", ("1\n2 3\n", "  \n"), "") == "empty expected output"
    assert degenerate("io", ("1\n2 3\n", "5\n"), "") == ""
    assert degenerate("function", "assert 1 == 1", "") == "asserts a constant"


def test_only_real_tests_earn_on_a_function_problem():
    p = _mbpp()
    tests = ["assert True", "assert 1 == 1", "assert find_Min_Sum(12) == find_Min_Sum(12)",
             "assert len([1, 2]) == 2",
             "assert str(find_Min_Sum(1)) != 'x'",  # calls it, passes it, but no mutant fails it
             "assert find_Min_Sum(12) == 8",  # wrong
             p.tests[0], "assert find_Min_Sum(105) == 15"]  # real: 3 + 5 + 7
    got = real_tests([(p, tests, p.solutions[0]), (p, tests, None)], FAST, max_workers=4)
    assert got == [[False] * 6 + [True, True], [False] * 8]
    h = load_problems("humaneval")[0]
    he = ["assert has_close_elements([1.0, 2.0], 0.5) == False", "assert has_close_elements([1.0], 0.5) == True",
          "assert True", "assert has_close_elements([1.0, 1.1], 0.5) == has_close_elements([1.0, 1.1], 0.5)"]
    assert real_tests([(h, he, h.solutions[0])], FAST, max_workers=4) == [[True, False, False, False]]


def test_type_checks_alone_or_bundled_earn_nothing_and_real_tests_still_do():
    """A wrong program of the right result type passes a type check: no mutant of a function may change
    its result's type, or `assert isinstance(f(x), int)` would kill the empty-body mutant and earn."""
    p = _mbpp()
    tests = ["assert isinstance(find_Min_Sum(12), float)",  # (its `num /= i` makes the result a float)
             "assert isinstance(find_Min_Sum(12), float)\nassert isinstance(find_Min_Sum(1), int)\n"
             "assert type(find_Min_Sum(30)) is float",
             "assert find_Min_Sum(12) is not None",
             "assert find_Min_Sum(105) == 15", "assert find_Min_Sum(12) >= 7 and find_Min_Sum(12) <= 7"]
    assert real_tests([(p, tests, p.solutions[0])], FAST, max_workers=4) == [[False, False, False, True, True]]
    for m in mutants(p.solutions[0], "function", "find_Min_Sum"):  # every mutant keeps the result's type
        assert run_tests([(p, m, [tests[0]])], FAST)[0][0].passed
    h = load_problems("humaneval")[0]  # a bool result: the empty value is False
    assert real_tests([(h, ["assert isinstance(has_close_elements([1.0], 0.5), bool)",
                            "assert has_close_elements([1.0, 1.1], 0.5) is True"], h.solutions[0])],
                      FAST, max_workers=4) == [[False, True]]


def test_only_real_tests_earn_on_a_stdin_problem():
    from atgrpo_jax.envs.code_problems import CodeProblem

    p = CodeProblem("add", "io", "Add pairs.", (("1\n1 2\n", "3\n"),))
    tests = [("1\n2 3\n", "5\n"), ("1\n2 3\n", ""), ("1\n2 3\n", "6\n"), ("1\n0 0\n", "0\n"), ("2\n1 1\n4 5", "2\n9")]
    got = real_tests([(p, tests, ADD), (p, tests, None)], FAST, max_workers=4)
    assert got == [[True, False, False, True, True], [False] * 5]  # (the empty mutant prints nothing)
    # A test passed by the correct program and by every mutant earns nothing: "print(0)" and "a - b" agree
    # with a + b on 0 0, so only the empty mutant fails it; with that one left out nothing does.
    others = mutants(ADD, "io")[1:]
    assert len(others) == 2 and all(v[0].passed for v in run_tests([(p, m, [tests[3]]) for m in others], FAST))


def test_a_problems_known_wrong_programs_kill_tests_too(monkeypatch):
    """CodeContests ships incorrect_solutions: a test that one of them fails is real even where no
    mutant would fail it (here: no mutants at all)."""
    import dataclasses

    from atgrpo_jax.envs import code_mutants
    from atgrpo_jax.envs.code_problems import CodeProblem
    from atgrpo_jax.envs.code_sources import problem_fields
    monkeypatch.setattr(code_mutants, "mutants", lambda *a, **k: ())
    wrong = "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a + b + (a > 5))\n"
    record = {"id": "cc", "question": "add", "tests": [{"input": "1\n1 2\n", "output": "3\n"}],
              "solutions": [ADD], "incorrect_solutions": [wrong]}
    p = CodeProblem(**problem_fields(record, "cc"))
    assert p.wrong_solutions == (wrong,)
    tests = [("1\n9 1\n", "10\n"), ("1\n1 1\n", "2\n")]  # only the first tells the wrong one apart
    assert real_tests([(p, tests, ADD)], FAST, max_workers=2) == [[True, False]]
    assert real_tests([(dataclasses.replace(p, wrong_solutions=()), tests, ADD)], FAST) == [[False, False]]
