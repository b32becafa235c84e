"""How a training (or sft) run ends early: on a signal with its last completed step saved, and on an
error that ends it with one line saying what it kept (cli.RunStopped)."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from typing import Any, Callable

import jax

from atgrpo_jax import cli, workdir as wd
from atgrpo_jax.errors import LogWriteError, StageTimeout, UsageError
from atgrpo_jax.train import checkpoint, guard
from atgrpo_jax.train.resume import step_dirs


@dataclasses.dataclass
class Saver:
    """A run's checkpoints: `contents(step)` -> (policy states, meta, extra) is what a save of `step` holds."""

    ckpt: checkpoint.Checkpointer
    writer: Any  # metrics.MetricsWriter: synced first, so an object store holds every row a resume keeps
    contents: Callable[[int], tuple[dict, dict, Any]]

    def save(self, step: int, metrics: dict, force: bool = False) -> None:
        self.writer.sync()
        states, meta, extra = self.contents(step)
        self.ckpt.save(step, states, meta=meta, metrics=metrics, force=force, extra=extra)
        if force:
            self.ckpt.wait()

    def hold(self, step: int) -> tuple:
        """What a save of `step` holds, taken as it completes (references to its arrays, not copies), so that
        it can still be saved if the next step fails before its update replaces them (`keep_held`)."""
        return self.contents(step)

    def keep_held(self, done: int, held: tuple, start: int, last: dict, healthy: bool,
                  deadline_s: float | None = None) -> bool:
        """Save step `done` from `hold(done)` when a later step failed; whether it is saved now. Not when it
        is not new (or saved already) or not healthy, nor when the failed step's update had begun (its
        arrays donated to the update, so they are gone). deadline_s: give up after this long (a stuck stage
        may hold the device)."""
        states, meta, extra = held
        if done <= start or not healthy or self.ckpt.latest_step() == done:
            return False
        if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves((states, extra))):
            return False

        def save():
            self.writer.sync()
            self.ckpt.save(done, states, meta=meta, metrics=last, force=True, extra=extra)
            self.ckpt.wait()
        return within(deadline_s, save)

    def abandoned(self, stop: guard.StopSignals, start: int, done: int, held: tuple, last: dict,
                  healthy: bool) -> cli.RunStopped:
        """Step done + 1 abandoned by a signal (its reward calls, sandboxed programs and rollout stages not
        waited for): save step `done` from `hold(done)` within what is left of the deadline, and stop with
        one line naming the signal, exiting at once (threads of the abandoned step may still run)."""
        self.keep_held(done, held, start, last, healthy, stop.left_s())
        stopped = cli.RunStopped.by_signal(stop.name, stop.exit_code, done, close_keeping(self.ckpt))
        stopped.hard = True
        return stopped

    def stopped(self, stop: guard.StopSignals, start: int, done: int, last: dict, healthy: bool) -> cli.RunStopped:
        """Save step `done` (if it is new and healthy) and stop with one line naming the signal."""
        if done > start and healthy and self.ckpt.latest_step() != done:
            self.save(done, last, force=True)
        kept = self.ckpt.latest_step()
        self.ckpt.close()
        return cli.RunStopped.by_signal(stop.name, stop.exit_code, done, kept)


def within(seconds: float | None, fn: Callable[[], None]) -> bool:
    """Run `fn` (in a helper thread when `seconds` is given); whether it finished in time. Its error is
    raised here; one still running after `seconds` is left behind (a daemon thread: the process is
    about to exit)."""
    if seconds is None:
        fn()
        return True
    finished, error = threading.Event(), []

    def work():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            error.append(e)
        finally:
            finished.set()
    threading.Thread(target=work, daemon=True, name="save within a deadline").start()
    done = finished.wait(seconds)
    if error:
        raise error[0]
    return done


ONE_LINE = (UsageError, StageTimeout)  # a user's reward, data or config, a hung stage; anything else is a bug


def step_failed(e: BaseException, step: int, saved: bool, kept: int | None) -> cli.RunStopped | None:
    """The one line of a run whose step `step` raised `e` (a reward function, an environment, a workflow, a
    stage timeout) after the last completed step was saved (`saved`) or not; `kept`: the newest checkpoint
    that verifies. None for an error that keeps its traceback (a bug: the line is printed before it)."""
    if saved:
        what = f"checkpoint {kept} saved (the last completed step); fix the cause and run the same command to " \
               f"resume from step {kept}"
    elif kept is not None:
        what = f"last checkpoint: {kept}; fix the cause and run the same command to resume from step {kept}"
    else:
        what = "no checkpoint yet; fix the cause and run the same command to start afresh"
    if isinstance(e, ONE_LINE):
        hard = isinstance(e, StageTimeout)  # its stuck thread is not waited for
        return cli.RunStopped(f"error: at step {step}: {e}; {what}", 1 if hard else cli.EXIT_USAGE, hard=hard)
    print(f"error: at step {step}: {type(e).__name__} (below); {what}", file=sys.stderr, flush=True)
    return None


@contextlib.contextmanager
def ending_in_one_line(ckpt: checkpoint.Checkpointer, writer, bar, step: Callable[[], int]):
    """Errors that end a run as one line with the last checkpoint (`step()`: the step it was at); the
    progress bar and the metrics writer closed whatever happens (an object-store workdir gets its last
    upload even after an error)."""
    try:
        yield
    except checkpoint.SaveError as e:  # disk full, permissions: the run cannot go on safely
        raise save_failed(e) from None
    except LogWriteError as e:  # the same for its metrics: nothing it logs from here on would be kept
        kept = close_keeping(ckpt)
        raise cli.RunStopped(f"error: at step {step()}: {e}; the run stopped (last checkpoint: "
                             f"{kept if kept is not None else 'none'}; the same command resumes from it)", 1) from None
    except StageTimeout as e:  # a hung device call or sandbox wait: the step cannot finish
        kept = close_keeping(ckpt)
        raise cli.RunStopped(f"error: at step {step()}: {e}; the run stopped "
                             f"(last checkpoint: {kept if kept is not None else 'none'})", 1, hard=True) from None
    finally:
        bar.close()
        try:
            writer.close()
        except LogWriteError as e:
            if not isinstance(sys.exc_info()[1], cli.RunStopped):  # an error already on its way says it all
                raise cli.RunStopped(f"error: {e}; the run stopped", 1) from None


def close_keeping(ckpt: checkpoint.Checkpointer) -> int | None:
    """The newest checkpoint that verifies, the checkpointer closed, on a run's way out after another error
    (a save still in flight that failed too is not reported over it)."""
    try:
        ckpt.close()
    except checkpoint.SaveError:
        pass
    if wd.is_remote(ckpt.directory):
        return None
    try:
        for step in reversed(step_dirs(ckpt.directory)):
            try:
                ckpt.verify(step)
                return step
            except checkpoint.CheckpointDamaged:
                continue
    except OSError:
        pass
    return None


def save_failed(e: checkpoint.SaveError) -> cli.RunStopped:
    return cli.RunStopped(f"error: {e}; the run stopped (earlier checkpoints are kept)", 1)


def diverged_stop(ckpt, streaks: dict, step: int, limit: int) -> cli.RunStopped:
    """The run's one line when a policy's updates were skipped `limit` times in a row."""
    name = max(streaks, key=streaks.get)
    kept = ckpt.newest_verified()
    ckpt.close()
    who = f"policy {name}'s" if len(streaks) > 1 else "the"
    return cli.RunStopped(f"error: diverged at step {step}: {who} last {streaks[name]} updates were skipped "
                          f"(non-finite loss or gradient; train.max_skipped_updates={limit}); "
                          f"last good checkpoint: {kept if kept is not None else 'none'}. Usual causes: "
                          f"{guard.DIVERGENCE_CAUSES}; resume from it with other settings", 1)
