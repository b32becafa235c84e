"""What stops a run early and cleanly: SIGTERM/SIGINT (preemption, Ctrl-C) and divergence.

`StopSignals` turns the first SIGTERM or SIGINT into a request that the training loop reads
at its safe points (between steps, and inside a step before its update starts), so the
loop can save the last completed step and exit 143 / 130 with one line. A second signal
exits at once (no save). On several hosts every process takes part in `requested()` and
all agree: one preempted host stops them all at the same step.

`skip_streaks` counts consecutive skipped (non-finite) updates per policy across steps;
the loop stops the run when one reaches `train.max_skipped_updates`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import numpy as np

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + signal number, as a shell reports it


class StopSignals:
    """A context manager: while inside it, SIGTERM and SIGINT ask the run to stop.

    Outside the main thread (signals cannot be caught there) it installs nothing and
    `requested()` is always False.

    deadline_s (train.preempt_deadline_s): the notice a preempted machine gets. Inside `abandonable()`
    (a training step before it is kept) the first signal abandons the step at once (StepAbandoned,
    raised wherever the main thread is waiting: on a reward call, a sandboxed program, a rollout's
    stage), so the last completed step is saved without waiting for them; and whatever the run is
    doing, it exits once deadline_s have passed since the signal (the last checkpoint on disk stays).
    """

    def __init__(self, deadline_s: float | None = None):
        self.signum: int | None = None
        self.at: float | None = None  # time.monotonic() of the first signal
        self.deadline_s = deadline_s
        self._previous: dict[int, object] = {}
        self._abandonable = False
        self._over = threading.Event()  # the run is over: the deadline's watch ends

    def _handle(self, signum, frame):
        if self.signum is not None:  # the second signal: the user (or the scheduler) will not wait
            print(f"second {signal.Signals(signum).name}: exiting now without saving", file=sys.stderr, flush=True)
            os._exit(EXIT_CODES[signum])
        self.signum, self.at = signum, time.monotonic()
        if self.deadline_s:
            threading.Thread(target=self._watch, name="preempt-deadline", daemon=True).start()
        if self._abandonable:
            self._abandonable = False
            raise StepAbandoned(f"{signal.Signals(signum).name} during the step")

    def _watch(self):
        if not self._over.wait(self.deadline_s):
            print(f"{self.name}: the run did not stop within train.preempt_deadline_s={self.deadline_s:g}; exiting "
                  "now (the last checkpoint on disk stays)", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(self.exit_code)

    def left_s(self) -> float | None:
        """Seconds left of the deadline since the signal (None: no deadline)."""
        if not self.deadline_s or self.at is None:
            return None
        return max(self.deadline_s - (time.monotonic() - self.at), 0.0)

    def before_update(self) -> bool:
        """Whether the step is to be abandoned, asked just before each of its updates starts (train_step's
        `abandon`); when not, it may no longer be abandoned at once: the update replaces the weights the
        last completed step's checkpoint would hold."""
        if self.requested():
            return True
        self._abandonable = False
        return False

    @contextlib.contextmanager
    def abandonable(self):
        """Inside: a signal abandons the step at once (one process only: several must agree on the step
        at which they stop, which `requested()` does at the loop's safe points)."""
        import jax

        if self.signum is not None:
            raise StepAbandoned("stop requested before the step")
        self._abandonable = jax.process_count() == 1 and threading.current_thread() is threading.main_thread()
        try:
            yield
        finally:
            self._abandonable = False

    def __enter__(self):
        self.install()
        return self

    def install(self):
        """Take SIGTERM and SIGINT (again: jax.distributed.initialize installs a SIGTERM handler of
        its own for its preemption notice, so call this once the run is set up)."""
        if threading.current_thread() is threading.main_thread():
            for s in EXIT_CODES:
                previous = signal.signal(s, self._handle)
                self._previous.setdefault(s, previous)  # the first one is what __exit__ puts back

    def __exit__(self, *exc):
        self._over.set()
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def requested(self) -> bool:
        """Whether any process got a stop signal (a collective on several hosts: all call it together)."""
        import jax

        local = self.signum is not None
        if jax.process_count() == 1:
            return local
        from jax.experimental import multihost_utils

        flags = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
        if not local and flags.any():  # another host was signalled: stop with its signal
            self.signum = int(flags[flags > 0][0])
        return bool(flags.any())

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.signum]


class StepAbandoned(Exception):
    """Raised inside a step (before its update) when a stop was requested: the step is not kept."""


# What makes a loss or gradient non-finite, by the keys that set it (for the messages that report it).
DIVERGENCE_CAUSES = ("optim.lr too high, rewards of a large scale (algo.alpha, the reward function), "
                     "optim.b1/optim.b2 too close to 1, or loss.eps_low/eps_high too wide")


def skipped_updates(metrics: dict, names: list[str]) -> int:
    """This step's skipped (non-finite) updates over every policy."""
    return sum(int(metrics.get(f"{n}/skipped" if len(names) > 1 else "skipped") or 0) for n in names)


def skip_streaks(streaks: dict[str, int], metrics: dict, names: list[str]) -> dict[str, int]:
    """Each policy's count of consecutive skipped updates after this step's metrics.

    A step whose updates were all skipped extends the streak; one with any applied update
    restarts it at the updates skipped after the last applied one. A policy with no
    update this step (every group filtered out) keeps its streak.
    """
    out = dict(streaks)
    for name in names:
        prefix = f"{name}/" if len(names) > 1 else ""
        skipped, updates = metrics.get(prefix + "skipped"), metrics.get(prefix + "updates")
        if skipped is None or not updates:
            continue
        tail = int(metrics.get(prefix + "skipped_tail", 0))
        out[name] = out.get(name, 0) + int(skipped) if skipped == updates else tail
    return out


class SignalWatch:
    """Says once when a run cannot learn: every group's K rewards equal (every advantage 0) for `steps`
    training steps in a row, so the updates change nothing."""

    def __init__(self, steps: int = 5):
        self.steps, self.flat, self.said = steps, 0, False

    def update(self, metrics: dict) -> str | None:
        """The warning to print after this step's metrics (once per run), or None."""
        self.flat = self.flat + 1 if metrics.get("adv_abs_mean", 1.0) == 0 else 0
        if self.flat < self.steps or self.said:
            return None
        self.said = True
        return (f"warning: no learning signal: in each of the last {self.steps} steps every group's rewards were "
                f"all equal (reward mean {metrics.get('reward_mean', float('nan')):.3g}), so every advantage is 0 and "
                "the updates change nothing. Sample more diversely (rollout.temperature, rollout.k), give a "
                "reward with more levels, or check that the reward function can tell answers apart")


STALL_GUIDE = 'docs/guides/multi-agent.md "A team that stalls"'


class StallWatch:
    """Says once per cause when a team of roles stalls: a role whose groups all scored alike for `steps`
    steps in a row while other roles' did not (it gives one answer to everything, as a checker that
    always says "n"), or team success 0 for `window` steps while a role's own reward rose (it learns
    its own reward, not the team's). The roles are read from the metrics (`reward/ROLE`); a run of
    one role has nothing to watch."""

    def __init__(self, steps: int = 5, window: int = 10):
        self.steps, self.window = steps, window
        self.flat: dict[str, int] = {}
        self.rows: list[dict] = []
        self.said: set[str] = set()

    def update(self, metrics: dict) -> list[str]:
        roles = [k.split("/", 1)[1] for k in metrics if k.startswith("reward/")]
        if len(roles) < 2:
            return []
        out = []
        for role in roles:
            alone = metrics.get(f"{role}/zero_std_groups") == 1.0 and any(
                metrics.get(f"{other}/zero_std_groups", 1.0) < 1.0 for other in roles if other != role)
            self.flat[role] = self.flat.get(role, 0) + 1 if alone else 0
            if self.flat[role] >= self.steps and role not in self.said:
                self.said.add(role)
                out.append(f"warning: role {role} gets no learning signal: in each of the last {self.steps} steps "
                           f"every one of its groups scored alike (reward/{role} {metrics[f'reward/{role}']:.3g}) "
                           "while the other roles' did not. A role that gives one answer to everything looks like "
                           f"this: read its answers in episodes.jsonl; see {STALL_GUIDE}")
        self.rows = (self.rows + [metrics])[-self.window:]
        if len(self.rows) == self.window and "team" not in self.said and all(
                r.get("success", 1.0) == 0 for r in self.rows):
            half = self.window // 2
            rise = {role: np.mean([r[f"reward/{role}"] for r in self.rows[half:]])
                    - np.mean([r[f"reward/{role}"] for r in self.rows[:half]]) for role in roles
                    if all(np.isfinite(r.get(f"reward/{role}", np.nan)) for r in self.rows)}
            role = max(rise, key=rise.get, default=None)
            if role is not None and rise[role] > 0:
                self.said.add("team")
                first, last = (self.rows[i][f"reward/{role}"] for i in (0, -1))
                out.append(f"warning: team success has been 0 for the last {self.window} steps while reward/{role} "
                           f"rose ({first:.3g} -> {last:.3g}): {role} is learning its own reward, not the team's. "
                           f"Weigh the team's reward more (algo.alpha) or make {role}'s reward depend on the team's "
                           f"outcome; see {STALL_GUIDE}")
        return out


class Health:
    """A run's skipped updates, step by step: each policy's streak, the count over the run, the no-signal
    watch, and what they allow (`diverged`: a streak reached train.max_skipped_updates; `healthy`: the
    step's weights may be checkpointed)."""

    def __init__(self, policy_names: list[str], max_skipped: int):
        self.names, self.limit = policy_names, max_skipped
        self.streaks: dict[str, int] = {}
        self.skipped = 0  # in this process's part of the run
        self.signal, self.stalls = SignalWatch(), StallWatch()

    def record(self, metrics: dict) -> str | None:
        """Count a finished step's skipped updates; the warnings to print (no signal, a stalled team), if due."""
        self.streaks = skip_streaks(self.streaks, metrics, self.names)
        self.skipped += skipped_updates(metrics, self.names)
        said = [w for w in (self.signal.update(metrics), *self.stalls.update(metrics)) if w]
        return "\n".join(said) or None

    @property
    def diverged(self) -> bool:
        return bool(self.limit) and max(self.streaks.values(), default=0) >= self.limit

    @property
    def clean(self) -> bool:
        """No streak runs."""
        return all(v == 0 for v in self.streaks.values())

    def healthy(self, metrics: dict) -> bool:
        """No checkpoint of weights whose updates are skipped: not after a step with any skipped update (one
        applied after a skip may act on weights that already diverged), nor while a streak runs."""
        return self.clean and not skipped_updates(metrics, self.names)
