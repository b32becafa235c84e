"""Grading programs against tests, in the sandbox.

- Standard-input problems (APPS style): each (program, test) pair is one
  sandboxed run. Rule "apps": the output matches when, line by line, it
  equals the expected output with trailing whitespace and trailing blank
  lines ignored (the APPS checker's rule), or, failing that, when the
  whitespace-separated tokens agree with numbers compared to 1e-6 (APPS also
  accepts this). Rule "whitespace" (the reference's): the two texts are equal
  once every run of whitespace is one space and the ends are stripped.
- Function-style problems (MBPP, HumanEval): the program is followed by one
  assert test (or HumanEval's `check(entry_point)`) per run; a test passes
  when the run exits with status 0.

All runs of a call go through one `run_many`, so they share the worker pool;
identical (program, stdin) pairs run once. Nothing here raises on bad programs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from atgrpo_jax.envs.sandbox import Limits, RunResult, run_many
from atgrpo_jax.envs.text_state import load_jsonl

CODE_DATASETS = {"apps": "code/apps_stdin.jsonl", "mbpp": "code/mbpp.jsonl", "humaneval": "code/humaneval.jsonl"}
TEST_LIMITS = Limits(wall_s=5.0, cpu_s=5.0, memory_mb=1024, max_output_bytes=1 << 20)


@dataclasses.dataclass(frozen=True)
class TestVerdict:
    passed: bool
    actual: str  # the program's stdout ("" when it failed before printing)
    error: str  # "" when the program ran normally, else why not ("timed out", the error's last line, ...)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in str(text).replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _tokens_match(actual: str, expected: str) -> bool:
    xs, ys = str(actual).split(), str(expected).split()
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(fx, fy, rel_tol=1e-6, abs_tol=1e-6):
            return False
    return True


MATCH_RULES = ("apps", "whitespace")


def outputs_match(actual: str, expected: str, rule: str = "apps") -> bool:
    """Whether a program's output matches the expected one under `rule` (see module docstring)."""
    if rule == "whitespace":
        return " ".join(str(actual).split()) == " ".join(str(expected).split())
    if rule != "apps":
        raise ValueError(f"unknown output rule {rule!r}; choose one of {MATCH_RULES}")
    return _lines(actual) == _lines(expected) or _tokens_match(actual, expected)


def describe_failure(result: RunResult) -> str:
    if result.sandbox_error:
        return "sandbox error"
    if result.timed_out:
        return "timed out"
    if result.memory_exceeded:
        return "memory limit exceeded"
    if result.output_truncated:
        return "output too large"
    if result.killed_signal:
        return f"killed by signal {result.killed_signal}"
    if result.exit_code:
        tail = [line for line in result.stderr_tail.splitlines() if line.strip()]
        return tail[-1][:300] if tail else f"exit status {result.exit_code}"
    return ""


def _run_unique(programs: Sequence[str], stdins: Sequence[str], limits: Limits, max_workers) -> list[RunResult]:
    """run_many over (program, stdin) pairs, running each distinct pair once."""
    order = {}
    for pair in zip(programs, stdins):
        order.setdefault(pair, len(order))
    unique = list(order)
    results = run_many([p for p, _ in unique], [s for _, s in unique], limits, max_workers)
    return [results[order[pair]] for pair in zip(programs, stdins)]


def run_io_tests(
    jobs: Sequence[tuple[str, Sequence[tuple[str, str]]]],
    limits: Limits = TEST_LIMITS,
    max_workers: int | None = None,
    match: str = "apps",
) -> list[list[TestVerdict]]:
    """For each (program, [(stdin, expected stdout), ...]) job, one verdict per test (outputs compared
    under rule `match`)."""
    programs, stdins, where = [], [], []
    for j, (program, tests) in enumerate(jobs):
        for t, (stdin, _) in enumerate(tests):
            programs.append(str(program))
            stdins.append(stdin if str(stdin).endswith("\n") or not stdin else f"{stdin}\n")
            where.append((j, t))
    verdicts = [[None] * len(tests) for _, tests in jobs]
    for (j, t), result in zip(where, _run_unique(programs, stdins, limits, max_workers)):
        expected = jobs[j][1][t][1]
        error = describe_failure(result)
        passed = not error and result.ok and outputs_match(result.stdout, expected, match)
        verdicts[j][t] = TestVerdict(passed=passed, actual=result.stdout, error=error)
    return verdicts


def run_assert_tests(
    jobs: Sequence[tuple[str, Sequence[str], str]],
    limits: Limits = TEST_LIMITS,
    max_workers: int | None = None,
) -> list[list[bool]]:
    """For each (program, [assert statement, ...], setup code) job, whether each assert passes."""
    programs, where = [], []
    for j, (program, tests, setup) in enumerate(jobs):
        for t, test in enumerate(tests):
            programs.append(f"{setup}\n{program}\n\n{test}\n")
            where.append((j, t))
    passed = [[False] * len(tests) for _, tests, _ in jobs]
    for (j, t), result in zip(where, _run_unique(programs, [""] * len(programs), limits, max_workers)):
        passed[j][t] = result.ok
    return passed


def pass_rate(verdicts: Sequence[TestVerdict | bool]) -> float:
    flags = [v.passed if isinstance(v, TestVerdict) else bool(v) for v in verdicts]
    return sum(flags) / len(flags) if flags else 0.0


def load_code_problems(name: str) -> tuple[dict, ...]:
    if name not in CODE_DATASETS:
        raise ValueError(f"unknown code data set {name!r}; choose one of {sorted(CODE_DATASETS)}")
    return load_jsonl(CODE_DATASETS[name])


def io_tests(problem: dict, max_tests: int | None = None) -> list[tuple[str, str]]:
    """An APPS problem's ground-truth tests as (stdin, stdout) pairs, the first max_tests of them."""
    tests = [(t["input"], t["output"]) for t in problem["tests"]]
    return tests if max_tests is None else tests[:max_tests]
