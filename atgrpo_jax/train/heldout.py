"""Held-out evaluation: k independent (no-tree) episodes per task of a split, with the agents'
evaluation sampling (rollout.eval_*); avg@k and pass@k per split."""
from __future__ import annotations

import jax
import numpy as np

from atgrpo_jax.rollout.plain import PlainRollout
from atgrpo_jax.train.setup import Run
from atgrpo_jax.train.step import rollout


def evaluation_splits(run: Run) -> list[str]:
    """What the trainer evaluates: the validation split (if the workflow has one), then its test splits."""
    return [s for s in ("valid",) if s in run.workflow.splits] + list(run.workflow.test_splits)


def evaluate(run: Run, split: str, num_tasks: int, k: int = 1, temperature: float | None = None):
    """(metrics, episodes) of k independent (no-tree) episodes per task of `split`: every problem
    of a finite split once, else `num_tasks` generated tasks. avg@k: mean success over all
    episodes; pass@k: the fraction of tasks with a success among their k."""
    size = run.workflow.splits.get(split, "unknown")
    if size == "unknown":
        raise ValueError(f"split {split!r}: the workflow has {', '.join(run.workflow.splits)}")
    n = num_tasks if size is None else size
    per = -(-n // jax.process_count()) * jax.process_count()  # every process gets as many tasks
    ids = np.minimum(np.arange(per), n - 1)  # (the padding repeats the last task; it is dropped below)
    strategy = PlainRollout(k, run.config.rollout.plain_grouping)
    _, episodes = rollout(run, strategy, ids, split, temperature, jax.random.key(run.config.train.seed + 1),
                          evaluation=True)
    wins = episodes.episode_success[:n]
    return {f"eval/{split}/avg@{k}": float(wins.mean()), f"eval/{split}/pass@{k}": float(wins.any(1).mean()),
            f"eval/{split}/turns": float(np.mean(episodes.turns[:n]))}, episodes


def evaluation(run: Run, splits, num_tasks: int, k: int = 1, temperature: float | None = None):
    """(metrics, {split: episodes}) over several splits; `eval_success` is the mean avg@k of the
    test splits among them, `valid_success` the validation split's (which chooses the best checkpoint)."""
    metrics, episodes = {}, {}
    for split in splits:
        m, episodes[split] = evaluate(run, split, num_tasks, k, temperature)
        metrics.update(m)
    tests = [s for s in splits if s in run.workflow.test_splits]
    if tests:
        metrics["eval_success"] = float(np.mean([metrics[f"eval/{s}/avg@{k}"] for s in tests]))
        metrics["eval_turns"] = float(np.mean([metrics[f"eval/{s}/turns"] for s in tests]))
    if "valid" in splits:
        metrics["valid_success"] = metrics[f"eval/valid/avg@{k}"]
    return metrics, episodes
