"""What a run does before its first step: the checks made before the workdir is touched, the lock,
the resume check against the run's own config.json and the outputs it opens (train and sft both),
and for train, `open_run`: the run built, restored or started, its outputs open."""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import time

import jax

from atgrpo_jax import workdir as wd
from atgrpo_jax.distributed import init_distributed
from atgrpo_jax.errors import ConfigError, LogWriteError, NotWritable
from atgrpo_jax.train import checkpoint, guard, setup, wandb_log
from atgrpo_jax.train.config import RESUMABLE, Config, flat
from atgrpo_jax.train.heldout import evaluation_splits
from atgrpo_jax.train.history import check_history
from atgrpo_jax.train.init_from import source_checkpoint
from atgrpo_jax.train.lock import LOCK_FILE, WorkdirLock
from atgrpo_jax.train.metrics import MetricsWriter
from atgrpo_jax.train.metrics_files import EPISODES_FILE, METRICS_FILE, TB_DIR
from atgrpo_jax.train.prefetch import Prefetch
from atgrpo_jax.train.progress import ProgressBar, say
from atgrpo_jax.train.resume import changes_from_saved, has_checkpoints, keep_history, restore_or_start
from atgrpo_jax.train.step import policy_states, set_policy_states
from atgrpo_jax.train.update import lr_factor


def check_before_writing(config, workdir: str) -> None:
    """Every error a run can know of before it writes: the workdir (its store's packages, a file in its
    place, write access), the loggers' packages and model.init_from; then jax.distributed starts, so
    that which process leads is known before the workdir is touched."""
    wd.require_support(workdir, checkpoints=True)  # a gs:// workdir without its packages fails here
    wd.check_workdir(workdir)
    check_layout(workdir)
    wd.check_writable(workdir, "--workdir")
    if "wandb" in config.train.loggers and wandb_log.missing():
        raise ConfigError(f"config.train.loggers: 'wandb' needs {wandb_log.missing()}")
    if not has_checkpoints(workdir):  # a resumed run restores its own checkpoint instead
        for where, source in init_sources(config):
            source_checkpoint(source, f"config.{where}")
    init_distributed(config.distributed)


# What a run keeps in its workdir, and whether each is a folder (True) or a file.
LAYOUT = {"checkpoints": True, TB_DIR: True, "trace": True, METRICS_FILE: False, EPISODES_FILE: False,
          wd.CONFIG_FILE: False, LOCK_FILE: False}


def check_layout(workdir: str) -> None:
    """A one-line error for a name in the workdir that is not what the run keeps there (a file named
    checkpoints, a folder named metrics.jsonl): found before anything is written, not at the first save."""
    if not wd.isdir(workdir):
        return
    for name, folder in LAYOUT.items():
        path = wd.join(workdir, name)
        if wd.exists(path) and wd.isdir(path) != folder:
            raise NotWritable(f"--workdir {workdir}: {name} is a {'file' if folder else 'folder'}, where the run "
                              f"keeps its {'folder' if folder else 'file'} {name}; move it away, or give another "
                              "--workdir")


def check_room(config: Config, run: setup.Run, workdir: str) -> None:
    """Room on the workdir's disk for one checkpoint of `run` (its state as built, and as a staleness run
    also keeps the weights its rollouts in flight sample with), checked at the start, not after the first
    interval of training."""
    if not config.train.checkpoint_every:
        return
    states = policy_states(run)
    needed = checkpoint.local_bytes(states)
    if config.system.staleness:
        needed += config.system.staleness * checkpoint.local_bytes({n: s.params for n, s in states.items()})
    directory = wd.checkpoint_dir(workdir)
    try:  # a killed save's leftovers are deleted before the first save: their room counts as free
        needed -= sum(wd.tree_bytes(p) for p in glob.glob(os.path.join(directory, "*.orbax-checkpoint-tmp*")))
        checkpoint.check_free_space(directory, max(needed, 0))
    except OSError as e:
        raise NotWritable(f"--workdir {workdir}: no room for a checkpoint ({e.strerror}); free some space or give "
                          "another --workdir") from None


def init_sources(config) -> list[tuple[str, str]]:
    """(key, run workdir) of each model.init_from a fresh start reads: the run's, and each role's own."""
    out = [("model.init_from", config.model.init_from)] if config.model.init_from else []
    return out + [(f"policy.role_models.{role}.init_from", own["init_from"])
                  for role, own in config.policy.role_models.items() if own.get("init_from")]


@contextlib.contextmanager
def held(workdir: str, deadline_s: float | None = None):
    """The workdir locked (by the lead process) and SIGTERM/SIGINT caught for the run inside: yields
    the guard.StopSignals (deadline_s: train.preempt_deadline_s)."""
    lock = WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()
    with guard.StopSignals(deadline_s) as stop, lock:
        if getattr(lock, "notice", ""):
            print(f"note: {lock.notice}", flush=True)
        yield stop


def check_resume(config, workdir: str, allow_config_change: bool, resumable: tuple = RESUMABLE) -> dict:
    """{key: (the run's value, now)} of the keys in which `config` (resolved) differs from the run's
    config.json; an error if any of them may not change on a resume (not under `resumable`)."""
    changed = changes_from_saved(workdir, config)
    fixed = {k: v for k, v in changed.items() if not k.startswith(resumable)}
    if fixed and not allow_config_change:
        shown = "; ".join(f"config.{k}: {a!r} in the run, {b!r} now" for k, (a, b) in fixed.items())
        raise ConfigError(f"{workdir} holds a run with another config ({shown}). Resume with the run's config, "
                          "use a new --workdir, or pass --allow_config_change to continue with this one")
    return changed


def horizon_note(optim, changed: dict, start: int, as_reference_runs: bool = False) -> str:
    """What a new train.steps does to a cosine schedule on resume: it is recomputed over the new
    length, so the rate of the next step moves (said, not hidden). The reference's schedule ignores
    the length."""
    if optim.schedule != "cosine" or "train.steps" not in changed or as_reference_runs:
        return ""
    before, after = changed["train.steps"]
    old, new = (optim.lr * lr_factor(start + 1, optim, n) for n in (before, after))
    return f"; the cosine schedule now spans {after} steps: step {start + 1}'s rate is {new:.3g} (was {old:.3g})"


@dataclasses.dataclass(frozen=True)
class Launch:
    """How a run was asked to start (the command's flags): where, and what it may do there."""

    workdir: str
    allow_config_change: bool = False  # resume with keys changed that a resume may not change
    fresh_if_unreadable: bool = False  # start afresh when no checkpoint restores (else an error)
    new_history: bool = False  # resume even with metrics.jsonl missing or damaged, in a new file

    @property
    def lead(self) -> bool:
        """Whether this process writes the run's outputs (the first of them)."""
        return jax.process_index() == 0


@dataclasses.dataclass(frozen=True)
class Resumed:
    """Where a run's outputs continue: the last step done (0: a fresh start), whether a checkpoint was
    restored, and what changed since the run's config.json."""

    start: int = 0
    restored: bool = False
    changed: dict = dataclasses.field(default_factory=dict)  # {key: (the run's value, now)}
    schedule_changes: dict = dataclasses.field(default_factory=dict)  # {"train.steps": (old, new)} if it moved


def open_outputs(config, launch: Launch, resumed: Resumed, steps: int, keys: tuple) -> tuple[MetricsWriter,
                                                                                             ProgressBar]:
    """The history checked (a resume continues a whole metrics.jsonl, or with launch.new_history a new one:
    history.check_history), config.json written (the earlier one kept on a change), a resume announced with
    what changed and what the schedule then spans, and the run's metrics writer and progress bar (`steps`
    long, showing `keys`: console_keys) opened."""
    t, workdir = config.train, launch.workdir
    if launch.lead and resumed.restored and resumed.start and "jsonl" in t.loggers:
        saved = wd.saved_config(workdir) or {}
        note = check_history(workdir, resumed.start, saved.get("train", {}).get("log_every", t.log_every),
                             launch.new_history)
        if note:
            print(note, flush=True)
    try:
        return _open_outputs(config, launch, resumed, steps, keys)
    except (OSError, LogWriteError) as e:  # a full disk or one gone read-only since the start's checks
        raise NotWritable(f"--workdir {workdir}: cannot start its outputs ({checkpoint.short_cause(e)}); free "
                          "some space, or give another --workdir") from None


def _open_outputs(config, launch: Launch, resumed: Resumed, steps: int, keys: tuple):
    """open_outputs' writes: config.json, the resume line, the writer and the progress bar."""
    t, workdir, lead, start = config.train, launch.workdir, launch.lead, resumed.start
    if lead:
        wd.write_config(config, workdir, keep_as=f"config.step{start}.json" if resumed.changed and start else "")
        if start:
            changes = ", ".join(f"{k}={b!r} (was {a!r})" for k, (a, b) in resumed.changed.items())
            print(f"resuming at step {start}" + (f" with changed settings: {changes}" if changes else "")
                  + horizon_note(config.optim, resumed.schedule_changes, start, config.reference.lr_schedule),
                  flush=True)
    extra = [wandb_log.WandbLogger(workdir, flat(config), project=t.wandb_project, entity=t.wandb_entity,
                                   resumed=resumed.restored)] if lead and "wandb" in t.loggers else []
    writer = MetricsWriter(workdir, enabled=lead, resume_step=start if resumed.restored else -1,
                           tensorboard="tensorboard" in t.loggers, jsonl="jsonl" in t.loggers, extra=extra)
    return writer, ProgressBar(steps, enabled=lead and "console" in t.loggers, start_step=start, keys=keys)


@dataclasses.dataclass
class Opened:
    """A run built and resumed (or started), with its outputs open: what the loop works on."""

    run: setup.Run
    start: int  # the last step done (0: a fresh run)
    states: dict | None  # the restored policy states (None: a fresh start)
    meta: dict
    splits: list[str]  # what it evaluates
    ckpt: checkpoint.Checkpointer
    writer: MetricsWriter
    bar: ProgressBar
    prefetch: Prefetch | None  # system.staleness >= 1: the rollouts made ahead


def open_run(config, launch: Launch, stop) -> Opened:
    """Build the run, restore its newest checkpoint that restores (or start fresh), then open its outputs:
    nothing in the workdir changes before a state is in hand (its compilation cache aside). stop: the
    run's guard.StopSignals, installed once jax.distributed is up."""
    t, workdir, lead = config.train, launch.workdir, launch.lead
    resumed = has_checkpoints(workdir)
    changed = check_resume(config, workdir, launch.allow_config_change) if resumed else {}
    say("building the run: tokenizer, model, workflow", lead)
    run = setup.build_run(config, workdir, init_from=not resumed)
    say(run_summary(run), lead)
    stop.install()  # after jax.distributed.initialize, which takes SIGTERM for itself
    splits = evaluation_splits(run)
    best = "valid_success" if "valid" in splits else "eval_success"  # choose on validation, report test
    if lead:
        check_room(config, run, workdir)
    start, states, meta = restore_or_start(config, run, workdir, launch.fresh_if_unreadable, changed)
    if lead and not resumed and not wd.is_remote(workdir):  # an earlier run that saved no checkpoint: kept
        aside = wd.join(workdir, f"history-{int(time.time())}")
        kept = keep_history(workdir, aside)
        if kept:
            say(f"starting afresh: no checkpoint to resume from; kept the earlier run's {', '.join(kept)} in {aside}",
                lead)
    if states is not None:
        set_policy_states(run, states)
    elif resumed and config.model.init_from:  # no checkpoint restored after all: a fresh start, from model.init_from
        run = setup.build_run(config, workdir, init_from=True)
    ckpt = checkpoint.Checkpointer(wd.checkpoint_dir(workdir), keep_last=t.keep_last, best_metric=best)
    # the next rollouts, made during an update; on a resume those in flight are made again before any
    # output (config.json included) changes, so a resume that fails here leaves the run as it was
    prefetch = Prefetch(run, t.steps, config.system.staleness) if config.system.staleness else None
    if prefetch is not None and states is not None:
        if not prefetch.restore(ckpt, start, meta) and "system.staleness" in changed:
            say(f"note: the rollouts in flight at step {start} were made under system.staleness="
                f"{changed['system.staleness'][0]}: step {start + 1} samples with its own weights", lead)
    writer, bar = open_outputs(config, launch, Resumed(start, states is not None, changed, changed), t.steps,
                               console_keys([p.name for p in run.policies]))
    return Opened(run, start, states, meta, splits, ckpt, writer, bar, prefetch)


def console_keys(policies: list[str]) -> tuple:
    """What the progress line shows every step: success, the mean reward, and each policy's loss,
    gradient norm and skipped updates (several policies: labelled by their role)."""
    per_policy = ("loss", "grad_norm", "skipped")
    if len(policies) == 1:
        own = per_policy
    else:
        own = tuple((f"{p}/{k}", f"{p.removeprefix('policy_')} {k}") for p in policies for k in per_policy)
    return (("success", "success"), ("reward_mean", "reward")) + own


def run_summary(run: setup.Run) -> str:
    """One line of what a run is: model, policies, devices, workflow."""
    cfg = run.policies[0].model().cfg
    devices = run.mesh.devices
    return (f"{cfg.num_params() / 1e6:,.1f}M-parameter model, {len(run.policies)} "
            f"polic{'y' if len(run.policies) == 1 else 'ies'} on {devices.size} {devices.flat[0].platform} "
            f"device{'s' if devices.size > 1 else ''}; {run.workflow.name} with agents "
            f"{', '.join(a.name for a in run.workflow.agents)}")
