"""Resuming a run: the newest checkpoint that restores, found without changing anything on disk
(system.staleness = 1: train.prefetch makes the run-ahead rollout again from the weights it keeps).

A failed restore is one line (`checkpoint N in DIR does not restore (why); trying checkpoint M`);
orbax's other reads of that checkpoint end later in background threads, and the tracebacks they
would print are dropped (`orbax_quiet.quiet_orbax_leftovers`).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import jax

from atgrpo_jax import cli
from atgrpo_jax.train import checkpoint
from atgrpo_jax.train.config import RESUMABLE, changed_keys, from_saved
from atgrpo_jax.train.validate import resolve
from atgrpo_jax.train.metrics_files import EPISODES_FILE, METRICS_FILE, TB_DIR
from atgrpo_jax import workdir as wd
from atgrpo_jax.train.step import policy_states


def step_dirs(directory: str) -> list[int]:
    """The step numbers of `directory`'s finished step folders (orbax's temporary ones left out),
    whether or not their contents are readable."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def has_checkpoints(workdir: str) -> bool:
    """Whether `workdir` holds a step folder to resume from (an object store: a checkpoints/ folder, a
    listing there is not free). A run that failed before its first save left none: it starts afresh."""
    directory = wd.checkpoint_dir(workdir)
    return wd.exists(directory) if wd.is_remote(directory) else bool(step_dirs(directory))


def changes_from_saved(workdir: str, config) -> dict[str, tuple]:
    """{key: (the run's value, `config`'s)} of the keys in which `config` (resolved) differs from the run's
    config.json in `workdir`; {} without one."""
    saved = wd.saved_config(workdir)
    return {} if saved is None else changed_keys(resolve(from_saved(saved), weights=False), config)


def fixed_changes(workdir: str, config) -> dict[str, tuple]:
    """`changes_from_saved` of the keys a resume may not change (RESUMABLE ones left out)."""
    return {k: v for k, v in changes_from_saved(workdir, config).items() if not k.startswith(RESUMABLE)}


def restore_given(ckpt: checkpoint.Checkpointer, step: int | None, target, how: str, config=None,
                  workdir: str | None = None) -> tuple[Any, dict]:
    """(state, meta) of the checkpoint a command was given (evaluate, export; None: the latest). One that
    does not restore is a one-line error naming it, its cause and the others, with `how` to choose one;
    when `config` differs from the run's own (config.json in `workdir`), the keys that differ instead."""
    try:
        return ckpt.restore(step, target=target)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
        differ = fixed_changes(workdir, config) if config is not None and workdir else {}
        if differ:
            shown = "; ".join(f"{k}: {a!r} in the run, {b!r} here" for k, (a, b) in differ.items())
            raise cli.UsageError(f"the checkpoints in {ckpt.directory} were trained with another config ({shown}), "
                                 "so they do not restore into this one: leave out --config (the run's own "
                                 "config.json is used) or give the run's config") from None
        step = ckpt.latest_step() if step is None else step
        others = [s for s in ckpt.all_steps() if s != step]
        choose = f"; choose another with {how} (saved: {', '.join(map(str, others))})" if others else ""
        raise cli.UsageError(f"checkpoint {step} in {ckpt.directory} does not restore "
                             f"({checkpoint.short_cause(e)}){choose}") from None


def restore_newest_readable(directory: str, target, say) -> tuple[int | None, Any, dict, list[int]]:
    """(step, state, meta, unreadable steps) of the newest checkpoint in `directory` that restores
    whole and finite, trying older ones in turn; `say(line)` reports each one that does not.
    Opens the directory read-only: nothing on disk changes. step is None if none restores."""
    import warnings

    from absl import logging as absl_logging

    bad = []
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax warns that a read-only manager saves nothing
    reader = checkpoint.Checkpointer(directory, keep_last=0, best_metric=None, read_only=True)
    try:
        # local: every step folder, even one whose metadata orbax cannot read; a store: orbax's list
        steps = reader.all_steps() if wd.is_remote(directory) else step_dirs(directory)
        for step in reversed(steps):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    state, meta = reader.restore(step, target=target)
                if not checkpoint.is_finite_state(state):
                    raise ValueError("it holds a NaN or inf")
                int(meta["step"])
            except Exception as e:  # noqa: BLE001 - any failure means: not this one
                bad.append(step)
                older = [s for s in steps if s < step]
                then = f"trying checkpoint {older[-1]}" if older else "no older checkpoint"
                say(f"checkpoint {step} in {directory} does not restore ({checkpoint.short_cause(e)}); {then}")
                continue
            return step, state, meta, bad
        return None, None, {}, bad
    finally:
        reader.close()
        absl_logging.set_verbosity(verbosity)


HISTORY = (METRICS_FILE, EPISODES_FILE, TB_DIR, "trace", wd.CONFIG_FILE)  # what a run writes besides checkpoints


def keep_history(workdir: str, where: str) -> list[str]:
    """Move the earlier run's metrics, episodes, TensorBoard events, traces and config (those it has) from a
    local `workdir` to `where`; returns what was moved."""
    moved = []
    for name in HISTORY:
        src = os.path.join(workdir, name)
        if os.path.exists(src):
            os.makedirs(where, exist_ok=True)
            os.replace(src, os.path.join(where, name))
            moved.append(name)
    return moved


def restore_or_start(config, run, workdir: str, fresh_if_unreadable: bool,
                     changed: dict | None = None) -> tuple[int, dict | None, dict]:
    """(step to start after, restored policy states or None, its meta): the newest checkpoint that restores;
    unreadable newer ones are reported one line each and moved to checkpoints.unreadable/ once a
    restore succeeded (they would block later saves). None restores: an error, or with
    `fresh_if_unreadable` a fresh start (all of them moved aside, and the earlier run's metrics,
    episodes and TensorBoard events beside them). changed: the config keys a resume changed
    (--allow_config_change); when none restores after such a change, the change is named as the cause."""
    lead = jax.process_index() == 0
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if lead else (lambda line: None)
    directory = wd.checkpoint_dir(workdir)
    if not wd.is_remote(directory) and not step_dirs(directory):
        return 0, None, {}  # (a store is asked through orbax: a listing there is not free)
    step, states, meta, bad = restore_newest_readable(directory, policy_states(run), say)
    fixed = {k: v for k, v in (changed or {}).items() if not k.startswith(RESUMABLE)}
    if step is None and fixed:  # not damage: the config no longer describes these checkpoints
        shown = "; ".join(f"{k} changed from {a!r} to {b!r}" for k, (a, b) in fixed.items())
        raise cli.RunStopped(f"error: the run's checkpoints do not restore into this config ({shown}: they hold "
                             "other shapes or dtypes); nothing was changed. Resume with the run's config, or train "
                             "this one in a new --workdir", 1)
    if step is None and not fresh_if_unreadable:
        raise cli.RunStopped(f"error: no checkpoint in {directory} restores (tried {', '.join(map(str, bad))}); "
                             "nothing was changed. Pass --fresh_if_unreadable to start again from step 0 "
                             "(they are then moved to checkpoints.unreadable/)", 1)
    if bad and wd.is_remote(directory):  # no rename on a store: they would block every later save
        raise cli.RunStopped(f"error: delete the unreadable checkpoints {', '.join(map(str, bad))} of {directory}, "
                             "then run the same command again; nothing was changed", 1)
    if lead and bad:
        aside = wd.join(workdir, "checkpoints.unreadable")
        stamp = int(time.time())
        os.makedirs(aside, exist_ok=True)
        for s in bad:
            os.replace(os.path.join(directory, str(s)), os.path.join(aside, f"{s}-{stamp}"))
        say(f"moved unreadable checkpoint(s) {', '.join(map(str, bad))} to {aside}")
        if step is None:  # a fresh start: the earlier run's history is kept whole, beside its checkpoints
            kept = keep_history(workdir, os.path.join(aside, f"history-{stamp}"))
            if kept:
                say(f"kept the earlier run's {', '.join(kept)} in {os.path.join(aside, f'history-{stamp}')}")
    if step is None:
        say("starting again from step 0: no checkpoint restored")
        return 0, None, {}
    return int(meta["step"]), states, meta
