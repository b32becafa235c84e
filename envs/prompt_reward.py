"""`prompt_reward`: a dataset of prompts plus one reward function is a task (plain GRPO on any data).

    --config.env.workflow=prompt_reward
    --config.env.kwargs.train_path=train.jsonl --config.env.kwargs.test_path=test.jsonl
    --config.env.kwargs.reward_fn=my_rewards:score
    --config.env.kwargs.valid_path=valid.jsonl   # optional: chooses the best checkpoint (else the test split)

Each record of a data source (a jsonl/json/parquet/arrow/csv file, a saved Hugging Face dataset or
`hf:org/name[:config][:split]`: atgrpo_jax.data) has a "prompt" string (`fields={"prompt": COLUMN}`
maps another column); every other field (an answer, test cases, ...) is passed to the reward
function untouched. An agent sees the
record's prompt as a chat (`system_prompt` first, if any) and answers; the reward function scores
every response of a turn in one call:

    def score(completions: list[str], records: list[dict]) -> list[float]:
        # completions[i] answers records[i] (the dataset row, "prompt" included); one float each.
        # Optionally return (scores, feedback): feedback[i] is the next turn's user message.

A function may instead name what it needs (`reward_arguments`): `prompts`, any dataset column (a list,
one value per completion), `role`, `turn`, `history`, and `**kwargs` for all of them, so TRL's
`f(prompts, completions, **kwargs)` runs as written.

`max_turns` > 1 plays up to that many turns: after a response scoring below `success_at`, the
agent sees its answer and the feedback (by default "Your answer scored S. Try again.") and answers
again; a response scoring >= `success_at` succeeds and ends the episode. Subclasses add roles
(`roles`, `messages`): every role's responses are scored the same way, and the last role of a turn
decides success (README "A reward function is enough" has a two-role example).

A reward function that raises, or returns the wrong number of values or a non-number, stops the
run with one line naming it (RewardError), not a traceback.
"""
from __future__ import annotations

import functools
import re
import sys
from typing import Any, Sequence

import numpy as np

from atgrpo_jax.data import load_records
from atgrpo_jax.envs.text_state import obj_array, response_grid
from atgrpo_jax.envs.workflow import Agent, Messages, StepOut, branch
from atgrpo_jax.errors import RewardError
from atgrpo_jax.registry import import_function


def read_records(source: str, fields=None) -> list[dict]:
    """The records of a data source (jsonl, json, parquet, arrow, csv, a saved HF dataset, hf:org/name;
    atgrpo_jax.data), each with a "prompt" (`fields` maps it to another column)."""
    return list(load_records(source, ("prompt",), dict(fields or {})))


def first_line(text: Any) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else ""


class PromptReward:
    """The workflow; see the module docstring. Constructed by the `prompt_reward` factory."""

    name = "prompt_reward"
    roles: tuple[str, ...] = ("assistant",)

    def __init__(self, train_path: str = "", test_path: str = "", reward_fn="", system_prompt: str = "",
                 max_turns: int = 1, success_at: float = 1.0, fields=None, single_agent=False, valid_path: str = "",
                 reward_weights=None):
        for key, value in (("train_path", train_path), ("test_path", test_path), ("reward_fn", reward_fn)):
            if not value:
                raise ValueError(f"env.kwargs.{key}: prompt_reward needs it (see envs/prompt_reward.py)")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"env.kwargs.max_turns: must be an int >= 1, got {max_turns!r}")
        specs = [reward_fn] if isinstance(reward_fn, str) else list(reward_fn)
        weights = [1.0] * len(specs) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(specs):
            raise ValueError(f"env.kwargs.reward_weights: {len(weights)} weights for {len(specs)} reward functions")
        self.reward_fns = [(spec, import_function(spec, "env.kwargs.reward_fn"), w) for spec, w in zip(specs, weights)]
        reach = sum(w for w in weights if w > 0)
        if len(weights) > 1 and reach < float(success_at):
            print(f"warning: env.kwargs.reward_weights sum to {reach:g}, below env.kwargs.success_at={float(success_at):g}: "
                  "a response succeeds only when its functions score above 1 (set success_at to what a right "
                  "answer earns)", file=sys.stderr, flush=True)
        self.system_prompt, self.max_turns, self.success_at = system_prompt, max_turns, float(success_at)
        self.data = {}
        sources = (("train", train_path), ("test", test_path)) + ((("valid", valid_path),) if valid_path else ())
        for split, path in sources:
            try:
                records = read_records(path, fields)
            except ValueError as e:
                raise ValueError(f"env.kwargs.{split}_path: {e}") from None
            bad = [i for i, r in enumerate(records) if not isinstance(r["prompt"], str)]
            if bad:
                raise ValueError(f"env.kwargs.{split}_path: {path}: the prompt of record {bad[0] + 1} is not a string")
            self.data[split] = records
        roles = self.roles[:1] if single_agent else self.roles
        self.agents = tuple(Agent(role, first_line) for role in roles)
        self.splits = {split: len(self.data[split]) for split in self.data if split != "train"}
        self.test_splits = ("test",)

    # ------------------------------------------------------------ state
    def reset(self, task_ids: Sequence[int], split: str) -> dict[str, np.ndarray]:
        """Training ids are taken modulo the training set; test ids index the test set."""
        records = self.data["train" if split == "train" else split]
        if split != "train" and any(int(i) >= len(records) for i in task_ids):
            raise ValueError(f"split {split!r} has {len(records)} records; task ids must be below that")
        n = len(task_ids)
        return {"row": np.array([int(i) % len(records) for i in task_ids]), "split": obj_array([split] * n),
                "history": obj_array([()] * n), "score": np.zeros(n, np.float32), "done": np.zeros(n, bool),
                "success": np.zeros(n, bool)}

    def record(self, state, b: int) -> dict:
        split = state["split"][b]
        return self.data["train" if split == "train" else split][int(state["row"][b])]

    def done(self, state) -> np.ndarray:
        return np.asarray(state["done"], bool)

    def success(self, state) -> np.ndarray:
        return np.asarray(state["success"], bool)

    # ------------------------------------------------------------ prompts
    def messages(self, agent: int, record: dict, history: tuple) -> Messages:
        """The chat agent `agent` sees: the system prompt, the record's prompt, then each earlier
        (role, response, feedback) of this episode as an assistant turn and a user turn."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        out.append({"role": "user", "content": record["prompt"]})
        for role, response, feedback in history:
            if role == self.agents[agent].name:
                out += [{"role": "assistant", "content": response}, {"role": "user", "content": feedback}]
        return out

    def prompts(self, state, agent: int, turn: int) -> list[Messages]:
        return [self.messages(agent, self.record(state, b), state["history"][b]) for b in range(len(state["done"]))]

    # ------------------------------------------------------------ step
    def score(self, completions: list[str], records: list[dict], **context) -> tuple[np.ndarray, list[str]]:
        """The reward functions on one batch, checked and summed with their weights: (scores [N], feedback [N],
        the first function's that gives any). context: the role, turn and history a function may ask for."""
        total, feedback, _ = self.score_parts(completions, records, **context)
        return total, feedback

    def score_parts(self, completions: list[str], records: list[dict], **context):
        """`score`, and each function's own (unweighted) scores by its name: (total, feedback, {name: [N]})."""
        total, feedback, parts = np.zeros(len(completions), np.float32), None, {}
        for (spec, fn, weight), name in zip(self.reward_fns, self.part_names):
            scores, said = self._score_one(spec, fn, completions, records, context)
            total += np.float32(weight) * scores
            parts[name] = scores
            feedback = said if feedback is None else feedback
        if feedback is None:
            feedback = [f"Your answer scored {s:.3g}. Try again." for s in total]
        return total, [str(f) for f in feedback], parts

    @functools.cached_property
    def part_names(self) -> list[str]:
        """Each reward function's name in the metrics (reward_fn/NAME/mean): its own, numbered when two share it."""
        names = [re.split(r"[.:]", spec)[-1] or "reward" for spec, _, _ in self.reward_fns]
        return [f"{n}_{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]

    def _score_one(self, spec, fn, completions, records, context) -> tuple[np.ndarray, list | None]:
        who = f"env.kwargs.reward_fn={spec!r}"
        try:
            out = call_asking(fn, **reward_arguments(completions, records, **context))
        except AskedForUnknown as e:
            raise RewardError(f"{who} {e}") from None
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - the user's code: one line naming it
            detail = first_line(e) or "(no message)"
            raise RewardError(f"{who} raised {type(e).__name__}: {detail} "
                              f"(on a batch of {len(completions)} responses)") from None
        feedback = None
        if isinstance(out, tuple) and len(out) == 2:
            out, feedback = out
        if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
            raise RewardError(f"{who} must return a list of numbers (or (numbers, feedback strings)), "
                              f"got {type(out).__name__}: {out!r:.80}")
        if len(out) != len(completions):
            raise RewardError(f"{who} returned {len(out)} scores for {len(completions)} responses")
        if feedback is not None and len(feedback) != len(completions):
            raise RewardError(f"{who} returned {len(feedback)} feedback strings for {len(completions)} responses")
        for i, x in enumerate(out):
            if not isinstance(x, (bool, int, float, np.number)):
                raise RewardError(f"{who} returned {x!r:.80} ({type(x).__name__}) for response {i}: "
                                  "a score must be a number")
        with np.errstate(over="ignore", invalid="ignore"):
            scores = np.asarray([float(x) for x in out], np.float32)
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:
            raise RewardError(f"{who} returned {out[bad[0]]!r} for response {bad[0]}: not a finite float32 number")
        return scores, feedback

    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        batch = len(state["done"])
        grid = response_grid(responses, batch)
        k = len(grid[0])
        records = [self.record(state, b) for b in range(batch)]
        role = self.agents[agent].name
        histories = [state["history"][b] for b in range(batch) for _ in range(k)]
        scores, feedback, parts = self.score_parts([r for row in grid for r in row],
                                                   [records[b] for b in range(batch) for _ in range(k)],
                                                   role=role, turn=turn, history=histories)
        scores = scores.reshape(batch, k)
        by_part = obj_array([{name: float(p[i]) for name, p in parts.items()} for i in range(batch * k)])
        out = branch(state, k)
        last = agent == len(self.agents) - 1
        for b in range(batch):
            for j in range(k):
                out["history"][b, j] = state["history"][b] + ((role, grid[b][j], feedback[b * k + j]),)
        success = scores >= self.success_at
        out["score"] = scores
        if last:
            out["success"] = success
            out["done"] = success | (turn + 1 >= self.max_turns)
        return StepOut(state=out, local_reward=scores, team_reward=scores,
                       parsed_as=obj_array([f"score {s:.3g}" for s in scores.ravel()]).reshape(batch, k),
                       reward_parts=by_part.reshape(batch, k))


def reward_arguments(completions: list[str], records: list[dict], **context) -> dict:
    """What a reward function may ask for by name: this project's completions, records, role, turn and
    history; TRL's prompts (each record's prompt) and every dataset column present in all records, as a
    list (TRL passes columns so); this project's names win over a column of the same name."""
    columns = set(records[0]) if records else set()
    for r in records[1:]:
        columns &= set(r)
    out = {c: [r[c] for r in records] for c in sorted(columns)}
    out["prompts"] = [r.get("prompt") for r in records]
    out.update(completions=completions, records=records, **context)
    return out


class AskedForUnknown(TypeError):
    """A reward function's required parameter that no call passes."""


def call_asking(fn, **available):
    """fn called with the keyword arguments it names among `available` (all of them with **kwargs), as
    TRL passes dataset columns; a function whose parameters name none of them gets (completions, records).
    A required parameter that is none of them is an AskedForUnknown naming the ones it may ask for."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: the positional form
        return fn(available["completions"], available["records"])
    named = [p for p in params.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    asked = {p.name: available[p.name] for p in named if p.name in available}
    if asked or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [p.name for p in named if p.name not in available and p.default is p.empty]
        if unknown:
            raise AskedForUnknown(f"asks for {', '.join(map(repr, unknown))}, which no call passes; a reward function "
                                  f"may ask for {', '.join(sorted(available))} (and **kwargs for all of them)")
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return fn(**available)
        return fn(**asked)
    return fn(available["completions"], available["records"])


def make_prompt_reward(single_agent: bool = False, **kwargs) -> PromptReward:
    return PromptReward(single_agent=single_agent, **kwargs)
