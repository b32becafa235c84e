"""Code problems of two kinds, their data sets, and how programs and tests are judged.

- "io" (APPS): a program reads standard input and writes standard output; a test is an
  (input, expected output) pair; outputs compare as the APPS checker does.
- "function" (MBPP, HumanEval): a program defines the function the problem names; a test is
  an assert statement (HumanEval: its whole `check(entry_point)` suite counts as one test).

A problem may carry reference solutions (MBPP's code, HumanEval's canonical solution, each
verified to pass its tests). A test written by a model counts when it is real: not degenerate,
passed by a correct program and failed by a wrong one (envs/code_mutants.py). Data sets are in
envs/data/code (sources and licenses: SOURCES.md).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import re
from typing import Sequence

from atgrpo_jax.envs.code_grading import (TEST_LIMITS, TestVerdict, _run_unique, describe_failure, load_code_problems,
                                          run_io_tests)
from atgrpo_jax.envs import code_mutants
from atgrpo_jax.envs.code_sources import load_source_problems
from atgrpo_jax.envs.parsers import extract_code_block, extract_test_cases
from atgrpo_jax.envs.sandbox import Limits


@dataclasses.dataclass(frozen=True)
class CodeProblem:
    id: str
    kind: str  # "io" or "function"
    statement: str  # what the agents are shown
    tests: tuple  # io: ((stdin, stdout), ...); function: (assert statement, ...)
    setup: str = ""  # function: code run before the program (MBPP's test_setup_code)
    solutions: tuple = ()  # reference solutions that pass `tests`
    wrong_solutions: tuple = ()  # known-wrong programs (CodeContests' incorrect_solutions), mutants' peers


def _apps(split: str) -> tuple[CodeProblem, ...]:
    rows = load_code_problems("apps")
    keep = [r for i, r in enumerate(rows) if (i % 5 == 0) == (split == "test")]  # every 5th: a test problem
    return tuple(CodeProblem(r["id"], "io", r["question"], tuple((t["input"], t["output"]) for t in r["tests"]),
                             solutions=tuple(r.get("solutions", ()))) for r in keep)


def _mbpp(first: int, last: int) -> tuple[CodeProblem, ...]:
    rows = [r for r in load_code_problems("mbpp") if first <= r["task_id"] <= last]
    return tuple(CodeProblem(r["id"], "function", f"{r['prompt']}\nYour function must pass tests like:\n"
                             f"{r['tests'][0]}", tuple(r["tests"]), r["test_setup_code"], (r["code"],)) for r in rows)


def _humaneval() -> tuple[CodeProblem, ...]:
    return tuple(CodeProblem(r["id"], "function", f"Complete this function:\n```python\n{r['prompt']}```",
                             (f"{r['test']}\ncheck({r['entry_point']})",), solutions=(r["prompt"] + r["canonical_solution"],))
                 for r in load_code_problems("humaneval"))


DATA_SETS = {  # name -> problems
    "apps_train": lambda: _apps("train"),  # 184 stdin/stdout problems
    "apps_test": lambda: _apps("test"),  # 47
    "mbpp_train": lambda: _mbpp(511, 974),  # 464 functions, MBPP's validation and training ranges
    "mbpp_test": lambda: _mbpp(11, 510),  # 500, MBPP's evaluation range
    "humaneval": _humaneval,  # 164
}


@functools.lru_cache(maxsize=None)
def load_problems(name: str, fields: tuple = (), data_dir: str = "") -> tuple[CodeProblem, ...]:
    """A shipped set, a prepared one or a source of your own (code_sources.py); fields: ((ours, column), ...)."""
    if name in DATA_SETS:
        return DATA_SETS[name]()
    problems = load_source_problems(name, dict(fields), data_dir, tuple(sorted(DATA_SETS)))
    return tuple(CodeProblem(**p) for p in problems)


# ---------------------------------------------------------------- tests written by a model

_ASSERT = re.compile(r"^assert\b.*$", re.MULTILINE)


def extract_asserts(text: str, max_cases: int) -> list[str]:
    """The top-level assert statements of the answer's python block (or of the text), each one test."""
    code = extract_code_block(text) or (text if isinstance(text, str) else "")
    try:
        tree = ast.parse(code)
        found = [ast.get_source_segment(code, node) for node in tree.body if isinstance(node, ast.Assert)]
    except (SyntaxError, ValueError):
        found = [m.group(0) for m in _ASSERT.finditer(code)]
    return [a for a in found if a][:max_cases]


def extract_tests(kind: str, text: str, max_cases: int) -> tuple:
    return tuple(extract_test_cases(text, max_cases) if kind == "io" else extract_asserts(text, max_cases))


# ---------------------------------------------------------------- judging

def run_tests(jobs: Sequence[tuple[CodeProblem, str, Sequence]], limits: Limits = TEST_LIMITS,
              max_workers: int | None = None, match: str = "apps") -> list[list[TestVerdict]]:
    """For each (problem, program, tests), one verdict per test (one sandbox run each, distinct runs once;
    stdout compared under rule `match`, code_grading.outputs_match)."""
    io = [i for i, (p, _, _) in enumerate(jobs) if p.kind == "io"]
    out: list = [None] * len(jobs)
    for i, verdicts in zip(io, run_io_tests([(jobs[i][1], jobs[i][2]) for i in io], limits, max_workers, match)):
        out[i] = verdicts
    programs, where = [], []
    for i, (p, program, tests) in enumerate(jobs):
        if p.kind == "function":
            for t, test in enumerate(tests):
                programs.append(f"{p.setup}\n{program}\n\n{test}\n")
                where.append((i, t))
            out[i] = [None] * len(tests)
    for (i, t), result in zip(where, _run_unique(programs, [""] * len(programs), limits, max_workers)):
        error = describe_failure(result)
        out[i][t] = TestVerdict(passed=result.ok and not error, actual=result.stdout, error=error)
    return out


def valid_tests(jobs: Sequence[tuple[CodeProblem, Sequence, str | None]], limits: Limits = TEST_LIMITS,
                max_workers: int | None = None, match: str = "apps") -> list[list[bool]]:
    """For each (problem, generated tests, a program known to pass every ground-truth test or None):
    whether each test is real (envs/code_mutants.py), judged against the problem's first reference
    solution, or that program for a problem without one."""
    return real_tests([(p, tests, p.solutions[0] if p.solutions else known) for p, tests, known in jobs],
                      limits, max_workers, match)


def real_tests(jobs: Sequence[tuple], limits: Limits, max_workers: int | None = None,
               match: str = "apps") -> list[list[bool]]:
    """For each (problem, generated tests, correct program or None): whether each test is real
    (envs/code_mutants.py's docstring says when one is)."""
    out = [[False] * len(tests) for _, tests, _ in jobs]
    alive = [(i, t) for i, (p, tests, ref) in enumerate(jobs) if ref
             for t, test in enumerate(tests) if not code_mutants.degenerate(p.kind, test, code_mutants.entry_point(p))]
    mutant_limits = dataclasses.replace(limits, wall_s=min(limits.wall_s, code_mutants.MUTANT_WALL_S),
                                        cpu_s=min(limits.cpu_s, code_mutants.MUTANT_WALL_S))

    def fails(program_of, cases, lim):
        runs = run_tests([(jobs[i][0], program_of(i), [jobs[i][1][t]]) for i, t in cases], lim, max_workers, match)
        return [not v[0].passed for v in runs]

    alive = [c for c, failed in zip(alive, fails(lambda i: jobs[i][2], alive, limits)) if not failed]
    table = {i: tuple(jobs[i][0].wrong_solutions[:code_mutants.MAX_KNOWN_WRONG])
             + code_mutants.mutants(jobs[i][2], jobs[i][0].kind, code_mutants.entry_point(jobs[i][0])) for i, _ in alive}
    for m in range(max((len(w) for w in table.values()), default=0)):
        now = [(i, t) for i, t in alive if len(table[i]) > m]
        if not now:
            break
        killed = {c for c, failed in zip(now, fails(lambda i: table[i][m], now, mutant_limits)) if failed}
        for i, t in killed:
            out[i][t] = True
        alive = [c for c in alive if c not in killed]
    return out
