"""Code workflow: a coder (a program or a function) and a test writer (tests); contract in `workflow.py`.

Turn order per turn: coder, then test writer. At turn 0 both work from the problem alone; later
the coder sees its program with the generated tests it fails, and the test writer sees the
program and the same mismatches (so it can correct wrong tests or keep ones that expose a bug).
With `simultaneous=True` (the reference's parallel turns) the test writer is shown the
program and report as the turn began, not the program the coder wrote beside it in the same
turn. The episode ends when a program passes all (at least one) generated tests; success = it
passes all ground-truth tests.

Problems come in two kinds (envs/code_problems.py): "io" (APPS: stdin/stdout programs, tests
as **Test Input:** / **Test Output:** blocks) and "function" (MBPP, HumanEval: a function,
tests as assert statements in a python block).

Rewards (docs/paper.md), with the rollout's r = local + alpha * team:
- team reward = the current program's pass rate on the ground-truth tests;
- coder local = the same pass rate (2 x pass rate in all with alpha = 1); no python block
  = no program = pass rate 0 (`coder_unparsable`, default 0);
- test writer local = the fraction of its tests that are real (envs/code_mutants.py): not
  degenerate, passed by a correct program (the problem's reference solution; without one, the
  program under test if it passes every ground-truth test, else none: no test earns) and
  failed by at least one mutant of it. No parsable test: `tester_unparsable` (-1).

Data: `train_sets` (default MBPP's training range and APPS's training problems) form the
training pool, every `valid_every`-th problem of it the "valid" split; `test_sets` (APPS's
test problems, MBPP's evaluation range, HumanEval) are evaluated whole, each its own split.
Besides the shipped sets, a name may be a prepared set (`python -m atgrpo_jax.data prepare
codecontests_train`, read from `data_dir`) or a source of your own (a file, a save_to_disk
directory or hf:org/name; envs/code_sources.py); docs/data.md.
Single-agent variant (`single_agent=True`): the coder alone; its episode ends at its first
parsable program.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import numpy as np

from atgrpo_jax.data import require_prepared, source_name
from atgrpo_jax.envs.code_grading import MATCH_RULES, TestVerdict, pass_rate
from atgrpo_jax.envs.code_problems import CodeProblem, extract_tests, load_problems, run_tests, valid_tests
from atgrpo_jax.envs.parsers import extract_code_block, python_block
from atgrpo_jax.envs.prompt_templates import Prompts
from atgrpo_jax.envs.sandbox import Limits
from atgrpo_jax.envs.text_state import clip_head, obj_array, step_frame
from atgrpo_jax.envs.workflow import Agent, Messages, StepOut, as_reference

# The reference's validate_sample_num (C:70): its engine evaluates len(problems) // this many "environment
# batches" of this many problems each, so only a multiple of it is evaluated (docs/paper.md, "Recipes", row 13)
REFERENCE_VALIDATE_SAMPLES = 5


@dataclasses.dataclass(frozen=True)
class CodeRewards:
    coder_unparsable: float = 0.0
    tester_unparsable: float = -1.0


def _show_test(kind: str, test) -> str:
    if kind == "function":
        return clip_head(test, 500)
    stdin, expected = test
    return f"Input:\n{clip_head(stdin, 500)}\nExpected output:\n{clip_head(expected, 500)}"


def mismatch_report(tests: Sequence, verdicts: Sequence[TestVerdict], max_shown: int = 4, kind: str = "io") -> str:
    """What the coder sees: how many generated tests pass, and the first failing ones."""
    if not tests:
        return "No generated tests yet."
    failing = [(t, v) for t, v in zip(tests, verdicts) if not v.passed]
    lines = [f"{len(tests) - len(failing)} of {len(tests)} generated tests pass."]
    for n, (test, verdict) in enumerate(failing[:max_shown], 1):
        got = f"Error: {verdict.error}" if verdict.error else f"Program output:\n{clip_head(verdict.actual, 500)}"
        lines.append(f"Failing test {n}:\n{_show_test(kind, test)}\n{got}")
    return "\n\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CodeWorkflow:
    train_sets: tuple[str, ...] = ("mbpp_train", "apps_train")
    test_sets: tuple[str, ...] = ("apps_test", "mbpp_test", "humaneval")
    valid_every: int = 10  # every n-th problem of the training pool is the validation split
    max_turns: int = 4
    single_agent: bool = False
    max_gt_tests: int | None = 20  # ground-truth tests run per program (the first ones)
    max_train_gt_tests: int | None = None  # the same for training problems (None: max_gt_tests); reference 4
    max_generated_tests: int = 8  # tests kept per tester answer; 1 also asks for one test (the reference)
    limits: Limits = Limits(wall_s=5.0, cpu_s=5.0, memory_mb=1024)
    output_match: str = "apps"  # stdout comparison: "apps" or "whitespace" (the reference's; code_grading)
    simultaneous: bool = False  # the test writer sees the turn's starting program (the reference's)
    max_workers: int | None = None
    rewards: CodeRewards = CodeRewards()
    max_shown_chars: int = 6000
    fields: dict | None = None  # {our field: the source's column} for sources of your own (code_sources.py)
    data_dir: str = ""  # where prepared sets are ("" = $ATGRPO_DATA, else ./data)
    prompt_dir: str = ""  # a directory of prompt templates replacing the shipped ones (envs/prompt_templates.py)
    recipe: str = "paper"  # the switches below left at None follow it (envs/workflow.py: RECIPES)
    python_blocks_only: bool | None = None  # True (reference): the coder's program is its last ```python block
    # and nothing else (no untagged block); False: an untagged block when no block is tagged python
    one_eval_sample: bool | None = None  # True (reference): one episode per evaluation problem (avg@1)
    # whatever train.eval_k says; False: train.eval_k episodes
    end_checked_after_both: bool | None = None  # True (reference): whether the program passes every generated
    # test, ending the episode, is checked only in the test writer's step; False: after each agent's step, so a
    # new program that passes the earlier tests ends the episode before the test writer replies
    drop_eval_remainder: bool | None = None  # True (reference): an evaluation split is its first
    # REFERENCE_VALIDATE_SAMPLES x floor(N / REFERENCE_VALIDATE_SAMPLES) problems (HumanEval: 160 of 164); False: all

    def __post_init__(self):
        for switch in ("python_blocks_only", "one_eval_sample", "drop_eval_remainder", "end_checked_after_both"):
            object.__setattr__(self, switch, as_reference(getattr(self, switch), self.recipe))
        for name in ("train_sets", "test_sets"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, (getattr(self, name),))
        if self.output_match not in MATCH_RULES:
            raise ValueError(f"output_match must be one of {MATCH_RULES}, got {self.output_match!r}")
        if self.fields is not None:  # a dict or ConfigDict, kept as sorted pairs: the workflow stays hashable
            pairs = sorted((str(k), str(v)) for k, v in dict(self.fields).items())
            object.__setattr__(self, "fields", tuple(pairs))
        if self.valid_every < 2:
            raise ValueError(f"valid_every must be >= 2, got {self.valid_every}")
        require_prepared([*self.train_sets, *self.test_sets], self.data_dir, "code")  # all missing in one line
        self.splits  # every data set loads: a bad name fails here
        self.templates  # and every prompt template parses

    def _load(self, name: str) -> tuple[CodeProblem, ...]:
        return load_problems(name, self.fields or (), self.data_dir)

    def _pool(self, split: str) -> tuple[CodeProblem, ...]:
        if split in ("train", "valid"):
            pool = [p for name in self.train_sets for p in self._load(name)]
            return tuple(p for i, p in enumerate(pool) if (i % self.valid_every == 0) == (split == "valid"))
        tests = {source_name(name): name for name in self.test_sets}  # a file's split is named after it
        if split not in tests:
            raise ValueError(f"split must be 'train', 'valid' or a test set ({', '.join(tests)}), got {split!r}")
        return self._load(tests[split])

    def _evaluated(self, split: str) -> int:
        """How many problems of an evaluation split are evaluated (drop_eval_remainder: the reference's cut)."""
        size = len(self._pool(split))
        return size - size % REFERENCE_VALIDATE_SAMPLES if self.drop_eval_remainder else size

    @functools.cached_property
    def templates(self) -> Prompts:
        return Prompts("code", self.prompt_dir)

    @property
    def splits(self) -> dict[str, int]:
        return {s: self._evaluated(s) for s in ("valid", *self.test_splits)}

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(source_name(name) for name in self.test_sets)

    @property
    def name(self) -> str:
        return "code_single" if self.single_agent else "code"

    @property
    def agents(self) -> tuple[Agent, ...]:
        parsers = {"coder": extract_code_block,
                   "tester": lambda text: extract_tests("io", text, self.max_generated_tests)}
        return tuple(Agent(role, parsers[role]) for role in code_roles(self.single_agent))

    # ------------------------------------------------------------ state
    def reset(self, task_ids: Sequence[int], split: str) -> dict[str, np.ndarray]:
        """Training draws ids from an endless stream (taken modulo the pool); an evaluation split's
        ids index its problems, each problem once."""
        pool = self._pool(split)
        if split != "train" and any(int(i) >= self._evaluated(split) for i in task_ids):
            raise ValueError(f"split {split!r} has {self._evaluated(split)} problems; task ids must be below that")
        rows = [pool[int(i) % len(pool)] for i in task_ids]
        n = len(rows)
        cap = self.max_train_gt_tests if split == "train" and self.max_train_gt_tests is not None else self.max_gt_tests
        return {
            "problem": obj_array(rows),
            "gt_tests": obj_array([p.tests[:cap] for p in rows]),
            "code": obj_array([""] * n),
            "gen_tests": obj_array([()] * n),
            "report": obj_array([""] * n),
            "gt_pass_rate": np.zeros(n, np.float32),
            "passes_generated": np.zeros(n, bool),
            "done": np.zeros(n, bool),
            "turn_start": obj_array([{}] * n),  # code and report before the coder's step of this turn
        }

    def done(self, state) -> np.ndarray:
        return np.asarray(state["done"], bool)

    def success(self, state) -> np.ndarray:
        return np.asarray(state["gt_pass_rate"], np.float32) >= 1.0

    # ------------------------------------------------------------ prompts
    def prompts(self, state, agent: int, turn: int) -> list[Messages]:
        role = self.agents[agent].name
        rows = [{k: v[b] for k, v in state.items()} for b in range(len(state["done"]))]
        if self.simultaneous and agent > 0:  # as if generated beside the coder, from the turn's start
            rows = [{**row, **row["turn_start"]} for row in rows]
        return [self._prompt(role, turn, row) for row in rows]

    def _prompt(self, role: str, turn: int, s: dict[str, Any]) -> Messages:
        problem: CodeProblem = s["problem"]
        user = self.templates.render(
            "user.j2", role=role, turn=turn, single_agent=self.single_agent, kind=problem.kind,
            statement=clip_head(problem.statement, self.max_shown_chars),
            code=clip_head(s["code"], self.max_shown_chars) if s["code"] else "", report=s["report"])
        return self.templates.chat(f"{role}_{problem.kind}", user, one_test=self.max_generated_tests == 1)

    # ------------------------------------------------------------ step
    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        grid, out, local, _, parsed_as, active = step_frame(state, responses)
        is_coder = self.agents[agent].name == "coder"
        for b, j in active:
            if is_coder:
                out["turn_start"][b, j] = {"code": state["code"][b], "report": state["report"][b]}
            kind = out["problem"][b, j].kind
            if is_coder:
                out["code"][b, j] = (python_block(grid[b][j]) if self.python_blocks_only
                                     else extract_code_block(grid[b][j])) or ""
            else:
                out["gen_tests"][b, j] = extract_tests(kind, grid[b][j], self.max_generated_tests)
        self._evaluate(out, active, run_ground_truth=is_coder,
                       check_end=not (is_coder and self.end_checked_after_both and not self.single_agent))
        team = np.where(state["done"][:, None], 0.0, out["gt_pass_rate"]).astype(np.float32)
        r = self.rewards
        if is_coder:
            for b, j in active:
                has_code = bool(out["code"][b, j])
                local[b, j] = out["gt_pass_rate"][b, j] if has_code else r.coder_unparsable
                if self.single_agent:
                    out["done"][b, j] = has_code
                lines = out["code"][b, j].count("\n") + 1
                parsed_as[b, j] = f"code of {lines} lines" if has_code else "unparsed: no ```python block"
        else:
            written = [(b, j) for b, j in active if out["gen_tests"][b, j]]
            known = [out["code"][b, j] if out["code"][b, j] and out["gt_pass_rate"][b, j] >= 1.0 else None
                     for b, j in written]  # a correct program, for a problem without a reference solution
            valid = valid_tests([(out["problem"][b, j], out["gen_tests"][b, j], ok) for (b, j), ok in zip(written, known)],
                                self.limits, self.max_workers, self.output_match)
            for (b, j), ok in zip(written, valid):
                local[b, j] = float(np.mean(ok))
                parsed_as[b, j] = f"{len(ok)} tests, {sum(ok)} valid"
            for b, j in set(active) - set(written):
                local[b, j] = r.tester_unparsable
                parsed_as[b, j] = "unparsed: no tests (**Test Input:** / **Test Output:** pairs or asserts)"
        return StepOut(state=out, local_reward=local, team_reward=team, parsed_as=parsed_as)

    def _evaluate(self, out, active, run_ground_truth: bool, check_end: bool = True):
        """Run programs on the generated tests (and, for a new program, the ground truth); update the state
        (`check_end`: and whether the episode ends, when the program passes every generated test)."""
        with_code = [(b, j) for b, j in active if out["code"][b, j]]
        jobs = [(out["problem"][b, j], out["code"][b, j], out["gen_tests"][b, j]) for b, j in with_code]
        if run_ground_truth:
            jobs += [(out["problem"][b, j], out["code"][b, j], out["gt_tests"][b, j]) for b, j in with_code]
        verdicts = run_tests(jobs, self.limits, self.max_workers, self.output_match) if jobs else []
        for n, (b, j) in enumerate(with_code):
            kind = out["problem"][b, j].kind
            out["report"][b, j] = mismatch_report(out["gen_tests"][b, j], verdicts[n], kind=kind)
            out["passes_generated"][b, j] = bool(verdicts[n]) and all(v.passed for v in verdicts[n])
            if run_ground_truth:
                out["gt_pass_rate"][b, j] = pass_rate(verdicts[len(with_code) + n])
        for b, j in active:
            if not out["code"][b, j]:
                out["report"][b, j], out["passes_generated"][b, j] = "No program yet.", False
                out["gt_pass_rate"][b, j] = 0.0
            if check_end:
                out["done"][b, j] = out["passes_generated"][b, j]


def code_roles(single_agent: bool = False, **_) -> tuple[str, ...]:
    """The workflow's roles in turn order, known without its data (the planner counts them)."""
    return ("coder",) if single_agent else ("coder", "tester")


def make_code_workflow(single_agent: bool = False, **kwargs) -> CodeWorkflow:
    """Factory for configs (envs.workflow_registry); `limits` may be a dict of sandbox.Limits fields."""
    for key, cls in (("limits", Limits), ("rewards", CodeRewards)):
        value = kwargs.get(key)
        value = value.to_dict() if hasattr(value, "to_dict") else value  # a ConfigDict from env.kwargs
        if isinstance(value, dict):
            kwargs[key] = cls(**value)
    return CodeWorkflow(single_agent=single_agent, **kwargs)
