"""Code workflow: a coder (stdin/stdout program) and a test writer (input/output tests).

Turn order per turn: coder, then test writer. At turn 0 both work from the
problem alone; later the coder sees its program with the mismatches between
the generated tests and its program, and the test writer sees the program and
the same mismatches (so it can correct wrong tests or keep ones that expose a
bug). The episode ends when a program passes all (at least one) generated
tests; success = it passes all ground-truth tests.

Rewards (REFERENCE.md "Code workflow"), with the rollout's r = local + alpha*team:
- team reward = the current program's pass rate on the ground-truth tests;
- coder local = the same pass rate (2 x pass rate in total with alpha = 1);
  no python block = no program = pass rate 0 (`coder_unparsable`, default 0);
- test writer local = agreement of its tests with the ground truth: each
  generated test's verdict on the current program (pass/fail) is compared with
  the ground-truth verdict (the program passes all ground-truth tests or not);
  the reward is the fraction that agree. No parsable test: `tester_unparsable`
  (-1); no program to judge yet: `tester_no_program` (0).

Data: APPS standard-input problems (envs/data/code/apps_stdin.jsonl); problem
i (file order) is in the "apps" test split when i % 5 == 0 (47 problems), else in
the training pool, whose every `valid_every`-th problem is the "valid" split. Single-agent variant (`single_agent=True`): the coder alone;
its episode ends at its first parsable program.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from atgrpo_jax.envs.code_grading import TestVerdict, io_tests, load_code_problems, pass_rate, run_io_tests
from atgrpo_jax.envs.parsers import extract_code_block, extract_test_cases
from atgrpo_jax.envs.sandbox import Limits
from atgrpo_jax.envs.text_state import clip_head, obj_array, response_grid
from atgrpo_jax.envs.workflow import Agent, Messages, StepOut, branch

CODER_SYSTEM = (
    "You are a competitive programmer. Solve the problem with a Python 3 program that reads standard input and "
    "writes standard output. Think briefly, then give the complete program after **Code:** in one ```python block.")
TESTER_SYSTEM = (
    "You write tests for a programming problem. Give a few small tests whose expected output you are sure of, "
    "each as **Test Input:** followed by a ``` block with the exact standard input, then **Test Output:** "
    "followed by a ``` block with the exact expected standard output.")


@dataclasses.dataclass(frozen=True)
class CodeRewards:
    coder_unparsable: float = 0.0
    tester_unparsable: float = -1.0
    tester_no_program: float = 0.0


def split_indices(n: int, split: str, valid_every: int = 10) -> list[int]:
    """Problem indices of a split: every fifth problem (i % 5 == 0) is a test ("apps") problem;
    of the others, every `valid_every`-th is a validation problem, the rest train."""
    if split not in ("train", "valid", "apps"):
        raise ValueError(f"split must be 'train', 'valid' or 'apps', got {split!r}")
    if split == "apps":
        return [i for i in range(n) if i % 5 == 0]
    pool = [i for i in range(n) if i % 5]
    return [i for j, i in enumerate(pool) if (j % valid_every == 0) == (split == "valid")]


def mismatch_report(tests: Sequence[tuple[str, str]], verdicts: Sequence[TestVerdict], max_shown: int = 4) -> str:
    """What the coder sees: how many generated tests pass, and the first failing ones."""
    if not tests:
        return "No generated tests yet."
    failing = [(t, v) for t, v in zip(tests, verdicts) if not v.passed]
    lines = [f"{len(tests) - len(failing)} of {len(tests)} generated tests pass."]
    for n, ((stdin, expected), verdict) in enumerate(failing[:max_shown], 1):
        got = f"Error: {verdict.error}" if verdict.error else f"Program output:\n{clip_head(verdict.actual, 500)}"
        lines.append(f"Failing test {n}:\nInput:\n{clip_head(stdin, 500)}\nExpected output:\n"
                     f"{clip_head(expected, 500)}\n{got}")
    return "\n\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CodeWorkflow:
    dataset: str = "apps"
    valid_every: int = 10  # every n-th problem of the training pool is the validation split
    max_turns: int = 4
    single_agent: bool = False
    max_gt_tests: int | None = 20  # ground-truth tests run per program (the first ones)
    max_generated_tests: int = 8
    limits: Limits = Limits(wall_s=5.0, cpu_s=5.0, memory_mb=1024)
    max_workers: int | None = None
    rewards: CodeRewards = CodeRewards()
    max_shown_chars: int = 6000

    def __post_init__(self):
        if self.dataset != "apps":
            raise ValueError("the code workflow runs stdin/stdout problems: dataset must be 'apps' "
                             "(MBPP/HumanEval are graded with code_grading.run_assert_tests)")
        load_code_problems(self.dataset)

    @property
    def splits(self) -> dict[str, int]:
        n = len(load_code_problems(self.dataset))
        return {split: len(split_indices(n, split, self.valid_every)) for split in ("valid", "apps")}

    @property
    def test_splits(self) -> tuple[str, ...]:
        return ("apps",)

    @property
    def name(self) -> str:
        return "code_single" if self.single_agent else "code"

    @property
    def agents(self) -> tuple[Agent, ...]:
        coder = Agent("coder", extract_code_block)
        return (coder,) if self.single_agent else (coder, Agent("tester", extract_test_cases))

    # ------------------------------------------------------------ state
    def reset(self, task_ids: Sequence[int], split: str) -> dict[str, np.ndarray]:
        problems = load_code_problems(self.dataset)
        pool = split_indices(len(problems), split, self.valid_every)
        if split != "train" and any(int(i) >= len(pool) for i in task_ids):
            raise ValueError(f"split {split!r} has {len(pool)} problems; task ids must be below that")
        rows = [problems[pool[int(i) % len(pool)]] for i in task_ids]
        n = len(rows)
        return {
            "problem": obj_array([r["question"] for r in rows]),
            "gt_tests": obj_array([tuple(io_tests(r, self.max_gt_tests)) for r in rows]),
            "code": obj_array([""] * n),
            "gen_tests": obj_array([()] * n),
            "report": obj_array([""] * n),
            "gt_pass_rate": np.zeros(n, np.float32),
            "passes_generated": np.zeros(n, bool),
            "done": np.zeros(n, bool),
        }

    def done(self, state) -> np.ndarray:
        return np.asarray(state["done"], bool)

    def success(self, state) -> np.ndarray:
        return np.asarray(state["gt_pass_rate"], np.float32) >= 1.0

    # ------------------------------------------------------------ prompts
    def prompts(self, state, agent: int, turn: int) -> list[Messages]:
        role = self.agents[agent].name
        return [self._prompt(role, turn, {k: v[b] for k, v in state.items()}) for b in range(len(state["done"]))]

    def _prompt(self, role: str, turn: int, s: dict[str, Any]) -> Messages:
        parts = [f"Problem:\n{clip_head(s['problem'], self.max_shown_chars)}"]
        program = f"```python\n{clip_head(s['code'], self.max_shown_chars)}\n```" if s["code"] else "(none)"
        if role == "coder":
            if turn == 0:
                parts.append("Write the program.")
            elif self.single_agent:
                parts.append("Your previous reply had no ```python block. Write the complete program.")
            else:
                parts.append(f"Your previous program:\n{program}\n\nIts results on the tests written by your "
                             f"partner:\n{s['report']}\n\nFix the program if it is wrong. If you are sure a test "
                             "is wrong, keep the program. Give the complete program.")
            return [{"role": "system", "content": CODER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
        if turn == 0:
            parts.append("Write the tests.")
        else:
            parts.append(f"The program under test:\n{program}\n\nIts results on your tests:\n{s['report']}\n\n"
                         "Check every failing test by hand: correct the tests that are wrong, keep the ones that "
                         "expose a real bug, and add tests for cases not covered yet. Give the full list of tests.")
        return [{"role": "system", "content": TESTER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]

    # ------------------------------------------------------------ step
    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        grid = response_grid(responses, len(state["done"]))
        k = len(grid[0])
        out = branch(state, k)
        shape = (len(grid), k)
        local = np.zeros(shape, np.float32)
        info = {"parsed": np.zeros(shape, bool), "agreement": np.full(shape, np.nan, np.float32)}
        active = [(b, j) for b in range(shape[0]) if not state["done"][b] for j in range(k)]
        if self.agents[agent].name == "coder":
            for b, j in active:
                out["code"][b, j] = extract_code_block(grid[b][j]) or ""
                info["parsed"][b, j] = bool(out["code"][b, j])
        else:
            for b, j in active:
                out["gen_tests"][b, j] = tuple(extract_test_cases(grid[b][j], self.max_generated_tests))
                info["parsed"][b, j] = bool(out["gen_tests"][b, j])
        is_coder = self.agents[agent].name == "coder"
        generated = self._evaluate(out, active, run_ground_truth=is_coder)
        team = np.where(state["done"][:, None], 0.0, out["gt_pass_rate"]).astype(np.float32)
        r = self.rewards
        for b, j in active:
            if is_coder:
                has_code = bool(out["code"][b, j])
                local[b, j] = out["gt_pass_rate"][b, j] if has_code else r.coder_unparsable
                if self.single_agent:
                    out["done"][b, j] = has_code
            elif not out["gen_tests"][b, j]:
                local[b, j] = r.tester_unparsable
            elif not out["code"][b, j]:
                local[b, j] = r.tester_no_program
            else:
                correct = out["gt_pass_rate"][b, j] >= 1.0
                agreement = np.mean([v.passed == correct for v in generated[(b, j)]])
                local[b, j] = info["agreement"][b, j] = agreement
        parsed_as = obj_array([""] * (shape[0] * k)).reshape(shape)
        for b, j in active:
            if is_coder:
                lines = out["code"][b, j].count("\n") + 1
                parsed_as[b, j] = f"a program of {lines} lines" if out["code"][b, j] else "unparsed: no ```python block"
            else:
                n = len(out["gen_tests"][b, j])
                parsed_as[b, j] = f"{n} tests" if n else "unparsed: no **Test Input:** / **Test Output:** pair"
        return StepOut(state=out, local_reward=local, team_reward=team, done=out["done"].copy(),
                       success=out["gt_pass_rate"] >= 1.0, info=info, parsed_as=parsed_as)

    def _evaluate(self, out, active, run_ground_truth: bool) -> dict[tuple[int, int], list[TestVerdict]]:
        """Run programs on the generated tests (and, for a new program, the ground truth); update the state.

        Returns each branch's verdicts on its generated tests.
        """
        with_code = [(b, j) for b, j in active if out["code"][b, j]]
        jobs = [(out["code"][b, j], out["gen_tests"][b, j]) for b, j in with_code]
        if run_ground_truth:
            jobs += [(out["code"][b, j], out["gt_tests"][b, j]) for b, j in with_code]
        verdicts = run_io_tests(jobs, self.limits, self.max_workers) if jobs else []
        generated = {}
        for n, (b, j) in enumerate(with_code):
            generated[(b, j)] = verdicts[n]
            out["report"][b, j] = mismatch_report(out["gen_tests"][b, j], verdicts[n])
            out["passes_generated"][b, j] = bool(verdicts[n]) and all(v.passed for v in verdicts[n])
            if run_ground_truth:
                out["gt_pass_rate"][b, j] = pass_rate(verdicts[len(with_code) + n])
        for b, j in active:
            if not out["code"][b, j]:
                out["report"][b, j], out["passes_generated"][b, j] = "No program yet.", False
                out["gt_pass_rate"][b, j] = 0.0
            out["done"][b, j] = out["passes_generated"][b, j]
        return generated


def make_code_workflow(single_agent: bool = False, **kwargs) -> CodeWorkflow:
    """Factory for configs (envs.registry); `limits` may be a dict of sandbox.Limits fields."""
    if isinstance(kwargs.get("limits"), dict):
        kwargs["limits"] = Limits(**kwargs["limits"])
    if isinstance(kwargs.get("rewards"), dict):
        kwargs["rewards"] = CodeRewards(**kwargs["rewards"])
    return CodeWorkflow(single_agent=single_agent, **kwargs)
