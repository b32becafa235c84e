"""The asynchronous schedule: cohorts of tasks move through their stages independently.

    pools (one worker thread each)        host workers (a bounded thread pool)
    queue -> sample K responses  ----->   step the K branches, keep the best, render
      ^     (the agent's policy,          the next stage's prompts (sandbox runs,
      |      on its devices)              grading, parsing)
      +---------- router: the next stage's request goes to its agent's pool -----+

Each policy (device pool) has one worker that takes sampling requests from its queue in
order (the requests of one agent already waiting go into one sampling call: one decode for
several cohorts, as a serving engine batches what is queued); each finished sample goes to
the host pool; each finished step routes the cohort's next request to the pool of the agent
that acts next. So while one cohort's agent-0 request
decodes on pool A, another's agent-1 request decodes on pool B and a third cohort's programs
run in the sandbox. A task's stages keep their order and their keys, so the samples are
those of the synchronous schedule (cohort.combine puts them back in stage order).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Callable, Iterator, Sequence

import jax.numpy as jnp
import numpy as np

from atgrpo_jax.rollout.cohort import Cohort, Request, Stages
from atgrpo_jax.rollout.samples import SampleOut
from atgrpo_jax.trace import Tracer
from atgrpo_jax.errors import StageTimeout  # noqa: F401  (raised here; also importable from here)


class Running:
    """The stages in flight, {(kind, cohort): (name, start time)}, shared by the worker threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._stages: dict[tuple, tuple[str, float]] = {}

    def start(self, key, name: str):
        with self._lock:
            self._stages[key] = (name, time.monotonic())

    def end(self, key):
        with self._lock:
            self._stages.pop(key, None)

    def oldest(self) -> tuple[str, float] | None:
        """(name, seconds running) of the stage running longest."""
        with self._lock:
            if not self._stages:
                return None
            name, t0 = min(self._stages.values(), key=lambda v: v[1])
        return name, time.monotonic() - t0


def check_stages(running: Running, stage_timeout_s: float) -> None:
    """StageTimeout naming the stage that has run longer than `stage_timeout_s`, if one has."""
    name, seconds = running.oldest() or ("", 0.0)
    if seconds > stage_timeout_s:
        raise StageTimeout(f"the stage '{name}' has run {seconds:.0f} s, longer than "
                           f"system.stage_timeout_s={stage_timeout_s:g}")


def run_watched(fn: Callable, running: Running, stage_timeout_s: float):
    """fn() for the synchronous schedule, which reports its stages to `running`: in a daemon thread
    watched from here, so a stage past `stage_timeout_s` (0: no limit, fn runs here) raises StageTimeout
    instead of hanging the run; the stuck thread is not waited for."""
    if stage_timeout_s <= 0:
        return fn()
    done: queue.Queue = queue.Queue()

    def target():
        try:
            done.put((True, fn()))
        except BaseException as e:  # noqa: BLE001 - re-raised here
            done.put((False, e))

    threading.Thread(target=target, name="stages", daemon=True).start()
    while True:
        try:
            ok, value = done.get(timeout=min(1.0, stage_timeout_s / 4))
        except queue.Empty:
            check_stages(running, stage_timeout_s)
            continue
        if ok:
            return value
        raise value


@dataclasses.dataclass(frozen=True)
class Sampled:
    """A pool sampled a cohort's stage: the host steps the environments next."""

    cohort: int
    request: Request
    out: SampleOut


@dataclasses.dataclass(frozen=True)
class Stepped:
    """The host stepped a cohort (or started it): its next stage, None when it is finished."""

    cohort: int
    next: Request | None


@dataclasses.dataclass(frozen=True)
class Failed:
    """A worker's error, raised by the scheduler."""

    error: BaseException


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How a rollout runs its stages: one cohort of all tasks, stage after stage (the default), or
    `cohorts` cohorts interleaved by the asynchronous dispatcher (`run_async`)."""

    cohorts: int = 1
    asynchronous: bool = False
    host_workers: int = 4
    pool_of_agent: tuple = ()  # the pool (policy) that samples for each agent
    pool_names: tuple = ()
    tracer: Tracer | None = None
    stage_timeout_s: float = 0.0  # a stage running longer raises StageTimeout (0: no limit)
    # asynchronous tree rollouts: a PoolGroups(pool, samples) goes here as soon as a pool's agents have acted
    # in every stage (its groups, in the order the whole rollout gives them), while other pools may still
    # sample: the update side reads it and can start that pool's update then
    # (tree.PoolGroups)
    finished: queue.Queue | None = None


@dataclasses.dataclass(frozen=True)
class PoolDone:
    """Every stage of the pool's agents has been stepped in every cohort: its groups are complete, while
    other pools may still sample."""

    pool: int


def run_async(stages: Stages, cohorts: Sequence[Cohort], sample_fn: Callable, schedule: Schedule) -> Iterator[PoolDone]:
    """Run every stage of every cohort (see the module docstring), yielding PoolDone(pool) once per pool as
    soon as its agents are done (iterate it to the end: the rollout is finished when it is). The first
    error in a worker re-raises here at once; a stage running longer than `stage_timeout_s` (0: no limit)
    raises StageTimeout naming it. Either way nothing waits for the stages still running: the workers
    are daemon threads, left to finish (or hang) on their own. schedule.pool_of_agent: the pool of each
    agent (all of them given)."""
    return _Dispatcher(stages, cohorts, sample_fn, schedule.pool_of_agent, schedule.host_workers,
                       schedule.tracer or Tracer(enabled=False), schedule.pool_names or None).run(schedule.stage_timeout_s)


class _Dispatcher:
    """One asynchronous rollout: a sampling worker per pool, `host_workers` environment workers, and the
    scheduler (`run`) that moves each cohort's next request to its pool's queue."""

    def __init__(self, stages, cohorts, sample_fn, pool_of_agent, host_workers, tracer, pool_names):
        self.stages, self.cohorts, self.sample_fn, self.tracer = stages, cohorts, sample_fn, tracer
        self.pool_of_agent, self.host_workers, self.pool_names = pool_of_agent, max(1, host_workers), pool_names
        self.pools = sorted(set(int(p) for p in pool_of_agent))
        self.agents_of = {p: [a for a, q in enumerate(pool_of_agent) if int(q) == p] for p in self.pools}
        self.position: dict[int, tuple[int, int] | None] = {ci: (0, 0) for ci in range(len(cohorts))}  # next stage
        self.requests = {p: queue.Queue() for p in self.pools}
        self.host_jobs: queue.Queue = queue.Queue()
        self.events: queue.Queue = queue.Queue()
        self.running = Running()

    def label(self, p: int) -> str:
        return f"pool {self.pool_names[p] if self.pool_names else p}"  # as run_sync's

    def may_still_act(self, pos, agents) -> bool:
        """Whether a cohort whose next stage is `pos` (None: finished) can still run one of `agents`."""
        return pos is not None and (pos[0] < self.stages.max_turns - 1 or any(a >= pos[1] for a in agents))

    def pool_worker(self, p: int):
        held: list = []  # requests taken from the queue but left for the next call (another agent's)
        while True:
            item = held.pop(0) if held else self.requests[p].get()
            if item is None:
                return
            batch, stop = [item], False
            while True:  # every request of the same agent already waiting joins this call: one decode
                try:
                    nxt = self.requests[p].get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                (batch if nxt[1].agent == item[1].agent else held).append(nxt)
            self.sample(p, batch)
            if stop:
                held.append(None)

    def sample(self, p: int, batch: list) -> None:
        cis, req0 = [ci for ci, _ in batch], batch[0][1]
        for ci in cis:
            self.running.start(("sample", ci), f"sample agent {req0.agent} turn {req0.turn} of cohort {ci} "
                                               f"({self.label(p)})")
        try:
            with self.tracer.span(f"sample agent {req0.agent} turn {req0.turn}", track=self.label(p),
                                  cohort=cis[0] if len(cis) == 1 else cis, prompts=sum(len(r.rows) for _, r in batch)):
                outs = sample_merged(self.sample_fn, [r for _, r in batch], self.stages.k)
            for (ci, req), out in zip(batch, outs):
                self.events.put(Sampled(ci, req, out))
        except BaseException as e:  # noqa: BLE001 - re-raised by the scheduler
            self.events.put(Failed(e))
        for ci in cis:
            self.running.end(("sample", ci))

    def host_worker(self):
        while (job := self.host_jobs.get()) is not None:
            ci, req, out = job
            name = (f"environment step of agent {req.agent} turn {req.turn} of cohort {ci}" if req is not None
                    else f"start of cohort {ci}")
            self.running.start(("host", ci), name)
            try:
                with self.tracer.span("step" if req is not None else "start", track="host", cohort=ci):
                    if req is not None:
                        self.stages.finish(self.cohorts[ci], req, out)
                    nxt = self.stages.next_request(self.cohorts[ci])
                self.events.put(Stepped(ci, nxt))
            except BaseException as e:  # noqa: BLE001
                self.events.put(Failed(e))
            self.running.end(("host", ci))

    def run(self, stage_timeout_s: float) -> Iterator[PoolDone]:
        threads = [threading.Thread(target=self.pool_worker, args=(p,), name=f"pool-{p}", daemon=True)
                   for p in self.pools]
        threads += [threading.Thread(target=self.host_worker, name=f"host-{i}", daemon=True)
                    for i in range(self.host_workers)]
        for t in threads:
            t.start()
        poll = min(1.0, stage_timeout_s / 4) if stage_timeout_s > 0 else None
        finished, waiting = False, set(self.pools)
        try:
            for ci in range(len(self.cohorts)):
                self.host_jobs.put((ci, None, None))
            left = len(self.cohorts)
            while left:
                try:
                    event = self.events.get(timeout=poll)
                except queue.Empty:
                    check_stages(self.running, stage_timeout_s)
                    continue
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, Sampled):
                    self.host_jobs.put((event.cohort, event.request, event.out))
                    continue
                nxt = event.next
                self.position[event.cohort] = None if nxt is None else (nxt.turn, nxt.agent)
                if nxt is None:
                    left -= 1
                else:
                    self.requests[int(self.pool_of_agent[nxt.agent])].put((event.cohort, nxt))
                for p in sorted(waiting):
                    if not any(self.may_still_act(pos, self.agents_of[p]) for pos in self.position.values()):
                        waiting.discard(p)
                        yield PoolDone(p)
            finished = True
        finally:
            for p in self.pools:
                self.requests[p].put(None)
            for _ in range(self.host_workers):
                self.host_jobs.put(None)
            if finished:  # all idle: they end at once. After an error, a stuck stage is not waited for
                for t in threads:
                    t.join()


def sample_merged(sample_fn: Callable, reqs: Sequence[Request], k: int) -> list[SampleOut]:
    """One sample_fn call for several requests of one agent (their prompts one after the other; each
    prompt keeps its key, so its rows are those of a call of its own), split back per request."""
    if len(reqs) == 1:
        return [sample_fn(reqs[0].agent, reqs[0].live_prompts, k, reqs[0].keys)]
    prompts = [prompt for r in reqs for prompt in r.live_prompts]
    out = sample_fn(reqs[0].agent, prompts, k, jnp.concatenate([r.keys for r in reqs]))
    parts, start = [], 0
    for r in reqs:
        rows = slice(start * k, (start + len(r.rows)) * k)
        parts.append(SampleOut(out.tokens[rows], out.lengths[rows], out.logprobs[rows], out.texts[rows]))
        start += len(r.rows)
    return parts


def split_cohorts(n: int, cohorts: int) -> list[np.ndarray]:
    """The step's n tasks in `cohorts` contiguous, near-equal parts (at least one task each)."""
    return [part for part in np.array_split(np.arange(n), max(1, min(cohorts, n))) if len(part)]
