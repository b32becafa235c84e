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
