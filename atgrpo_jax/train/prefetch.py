"""system.staleness = 1: step s + 1's rollout is made while step s's update runs, with the weights
from before that update. Everything about it lives here: which weights sample, the rollout made
ahead, what a checkpoint keeps so that a resume makes the same rollout again.

In a step: `take(s)` (the rollout made ahead for s, if any), `start(s + 1)` (keep the weights as
they are, before the update replaces them), then, once the update is dispatched, `make(tracer)`.
"""
from __future__ import annotations

import contextlib

from atgrpo_jax.trace import Tracer
from atgrpo_jax.train.policies import Snapshot
from atgrpo_jax.train.step import Rollout, rollout_step


class Prefetch:
    def __init__(self, run, last_step: int):
        self.run, self.last_step = run, last_step
        # {policy name: Snapshot} that sample (or sampled) the rollout of step `_step`; a checkpoint keeps them
        self.held: dict[str, Snapshot] = {}
        self._step: int | None = None
        self._ahead: Rollout | None = None

    def covers(self, step: int) -> bool:
        """Whether step `step`'s rollout is made ahead (not for the first step, nor after the last)."""
        return step <= self.last_step

    def take(self, step: int) -> Rollout | None:
        """The rollout made ahead for `step` (None: none was, the step samples with its own weights)."""
        ahead, self._ahead = self._ahead, None
        return ahead if ahead is not None and ahead.step == step else None

    def start(self, step: int) -> None:
        """Keep every policy's current weights for step `step`'s rollout (before the update that
        replaces them is dispatched); past the last step, keep nothing."""
        self._step = step if self.covers(step) else None
        self.held = {p.name: p.snapshot() for p in self.run.policies} if self._step is not None else {}

    def make(self, tracer: Tracer | None = None) -> None:
        """Make the started rollout with the kept weights (while the update runs on the devices)."""
        if self._step is not None:
            self._ahead = self._sample(self._step, tracer)

    def _sample(self, step: int, tracer: Tracer | None) -> Rollout:
        with contextlib.ExitStack() as stack:
            for p in self.run.policies:
                stack.enter_context(p.sampling_with(self.held[p.name]))
            return rollout_step(self.run, step, tracer, sampled_at=tuple(self.held[p.name].step
                                                                         for p in self.run.policies))

    def checkpoint_extra(self) -> tuple[dict | None, dict]:
        """(params, meta) a checkpoint keeps so that a resume makes the rollout ahead again: the kept
        weights and their optimizer steps; (None, {}) when no rollout is made ahead."""
        if not self.held:
            return None, {}
        return ({name: s.params for name, s in self.held.items()},
                {"behavior_steps": {name: s.step for name, s in self.held.items()}})

    def restore(self, ckpt, start: int, meta: dict) -> None:
        """On resume at `start`: step start + 1's rollout ran on the weights from before step start's
        update; the checkpoint keeps them, so the same rollout is made again and the resumed run equals
        an uninterrupted one. Without them (saved at a run's last step) step start + 1 samples on-policy."""
        if not self.covers(start + 1):
            return
        saved = ckpt.restore_extra(start, {p.name: p.state.params for p in self.run.policies})
        steps = meta.get("behavior_steps") or {}
        if saved is None or set(saved) != set(steps):
            return
        self.held = {name: Snapshot(params, int(steps[name])) for name, params in saved.items()}
        self._step = start + 1
        self.make(Tracer())
