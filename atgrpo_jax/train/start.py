"""What a run does before its first step: the checks made before the workdir is touched, the lock,
the resume check against the run's own config.json and the outputs it opens (train and sft both),
and for train, `open_run`: the run built, restored or started, its outputs open."""
from __future__ import annotations

import contextlib
import dataclasses

import jax

from atgrpo_jax import workdir as wd
from atgrpo_jax.distributed import init_distributed
from atgrpo_jax.errors import ConfigError
from atgrpo_jax.train import checkpoint, guard, setup, wandb_log
from atgrpo_jax.train.config import RESUMABLE, flat
from atgrpo_jax.train.heldout import evaluation_splits
from atgrpo_jax.train.init_from import source_checkpoint
from atgrpo_jax.train.lock import WorkdirLock
from atgrpo_jax.train.metrics import MetricsWriter
from atgrpo_jax.train.progress import ProgressBar, say
from atgrpo_jax.train.resume import changes_from_saved, has_checkpoints, restore_or_start
from atgrpo_jax.train.step import set_policy_states
from atgrpo_jax.train.update import lr_factor


def check_before_writing(config, workdir: str) -> None:
    """Every error a run can know of before it writes: the workdir (its store's packages, a file in its
    place, write access), the loggers' packages and model.init_from; then jax.distributed starts, so
    that which process leads is known before the workdir is touched."""
    wd.require_support(workdir, checkpoints=True)  # a gs:// workdir without its packages fails here
    wd.check_workdir(workdir)
    wd.check_writable(workdir, "--workdir")
    if "wandb" in config.train.loggers and wandb_log.missing():
        raise ConfigError(f"config.train.loggers: 'wandb' needs {wandb_log.missing()}")
    if config.model.init_from and not has_checkpoints(workdir):
        source_checkpoint(config.model.init_from)  # a resumed run restores its own checkpoint instead
    init_distributed(config.distributed)


@contextlib.contextmanager
def held(workdir: str):
    """The workdir locked (by the lead process) and SIGTERM/SIGINT caught for the run inside: yields
    the guard.StopSignals."""
    lock = WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()
    with guard.StopSignals() as stop, lock:
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


def open_outputs(config, workdir: str, lead: bool, start: int, changed: dict, schedule_changes: dict,
                 resumed: bool, steps: int, keys: tuple) -> tuple[MetricsWriter, ProgressBar]:
    """config.json written (the earlier one kept on a change), a resume announced with what changed and what
    the schedule then spans (`schedule_changes`: {"train.steps": (old, new)} if it moved), and the run's
    metrics writer and progress bar opened."""
    t = config.train
    if lead:
        wd.write_config(config, workdir, keep_as=f"config.step{start}.json" if changed and start else "")
        if start:
            changes = ", ".join(f"{k}={b!r} (was {a!r})" for k, (a, b) in changed.items())
            print(f"resuming at step {start}" + (f" with changed settings: {changes}" if changes else "")
                  + horizon_note(config.optim, schedule_changes, start, config.reference.lr_schedule), flush=True)
    extra = [wandb_log.WandbLogger(workdir, flat(config), project=t.wandb_project, entity=t.wandb_entity,
                                   resumed=resumed)] if lead and "wandb" in t.loggers else []
    writer = MetricsWriter(workdir, enabled=lead, resume_step=start if resumed else -1,
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


def open_run(config, workdir, allow_config_change, fresh_if_unreadable, stop, lead: bool) -> Opened:
    """Build the run, restore its newest checkpoint that restores (or start fresh), then open its outputs:
    nothing in the workdir changes before a state is in hand (its compilation cache aside)."""
    t = config.train
    resumed = has_checkpoints(workdir)
    changed = check_resume(config, workdir, allow_config_change) if resumed else {}
    say("building the run: tokenizer, model, workflow", lead)
    run = setup.build_run(config, workdir, init_from=not resumed)
    say(run_summary(run), lead)
    stop.install()  # after jax.distributed.initialize, which takes SIGTERM for itself
    splits = evaluation_splits(run)
    best = "valid_success" if "valid" in splits else "eval_success"  # choose on validation, report test
    start, states, meta = restore_or_start(config, run, workdir, fresh_if_unreadable, changed)
    if states is not None:
        set_policy_states(run, states)
    elif resumed and config.model.init_from:  # no checkpoint restored after all: a fresh start, from model.init_from
        run = setup.build_run(config, workdir, init_from=True)
    ckpt = checkpoint.Checkpointer(wd.checkpoint_dir(workdir), keep_last=t.keep_last, best_metric=best)
    writer, bar = open_outputs(config, workdir, lead, start, changed, changed, states is not None, t.steps,
                               ("success", "reward", "loss", "grad_norm", "skipped"))
    return Opened(run, start, states, meta, splits, ckpt, writer, bar)


def run_summary(run) -> str:
    """One line of what a run is: model, policies, devices, workflow."""
    cfg = run.policies[0].model().cfg
    devices = run.mesh.devices
    return (f"{cfg.num_params() / 1e6:,.1f}M-parameter model, {len(run.policies)} "
            f"polic{'y' if len(run.policies) == 1 else 'ies'} on {devices.size} {devices.flat[0].platform} "
            f"device{'s' if devices.size > 1 else ''}; {run.workflow.name} with agents "
            f"{', '.join(a.name for a in run.workflow.agents)}")
