"""What the training loop does after each step, as hooks with a cadence (after Levanter's trainer hooks):
evaluation, the metrics row, the progress bar, the divergence guard, the checkpoint. The loop runs
them in order after every step; a hook runs when its step comes round (`every`), at the run's last
step (forced: the last step, or the one the time budget ends on) and whenever its own condition asks.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass
class StepInfo:
    """One finished training step, as the hooks see (and extend) it."""

    step: int
    metrics: dict  # the step's metrics; hooks add to them (held-out figures, time_s)
    final: bool  # the run's last step: train.steps, or the time budget ran out
    diverged: bool  # a policy's updates have been skipped train.max_skipped_updates times in a row
    healthy: bool  # no update of this step was skipped and no streak runs: its weights may be saved
    evaluated: bool = False  # (set by the evaluation hook)


@dataclasses.dataclass(frozen=True)
class Hook:
    fn: Callable[[StepInfo], None]
    every: int  # steps between runs (0: only when forced or asked)
    forced: bool = True  # runs at the final step too
    when: Callable[[StepInfo], bool] = lambda info: True  # a condition of its own, checked first  # noqa: E731
    also: Callable[[StepInfo], bool] = lambda info: False  # runs whatever the cadence when this holds  # noqa: E731

    def due(self, info: StepInfo) -> bool:
        if not self.when(info):
            return False
        return self.also(info) or bool(self.every and info.step % self.every == 0) or (self.forced and info.final)


def run_hooks(hooks: list[Hook], info: StepInfo) -> None:
    for hook in hooks:
        if hook.due(info):
            hook.fn(info)


CALLBACK_METHODS = ("on_step_end", "on_evaluate", "on_save")  # TRL's TrainerCallback names


def user_hooks(callbacks, checkpoint_every: int) -> list[Hook]:
    """The user's callbacks as hooks after the trainer's own: `on_step_end(step, metrics)` after every
    step (its metrics, held-out figures included), `on_evaluate(step, metrics)` after an evaluation,
    `on_save(step, metrics)` after a checkpoint is written. A callback that raises stops the run with
    one line naming it (UsageError)."""
    from atgrpo_jax.errors import UsageError

    def call(cb, name):
        method = getattr(cb, name)

        def run(info: StepInfo):
            try:
                method(info.step, dict(info.metrics))
            except Exception as e:  # noqa: BLE001 - the user's code: one line naming it
                detail = str(e).strip().splitlines()[0] if str(e).strip() else "(no message)"
                raise UsageError(f"callback {type(cb).__name__}.{name} raised {type(e).__name__} at step "
                                 f"{info.step}: {detail}") from None
        return run

    hooks = []
    for cb in callbacks:
        if not any(hasattr(cb, m) for m in CALLBACK_METHODS):
            raise UsageError(f"callbacks: {cb!r} has none of {', '.join(CALLBACK_METHODS)}")
        if hasattr(cb, "on_step_end"):  # (TRL's order: step end, evaluation, save)
            hooks.append(Hook(call(cb, "on_step_end"), every=1))
        if hasattr(cb, "on_evaluate"):
            hooks.append(Hook(call(cb, "on_evaluate"), 0, forced=False, also=lambda i: i.evaluated))
        if hasattr(cb, "on_save"):
            hooks.append(Hook(call(cb, "on_save"), checkpoint_every, when=lambda i: i.healthy and bool(checkpoint_every)))
    return hooks
