"""What a run (train or sft) does before its first step: the checks made before the workdir is
touched, the lock, the resume check against the run's own config.json, and the outputs it opens."""
from __future__ import annotations

import contextlib

import jax

from atgrpo_jax import workdir as wd
from atgrpo_jax.distributed import init_distributed
from atgrpo_jax.errors import ConfigError
from atgrpo_jax.train import guard, wandb_log
from atgrpo_jax.train.config import RESUMABLE, changed_keys, flat, from_saved
from atgrpo_jax.train.init_from import source_checkpoint
from atgrpo_jax.train.lock import WorkdirLock
from atgrpo_jax.train.metrics import MetricsWriter
from atgrpo_jax.train.progress import ProgressBar
from atgrpo_jax.train.update import lr_factor
from atgrpo_jax.train.validate import resolve


def check_before_writing(config, workdir: str) -> None:
    """Every error a run can know of before it writes: the workdir (its store's packages, a file in its
    place, write access), the loggers' packages and model.init_from; then jax.distributed starts, so
    that which process leads is known before the workdir is touched."""
    wd.require_support(workdir, checkpoints=True)  # a gs:// workdir without its packages fails here
    wd.check_workdir(workdir)
    wd.check_writable(workdir, "--workdir")
    if "wandb" in config.train.loggers and wandb_log.missing():
        raise ConfigError(f"config.train.loggers: 'wandb' needs {wandb_log.missing()}")
    if config.model.init_from and not wd.exists(wd.checkpoint_dir(workdir)):
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
    saved = wd.saved_config(workdir)
    if saved is None:
        return {}
    changed = changed_keys(resolve(from_saved(saved), weights=False), config)
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
