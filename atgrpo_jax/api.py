"""The Python API: the commands' work, callable from a script or a notebook.

    from atgrpo_jax import Trainer

    def reward(completions, records):  # one number per completion; it may also ask for role, turn, history
        return [1.0 if c.strip() == r["answer"] else 0.0 for c, r in zip(completions, records)]

    trainer = Trainer("configs/sum_digits.py", workdir="runs/mine", reward_fns=reward,
                      train_dataset=[{"prompt": "2+3=", "answer": "5"}, ...])
    metrics = trainer.train()          # the final held-out evaluation's metrics
    trainer.export("runs/mine/hf")     # a Hugging Face model directory

Objects handed over here (reward functions, data sets, workflows) go into the config under `py:` names
(atgrpo_jax/registry.py), so config.json names them and a run resumed through the same call finds them.
The command-line tools are this API with flags: `python -m atgrpo_jax.train` is `Trainer(...).train()`.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Sequence

import ml_collections

from atgrpo_jax import cli, errors
from atgrpo_jax.evaluate import run_evaluation
from atgrpo_jax.export import check_push, export_policy, push
from atgrpo_jax.registry import register_object
from atgrpo_jax.train.loop import run_training

RewardFn = Callable[..., Sequence[float]]

# What the commands print as one line: raised from the API with the same message and no frames of
# this package (the user's own call is the traceback's last line)
USER_ERRORS = (errors.UsageError, errors.ConfigError, errors.CheckpointError, errors.DataError, errors.NotWritable,
               errors.UnknownName, errors.RunStopped, FileNotFoundError, NotADirectoryError)


def speaks_like_the_cli(method):
    """The method's user-fixable errors re-raised without this package's frames."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except USER_ERRORS as e:
            raise e.with_traceback(None) from None
    return call


def as_config(config, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """A config file's path ("configs/x.py[:ARG]"), a ConfigDict or `get_config()`'s result, as a (copied,
    locked) ConfigDict with `overrides` ({"rollout.k": 4}) applied."""
    items = [(k, repr(v) if not isinstance(v, str) else v) for k, v in (overrides or {}).items()]
    if isinstance(config, str):
        return cli.config_from_args(config, items)
    if not isinstance(config, ml_collections.ConfigDict):
        raise cli.UsageError(f"config: a config file's path or an ml_collections.ConfigDict, got {type(config).__name__}")
    c = cli.apply_overrides(copy.deepcopy(config), items)
    c.lock()
    return c


HELD_OUT = 0.1  # the share of train_dataset's rows evaluated on when no eval_dataset is given


def _records(data, what: str) -> list[dict]:
    """A data set's rows as a list of dicts (a path or hf: name read as the trainer reads it)."""
    if isinstance(data, str):
        from atgrpo_jax.envs.prompt_reward import read_records
        try:
            return read_records(data)
        except ValueError as e:
            raise cli.UsageError(f"{what}: {e}") from None
    if not _is_records(data):
        _dataset(data, what)  # (raises the type error, naming what is accepted)
    return list(data.to_list() if hasattr(data, "to_list") else data)


def hold_out(rows: list[dict], share: float = HELD_OUT) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): a fixed share of `rows` (at least one), drawn by a seeded shuffle so
    every process and resume draws the same, said in one line. A single row is both (and said so)."""
    import random
    import sys

    if len(rows) < 2:
        print("note: no eval_dataset and a single training row: it is evaluated on too", file=sys.stderr, flush=True)
        return rows, rows
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    n = max(1, round(share * len(rows)))
    held = set(order[:n])
    print(f"note: no eval_dataset: {n} of train_dataset's {len(rows)} rows are held out for evaluation and the "
          f"best checkpoint (pass eval_dataset= to choose them)", file=sys.stderr, flush=True)
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def _is_records(data) -> bool:
    """A list of dicts or a `datasets.Dataset`."""
    return hasattr(data, "to_list") or (isinstance(data, (list, tuple)) and all(isinstance(r, dict) for r in data))


def _dataset(data, what: str) -> str:
    """A path or hf: name as it is; records (a list of dicts, a `datasets.Dataset`) under a `py:` name."""
    if isinstance(data, str):
        return data
    if _is_records(data):
        return register_object(data, "data")
    raise cli.UsageError(f"{what}: a path, an hf: name, a list of dicts or a datasets.Dataset, got "
                         f"{type(data).__name__}")


class Trainer:
    """One training run in `workdir`: train, evaluate, export (as the commands do).

    config: a config file's path, a ConfigDict, or `get_config()`'s result. reward_fns: a callable or a
    list of them, summed with `reward_weights` (default 1 each); each gets `completions` and `records` (the
    dataset rows), and `prompts`, any dataset column, `role`, `turn`, `history` if it names them (TRL's
    `f(prompts, completions, **kwargs)` as written). With reward functions the task is `prompt_reward`;
    train_dataset and eval_dataset replace the config's data; without eval_dataset, `HELD_OUT` of the
    training rows are held out (a seeded draw, said at the start) and never trained on.
    workflow: an object with the batched Workflow protocol
    (envs/workflow.py) or an Episode (envs/episode.py: written for one episode). overrides: config keys.
    callbacks: objects with any of `on_step_end`, `on_evaluate`, `on_save` (TRL's TrainerCallback names),
    each called as method(step, metrics).
    """

    @speaks_like_the_cli
    def __init__(self, config, *, workdir: str, reward_fns: RewardFn | Sequence[RewardFn] | None = None,
                 reward_weights: Sequence[float] | None = None, train_dataset=None, eval_dataset=None,
                 workflow: Any = None, overrides: dict | None = None, callbacks: Sequence[Any] = ()):
        self.workdir = workdir
        self.callbacks = list(callbacks)
        self.config = c = as_config(config, overrides)
        if workflow is not None and reward_fns is not None:
            raise cli.UsageError("give reward_fns (a prompt_reward task) or a workflow, not both")
        kwargs = c.env.kwargs.to_dict()
        with c.unlocked():
            if workflow is not None:
                c.env.workflow = register_object(workflow, "workflow")
            if reward_fns is not None:
                fns = list(reward_fns) if isinstance(reward_fns, (list, tuple)) else [reward_fns]
                if not all(callable(f) for f in fns):
                    raise cli.UsageError("reward_fns: a callable or a list of callables")
                c.env.workflow = "prompt_reward"
                names = [register_object(f, "reward") for f in fns]
                kwargs["reward_fn"] = names[0] if len(names) == 1 else names
                if reward_weights is not None:
                    kwargs["reward_weights"] = [float(w) for w in reward_weights]
            if train_dataset is not None and eval_dataset is None:  # held out: a share of the training rows
                train_dataset, eval_dataset = hold_out(_records(train_dataset, "train_dataset"))
            if train_dataset is not None:
                kwargs["train_path"] = _dataset(train_dataset, "train_dataset")
            if eval_dataset is not None:
                kwargs["test_path"] = _dataset(eval_dataset, "eval_dataset")
            c.env.kwargs = ml_collections.ConfigDict(kwargs)  # a new section: values may change their types

    @speaks_like_the_cli
    def train(self, *, allow_config_change: bool = False, fresh_if_unreadable: bool = False) -> dict:
        """Train (resuming from the workdir's newest checkpoint); returns the last evaluation's metrics (of
        a finished run too: those it logged)."""

        last = run_training(self.config, self.workdir, allow_config_change=allow_config_change,
                            fresh_if_unreadable=fresh_if_unreadable, print_result=False, callbacks=self.callbacks)
        return {k: v for k, v in last.items() if k.startswith("eval")}

    @speaks_like_the_cli
    def evaluate(self, *, splits: Sequence[str] = (), tasks: int | None = None, k: int | None = None,
                 temperature: float | None = None, out: str = "") -> dict:
        """The held-out evaluation of the latest checkpoint (as `python -m atgrpo_jax.evaluate`)."""

        return run_evaluation(copy.deepcopy(self.config), self.workdir, None, splits, tasks, k, temperature, out,
                              print_result=False)

    @speaks_like_the_cli
    def export(self, path: str, *, policy: str | None = None, step: int | None = None, lora: str = "merge",
               overwrite: bool = False, push_to_hub: str | None = None) -> dict:
        """One policy as a Hugging Face model directory at `path` (as `python -m atgrpo_jax.export`);
        push_to_hub="org/name" then uploads it there (its URL in the summary's "pushed")."""

        check_push(push_to_hub)  # before any work: a bad repository id, or offline
        summary = export_policy(self.workdir, path, step=step, policy=policy, lora=lora, overwrite=overwrite,
                                print_result=False)
        if push_to_hub:
            summary["pushed"] = push(summary["out"], push_to_hub, print_result=False)
        return summary
