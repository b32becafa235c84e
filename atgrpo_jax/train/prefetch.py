"""system.staleness = N >= 1: the rollouts of the next N steps are made while a step's update runs,
with the weights from before that update. Everything about it lives here: which weights sample which
part of which rollout, the rollouts in flight, what a checkpoint keeps so that a resume makes them again.

Rollout r's turns are cut into N parts (part j: turns [j*T//N, (j+1)*T//N)); part j runs during the
update of step r - N + j (or the first update after that, if the run began or resumed later), with the
weights from before that update. So rollout r's first turns sample with weights up to N updates
behind those its own update starts from, its last turns with weights one update behind: a partial
rollout, whose episodes continue under newer weights, each stage recording the optimizer step of the
weights that sampled it (Samples.version). Each update works on as much rollout as a synchronous
step's; its importance ratio is taken against the sampler's log-probs (the behaviour policy), or in
the decoupled form with loss.is_correction (train/step.py). N = 1 is a whole rollout made during the
previous step's update.

In a step: `take(s)` (the rollout finished ahead for s, if any), `start(s)` once the step is sure to
update (keep the weights as they are, before the update replaces them), then, once the update is
dispatched, `make(tracer)`.
"""
from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import jax

from atgrpo_jax.trace import Tracer
from atgrpo_jax.train.policies import Snapshot
from atgrpo_jax.train.step import Rollout, begin_step_rollout, end_rollout, sampling_versions


def part_ends(turns: int, staleness: int) -> list[int]:
    """Part j of a rollout: the turns before ends[j] not run yet."""
    return [(j + 1) * turns // staleness for j in range(staleness)]


def due_parts(step: int, staleness: int, last: int, done: dict[int, int]) -> list[tuple[int, int]]:
    """(rollout, part) made during step `step`'s update: every part j of rollouts step+1..step+N (at
    most `last`) with r - N + j <= step, not done yet (done[r]: parts done), in order."""
    out = []
    for r in range(step + 1, min(step + staleness, last) + 1):
        out += [(r, j) for j in range(done.get(r, 0), staleness) if r - staleness + j <= step]
    return out


class Prefetch:
    def __init__(self, run, last_step: int, staleness: int = 1):
        self.run, self.last_step, self.n = run, last_step, staleness
        self.ends = part_ends(run.config.rollout.max_turns, staleness)
        # {step s: {policy name: Snapshot}}: the weights from before step s's update, while a rollout in
        # flight has a part made with them (a checkpoint keeps them)
        self.held: dict[int, dict[str, Snapshot]] = {}
        # {rollout step r: (its InFlight, [the step during whose update each part done so far ran], seconds)}
        self.flight: dict[int, list] = {}
        self._step: int | None = None  # the step whose update the next `make` runs beside

    def covers(self, step: int) -> bool:
        """Whether step `step`'s rollout is made ahead (not for the first step, nor after the last)."""
        return step <= self.last_step

    def take(self, step: int) -> Rollout | None:
        """The rollout finished ahead for `step` (None: none was, the step samples with its own weights).
        It stays in flight (a checkpoint of the step before keeps it) until `start(step)`."""
        entry = self.flight.get(step)
        if entry is None or len(entry[1]) < self.n:
            return None
        inflight, _, seconds = entry
        t0 = time.perf_counter()
        samples, episodes = end_rollout(self.run, inflight)
        return Rollout(step, samples, episodes, seconds + time.perf_counter() - t0, stale=True)

    def start(self, step: int) -> None:
        """Step `step` goes ahead with its update: its own rollout leaves the flight, and every policy's
        current weights are kept, those from before the update, which the parts made during it sample
        with (past the last step nothing is made: nothing is kept)."""
        self.flight.pop(step, None)
        self._step = step if self.covers(step + 1) else None
        self._prune()
        if self._step is not None:
            self.held[step] = {p.name: p.snapshot() for p in self.run.policies}

    def make(self, tracer: Tracer | None = None) -> None:
        """Run every part due by now of the rollouts of the next N steps, with the kept weights (while
        the update runs on the devices): each rollout's parts in order, the rollouts at once (a thread
        each, with one process), so one's environments are stepped while another samples."""
        s = self._step
        if s is None:
            return
        due: dict[int, int] = {}  # rollout: how many parts
        for r, _ in due_parts(s, self.n, self.last_step, {r: len(e[1]) for r, e in self.flight.items()}):
            due[r] = due.get(r, 0) + 1
        # (several processes: one after another, so that every process reaches any collective in one order)
        at_once = len(due) if jax.process_count() == 1 else 1
        with self._sampling(s), ThreadPoolExecutor(max(1, at_once), thread_name_prefix="ahead") as threads:
            for done in [threads.submit(self._parts, r, count, s, tracer) for r, count in due.items()]:
                done.result()
        self._prune()

    @contextlib.contextmanager
    def _sampling(self, during: int):
        """Inside: every policy samples with the weights kept from before step `during`'s update."""
        with contextlib.ExitStack() as stack:
            for p in self.run.policies:
                stack.enter_context(p.sampling_with(self.held[during][p.name]))
            yield

    def _parts(self, r: int, count: int, during: int, tracer: Tracer | None) -> None:
        """Rollout r's next `count` parts, with the weights kept from before step `during`'s update (set
        by the caller: `_sampling`)."""
        t0 = time.perf_counter()
        if r not in self.flight:
            self.flight[r] = [begin_step_rollout(self.run, r, tracer), [], 0.0]
        entry = self.flight[r]
        for _ in range(count):
            j = len(entry[1])
            if j == 0 or self.ends[j] > self.ends[j - 1]:  # (more parts than turns: some are empty)
                entry[0].advance(self.ends[j], sampling_versions(self.run, self.held[during]))
            entry[1].append(during)
        entry[2] += time.perf_counter() - t0

    def _prune(self) -> None:
        """Let go of kept weights no rollout in flight was made with."""
        used = {s for _, parts, _ in self.flight.values() for s in parts} | ({self._step} - {None})
        for s in set(self.held) - used:
            del self.held[s]

    def checkpoint_extra(self) -> tuple[dict | None, dict]:
        """(params, meta) a checkpoint keeps so that a resume makes the rollouts in flight again: the kept
        weights, their optimizer steps and which part ran with which; (None, {}) when nothing is ahead."""
        if not self.flight:
            return None, {}
        params = {f"{name}@{s}": snap.params for s, snaps in self.held.items() for name, snap in snaps.items()}
        steps = {f"{name}@{s}": snap.step for s, snaps in self.held.items() for name, snap in snaps.items()}
        parts = {str(r): list(entry[1]) for r, entry in self.flight.items()}
        return params, {"ahead": {"parts": parts, "steps": steps, "staleness": self.n}}

    def same_staleness(self, ahead: dict, start: int) -> bool:
        """Whether the rollouts in flight a checkpoint of `start` keeps (`ahead`) were cut into this run's
        parts (a resume may change system.staleness: then they are not made again)."""
        if "staleness" in ahead:
            return int(ahead["staleness"]) == self.n
        return all(len(parts) <= self.n and int(r) <= start + self.n for r, parts in ahead["parts"].items())

    def restore(self, ckpt, start: int, meta: dict) -> bool:
        """On resume at `start`: the rollouts in flight then were made (in part) with weights the
        checkpoint keeps, so the same parts are made again and the resumed run equals an uninterrupted
        one. Without them (saved at a run's last step, or by a run of another staleness) step start + 1
        samples on-policy. Returns whether they were made again."""
        if not self.covers(start + 1):
            return False
        ahead = meta.get("ahead")
        if not ahead or not self.same_staleness(ahead, start):
            return False
        by_name = {p.name: p for p in self.run.policies}
        template = {key: by_name[key.split("@")[0]].state.params for key in ahead["steps"]}  # "name@step"
        saved = ckpt.restore_extra(start, template)
        if saved is None or set(saved) != set(template):
            return False
        for key, params in saved.items():
            name, s = key.split("@")
            self.held.setdefault(int(s), {})[name] = Snapshot(params, int(ahead["steps"][key]))
        self._step = None
        for r, parts in sorted((int(r), parts) for r, parts in ahead["parts"].items()):
            for during in parts:
                with self._sampling(during):
                    self._parts(r, 1, during, Tracer())
        return True
