"""Math workflow: a reasoner (answer in \\boxed{}) and a tool agent (Python that prints the answer).

Turn order per turn: reasoner, then tool agent (`tool_first=True`: the
reference's order, tool agent first). At turn 0 both solve the problem
independently; at later turns each sees both agents' latest solutions and
answers and is asked to select or refine. With `simultaneous=True` (the
reference's parallel turns) the second agent of a turn is shown the state as
the turn began, not its partner's answer of the same turn. The episode ends as soon as both
agents have an answer and the two agree (compared with the grader); success =
the reasoner's answer is correct.

Rewards (docs/paper.md, "Rewards"), with the rollout's r = local + alpha*team:
- team reward = 1 if the reasoner's current answer is correct, else 0;
- reasoner local = 1 if correct (so 2 x correct in total with alpha = 1);
  no `\\boxed{}` answer counts as wrong (`reasoner_unparsable`, default 0);
- tool local = +1 correct, 0 wrong, -1 when there is no python block, the
  program fails (error, timeout, memory, output flood) or prints nothing.

Data (docs/data.md): `train_set` names the training pool and `test_sets` the
test sets: a shipped set (envs/data/math: "aime24", "aime25", "olympiadbench",
"gsm8k_train", "gsm8k_test"), a prepared one ("polaris": `python -m
atgrpo_jax.data prepare polaris`, read from `data_dir`), or a source of your
own: a .jsonl/.json/.parquet file, a `save_to_disk` directory or
`hf:org/name[:config][:split]`, with "problem" and "answer" fields (`fields`
maps them to other columns, e.g. {"problem": "question"}). `train_path` /
`test_path` name one such source each (a test source's split is named after
it). Every `valid_every`-th problem of the training pool is held out
as the "valid" split (choosing the best checkpoint) and never trained on.
Evaluation resets test problems by index (0 .. size - 1): every problem once.
The single-agent variant (`single_agent=True`) keeps only the reasoner; its
episode ends at its first parsable answer.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Sequence

import numpy as np

from atgrpo_jax.data import is_prepared_name, is_source, load_records, prepared_path, require_prepared, source_name
from atgrpo_jax.envs.math_grading import answer_anywhere, grade, verify_as_written
from atgrpo_jax.envs.parsers import extract_boxed, extract_code_block, reference_program
from atgrpo_jax.envs.sandbox import Limits, run_many
from atgrpo_jax.envs.text_state import clip_head, clip_middle, clip_tail, load_jsonl, obj_array, step_frame
from atgrpo_jax.envs.prompt_templates import Prompts
from atgrpo_jax.envs.workflow import TRAIN_TASK_STRIDE, Agent, Messages, StepOut, as_reference

MATH_DATASETS = {
    "gsm8k_train": "math/gsm8k_train.jsonl",
    "gsm8k_test": "math/gsm8k_test.jsonl",
    "aime24": "math/aime24.jsonl",
    "aime25": "math/aime25.jsonl",
    "olympiadbench": "math/olympiadbench.jsonl",
}
TEXT_FIELDS = ("problem", "reference", "reasoner_response", "reasoner_answer", "tool_code", "tool_output",
               "tool_answer", "history", "reasoner_past", "tool_past")

@dataclasses.dataclass(frozen=True)
class MathRewards:
    reasoner_correct: float = 1.0
    reasoner_unparsable: float = 0.0
    tool_correct: float = 1.0
    tool_wrong: float = 0.0
    tool_error: float = -1.0
    team_correct: float = 1.0
    aggregator_correct: float = 1.0  # math_aggregation's third role (envs/math_aggregation.py)


def load_problems(name: str, fields: dict | None = None, data_dir: str = "") -> tuple[dict, ...]:
    """A shipped data set, a prepared one, or a source of {"problem", "answer"} records (module docstring)."""
    if name in MATH_DATASETS:
        return load_jsonl(MATH_DATASETS[name])
    if is_prepared_name(name, "math"):
        return load_records(prepared_path(name, data_dir), ("problem", "answer"))
    if is_source(name):
        return load_records(name, ("problem", "answer"), fields)
    raise ValueError(f"unknown math data set {name!r}; choose one of {sorted(MATH_DATASETS)}, 'polaris' (prepared), "
                     "a .jsonl/.parquet file, a save_to_disk directory or hf:org/name")


def tool_answer_from_output(stdout: str) -> str:
    """The answer a program printed: a \\boxed{} if any, else its last non-empty line ("" if none)."""
    boxed = extract_boxed(stdout)
    if boxed is not None:
        return clip_head(boxed, 200)
    lines = [line.strip() for line in str(stdout).splitlines() if line.strip()]
    if not lines:
        return ""
    return clip_head(re.sub(r"^(final\s+)?answer\s*[:=]\s*", "", lines[-1], flags=re.IGNORECASE), 200)


@dataclasses.dataclass(frozen=True)
class MathWorkflow:
    train_set: str = "gsm8k_train"
    test_sets: tuple[str, ...] = ("aime24", "aime25", "olympiadbench")
    train_path: str = ""  # a training pool of your own (instead of train_set): a file, directory or hf: name
    test_path: str = ""  # a test set of your own: the one evaluated by default (test_sets stay splits)
    fields: dict | None = None  # {our field: the source's column} for sources of your own
    data_dir: str = ""  # where prepared sets are ("" = $ATGRPO_DATA, else ./data)
    valid_every: int = 20  # every n-th training problem is the validation split
    max_turns: int = 4
    single_agent: bool = False
    limits: Limits = Limits(wall_s=20.0, cpu_s=20.0, memory_mb=2048)
    max_workers: int | None = None
    rewards: MathRewards = MathRewards()
    max_shown_chars: int = 4000  # of an earlier response shown in a prompt
    tool_first: bool = False  # turn order tool agent, reasoner (the reference's)
    simultaneous: bool = False  # the second agent of a turn sees the turn's starting state (the reference's)
    prompt_dir: str = ""  # a directory of prompt templates replacing the shipped ones (envs/prompt_templates.py)
    recipe: str = "paper"  # the switches below left at None follow it (envs/workflow.py: RECIPES)
    answer_anywhere: bool | None = None  # True (reference): an answer is what math_verify finds anywhere in the
    # reasoner's response or the program's output ("The answer is $42$." is one); False: \boxed{} is required,
    # a program's answer is its \boxed{} or last line
    whole_reply_program: bool | None = None  # True (reference): a tool reply without a code block runs whole;
    # False: a reply without a ```python (or untagged) block runs nothing (rewards.tool_error)
    failed_program_is_wrong: bool | None = None  # True (reference): a program that fails, prints nothing or is
    # missing scores as a wrong answer (0); False: rewards.tool_error (-1)
    full_history: bool | None = None  # True (reference): turns >= 1 show every earlier turn (each reasoning cut
    # to its first and last 500 characters, its answer, each program and its result); False: the latest replies
    draw_per_step: bool | None = None  # True (reference): each training step draws its problems at random,
    # distinct within the step (random.sample); False: consecutive problems of the pool, each once per pass
    verify_as_written: bool | None = None  # True (reference): correct is math_verify's verify(parse(reply),
    # parse(truth)) with the truth as written, not wrapped in `$` (so `\dfrac{1}{2}`, `(1,2)`, `2\sqrt{3}` never
    # match), and agreement verify(parse(program output), parse(reply)); the reply whole with answer_anywhere,
    # else its answer in `$`; False: `grade` (the truth in `$`, both orders, a normalizing fallback)
    end_checked_after_both: bool | None = None  # True (reference): whether the two answers agree, ending the
    # episode, is checked only in the reasoner's step, so at every turn both agents generate and are scored;
    # False: after each agent's step, so an agreeing tool answer ends the episode before the reasoner replies

    def __post_init__(self):
        if isinstance(self.test_sets, str):
            object.__setattr__(self, "test_sets", (self.test_sets,))
        if self.fields is not None:  # a dict or ConfigDict, kept as sorted pairs: the workflow stays hashable
            pairs = sorted((str(k), str(v)) for k, v in dict(self.fields).items())
            object.__setattr__(self, "fields", tuple(pairs))
        for switch in ("answer_anywhere", "whole_reply_program", "failed_program_is_wrong", "draw_per_step",
                       "full_history", "verify_as_written", "end_checked_after_both"):
            object.__setattr__(self, switch, as_reference(getattr(self, switch), self.recipe))
        if self.valid_every < 2:
            raise ValueError(f"valid_every must be >= 2, got {self.valid_every}")
        names = [self.train_path or self.train_set, *self.test_sets]
        require_prepared([n for n in names if n not in MATH_DATASETS], self.data_dir, "math")  # all in one line
        self.splits  # every data set loads: a bad name or file fails here
        self.templates  # and every prompt template parses

    @property
    def name(self) -> str:
        return "math_single" if self.single_agent else "math"

    @property
    def _tests(self) -> dict[str, tuple[dict, ...]]:
        names = list(self.test_sets) + ([self.test_path] if self.test_path else [])
        return {source_name(n): self._load(n) for n in names}

    def _load(self, name: str) -> tuple[dict, ...]:
        return load_problems(name, dict(self.fields or ()), self.data_dir)

    @functools.cached_property
    def templates(self) -> Prompts:
        return Prompts("math", self.prompt_dir)

    @property
    def splits(self) -> dict[str, int]:
        return {"valid": len(self._pool("valid"))} | {name: len(p) for name, p in self._tests.items()}

    @property
    def test_splits(self) -> tuple[str, ...]:
        if self.test_path:  # the user's own test set replaces the built-in ones by default
            return (source_name(self.test_path),)
        return tuple(self._tests)

    def _pool(self, split: str) -> tuple[dict, ...]:
        """The problems of a split: train and valid interleave in the training pool."""
        if split in ("train", "valid"):
            pool = self._load(self.train_path or self.train_set)
            return tuple(p for i, p in enumerate(pool) if (i % self.valid_every == 0) == (split == "valid"))
        tests = self._tests
        if split not in tests:
            raise ValueError(f"split must be 'train', 'valid' or a test set ({', '.join(tests)}), got {split!r}")
        return tests[split]

    @property
    def agents(self) -> tuple[Agent, ...]:
        parsers = {"reasoner": extract_boxed, "tool": extract_code_block}
        return tuple(Agent(role, parsers[role]) for role in math_roles(self.single_agent, self.tool_first))

    # ------------------------------------------------------------ state
    def reset(self, task_ids: Sequence[int], split: str) -> dict[str, np.ndarray]:
        """Training draws ids from an endless stream (taken modulo the pool); an evaluation split's
        ids index its problems, each problem once."""
        problems = self._pool(split)
        if split != "train" and any(int(i) >= len(problems) for i in task_ids):
            raise ValueError(f"split {split!r} has {len(problems)} problems; task ids must be below that")
        rows = [problems[j] for j in self._rows(task_ids, split, len(problems))]
        n = len(rows)
        state = {field: obj_array([""] * n) for field in TEXT_FIELDS}
        state["problem"] = obj_array([str(r["problem"]) for r in rows])
        state["reference"] = obj_array([str(r["answer"]) for r in rows])  # (parquet answers may be numbers)
        state["reasoner_correct"] = np.zeros(n, bool)
        state["done"] = np.zeros(n, bool)
        state["turn_start"] = obj_array([{}] * n)  # the text fields before the turn's first agent acted
        return state

    def _rows(self, task_ids: Sequence[int], split: str, size: int) -> list[int]:
        """The pool rows of task ids: an evaluation split's ids themselves; training's the stream taken
        modulo the pool, or with draw_per_step a random order of the pool per step (seeded by the step)."""
        if split != "train" or not self.draw_per_step:
            return [int(i) % size for i in task_ids]
        order = {}
        for step in {int(i) // TRAIN_TASK_STRIDE for i in task_ids}:
            order[step] = np.random.default_rng([step]).permutation(size)
        return [int(order[int(i) // TRAIN_TASK_STRIDE][int(i) % TRAIN_TASK_STRIDE % size]) for i in task_ids]

    def done(self, state) -> np.ndarray:
        return np.asarray(state["done"], bool)

    def success(self, state) -> np.ndarray:
        return np.asarray(state["reasoner_correct"], bool)

    # ------------------------------------------------------------ prompts
    def prompts(self, state, agent: int, turn: int) -> list[Messages]:
        role = self.agents[agent].name
        rows = [{k: v[b] for k, v in state.items()} for b in range(len(state["done"]))]
        if self.simultaneous and agent > 0:  # as if generated beside the first agent, from the turn's start
            rows = [{**row, **row["turn_start"]} for row in rows]
        return [self._prompt(role, turn, row) for row in rows]

    def _prompt(self, role: str, turn: int, s: dict[str, Any]) -> Messages:
        user = self.templates.render(
            "user.j2", role=role, turn=turn, single_agent=self.single_agent, problem=s["problem"],
            reasoner_response=clip_tail(s["reasoner_response"], self.max_shown_chars),
            tool_code=clip_head(s["tool_code"], self.max_shown_chars), tool_output=clip_head(s["tool_output"], 1000),
            history=s["history"], full_history=self.full_history, reasoner_past=s["reasoner_past"],
            tool_past=s["tool_past"])
        return self.templates.chat("single" if self.single_agent else role, user)

    # ------------------------------------------------------------ step
    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        grid, out, local, team, parsed_as, active = step_frame(state, responses)
        if agent == 0:
            for b, j in active:
                out["turn_start"][b, j] = {f: state[f][b] for f in TEXT_FIELDS}
        if self.agents[agent].name == "reasoner":
            self._step_reasoner(out, grid, active, turn, local, parsed_as)
        else:
            self._step_tool(out, grid, active, turn, local, parsed_as)
        for b, j in active:
            team[b, j] = self.rewards.team_correct * out["reasoner_correct"][b, j]
        return StepOut(state=out, local_reward=local, team_reward=team, parsed_as=parsed_as)

    def _agree(self, out, b: int, j: int) -> bool:
        if self.single_agent:
            return bool(out["reasoner_answer"][b, j])
        first, second = out["reasoner_answer"][b, j], out["tool_answer"][b, j]
        if not (first and second):
            return False
        if self.verify_as_written:  # the reference: verify(the program's parsed output, the parsed reasoning)
            return verify_as_written(self._as_written(out["tool_output"][b, j], second),
                                     self._as_written(out["reasoner_response"][b, j], first))
        return grade(first, second) or grade(second, first)

    def _as_written(self, whole: str, answer: str) -> str:
        """What verify_as_written parses for an agent: its whole text when answers are read anywhere (the
        reference), else its extracted answer in `$`."""
        return whole if self.answer_anywhere else f"${answer}$"

    def _correct(self, whole: str, answer: str, truth: str) -> bool:
        if not answer:
            return False
        if self.verify_as_written:
            return verify_as_written(self._as_written(whole, answer), truth)
        return grade(answer, truth)

    def _step_reasoner(self, out, grid, active, turn, local, parsed_as):
        r = self.rewards
        for b, j in active:
            answer = answer_anywhere(grid[b][j]) if self.answer_anywhere else extract_boxed(grid[b][j]) or ""
            correct = self._correct(grid[b][j], answer, out["reference"][b, j])
            out["reasoner_response"][b, j] = grid[b][j]
            out["reasoner_answer"][b, j] = answer
            out["reasoner_correct"][b, j] = correct
            out["history"][b, j] += f"turn {turn + 1}, reasoner: {answer or '(no boxed answer)'}\n"
            if self.full_history:
                out["reasoner_past"][b, j] += (f"Turn {turn + 1}, the reasoning: {clip_middle(grid[b][j], 500)}\n"
                                               f"Turn {turn + 1}, its answer: {answer or '(none)'}\n")
            local[b, j] = r.reasoner_correct * correct if answer else r.reasoner_unparsable
            out["done"][b, j] = self._agree(out, b, j)
            parsed_as[b, j] = f"answer {answer}" if answer else \
                "unparsed: no answer found" if self.answer_anywhere else "unparsed: no \\boxed{} answer"

    def _step_tool(self, out, grid, active, turn, local, parsed_as):
        r = self.rewards
        extract = reference_program if self.whole_reply_program else extract_code_block
        codes = {(b, j): extract(grid[b][j]) for b, j in active}
        runnable = [key for key, code in codes.items() if code]
        results = dict(zip(runnable, run_many([codes[key] for key in runnable], limits=self.limits,
                                              max_workers=self.max_workers)))
        for b, j in active:
            result = results.get((b, j))
            if result is None:
                output, answer = "(no python block found)", ""
            elif self.answer_anywhere:  # the reference parses whatever its runner reports, errors too
                output = result.as_reference_reports
                answer = answer_anywhere(output)
            elif not result.ok:
                reason = ("timed out" if result.timed_out else "ran out of memory" if result.memory_exceeded
                          else "printed too much" if result.output_truncated else "failed")
                output, answer = f"(the program {reason})\n{clip_tail(result.stderr_tail, 800)}", ""
            else:
                output, answer = result.stdout, tool_answer_from_output(result.stdout)
            correct = self._correct(output, answer, out["reference"][b, j])
            error = r.tool_wrong if self.failed_program_is_wrong else r.tool_error
            out["tool_code"][b, j] = codes[(b, j)] or ""
            out["tool_output"][b, j] = clip_head(output, 4000)
            out["tool_answer"][b, j] = answer
            out["history"][b, j] += f"turn {turn + 1}, tool agent: {answer or '(no answer)'}\n"
            if self.full_history:
                out["tool_past"][b, j] += (f"Turn {turn + 1}, the program:\n```python\n{codes[(b, j)] or ''}\n```\n"
                                           f"Turn {turn + 1}, its result: {clip_middle(output.strip(), 500)}\n")
            local[b, j] = r.tool_correct if correct else r.tool_wrong if answer else error
            parsed_as[b, j] = f"printed {answer}" if answer else "unparsed: " + clip_head(output, 120)
            if not self.end_checked_after_both:  # the reference checks only in its reasoner's step
                out["done"][b, j] = self._agree(out, b, j)


def math_roles(single_agent: bool = False, tool_first: bool = False, **_) -> tuple[str, ...]:
    """The workflow's roles in turn order, known without its data (the planner counts them)."""
    if single_agent:
        return ("reasoner",)
    return ("tool", "reasoner") if tool_first else ("reasoner", "tool")


def typed_settings(kwargs: dict) -> dict:
    """A config's env.kwargs for a math workflow: `limits` and `rewards` may be dicts of their fields."""
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("limits"), dict):
        kwargs["limits"] = Limits(**kwargs["limits"])
    if isinstance(kwargs.get("rewards"), dict):
        kwargs["rewards"] = MathRewards(**kwargs["rewards"])
    return kwargs


def make_math_workflow(single_agent: bool = False, **kwargs) -> MathWorkflow:
    """Factory for configs (envs.workflow_registry)."""
    return MathWorkflow(single_agent=single_agent, **typed_settings(kwargs))
