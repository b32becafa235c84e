"""The system benchmark's steps at system.staleness = N >= 1 (`bench system --staleness=N`), run as the
trainer runs them (train/prefetch.py): during step i's update, the due parts of the rollouts of steps
i+1..i+N (rollout r's turns in N parts; part j runs during the update of step r - N + j), each part on
the asynchronous schedule (cohorts, host workers), the rollouts at once (a thread each). Device work is the latency model's, on `Devices`:
one queue per pool, run in order, as a chip runs what it is given; an update is given one mini-batch
at a time, so the rollout's sampling calls run between them while the host steps the environments.

The measured time of a step is one iteration: its update and the parts made beside it, once the
pipeline is full (the first N iterations fill it and are not counted).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import numpy as np

from atgrpo_jax.rollout.samples import SampleOut
from atgrpo_jax.rollout.tree import RolloutInputs, Schedule, TreeRollout
from atgrpo_jax.trace import Tracer
from atgrpo_jax.train.prefetch import due_parts, part_ends  # noqa: F401  (the trainer's cut, one place)

POOLS = "AB"


class Devices:
    """Each pool's device work as one queue, run in order (a chip's stream): `run(pool, seconds)` gives
    it work and returns its future; `update` gives an update one mini-batch at a time."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer
        self.queues = {p: ThreadPoolExecutor(1, thread_name_prefix=f"device-{p}") for p in POOLS}
        self.drivers = ThreadPoolExecutor(len(POOLS), thread_name_prefix="update")

    def run(self, pool: str, seconds: float, name: str) -> Future:
        def work():
            with self.tracer.span(name, track=f"device {pool}"):
                time.sleep(seconds)
        return self.queues[pool].submit(work)

    def update(self, pool: str, seconds: float, mini_batches: int) -> Future:
        """The update's mini-batches, each given to the pool once the one before has run."""
        def drive():
            for _ in range(mini_batches):
                self.run(pool, seconds / mini_batches, "update").result()
        return self.drivers.submit(drive)

    def close(self):
        self.drivers.shutdown()
        for q in self.queues.values():
            q.shutdown()


def canned_out(answer: str, rows: int, new_tokens: int) -> SampleOut:
    """`rows` responses of `new_tokens` tokens, each the canned `answer`."""
    ids = np.ones((rows, new_tokens), np.int32)
    return SampleOut.from_rows(ids, np.full(rows, new_tokens), np.zeros((rows, new_tokens)), [answer] * rows,
                               new_tokens)


def device_sample_fn(model, answers, new_tokens: int, devices: Devices):
    """A pool's sampling as its modeled device time on its queue, then the agent's canned answer, K times."""
    def sample(agent, prompts, k, keys):
        rows = len(prompts) * k
        devices.run(POOLS[agent], model.sample_s(sum(len(p) for p in prompts), rows, new_tokens), "sample").result()
        return canned_out(answers[agent], rows, new_tokens)
    return sample


def run_pipeline(args, model, encode, workflow, answers, pool_tokens) -> list[dict]:
    """args.steps measured iterations (after N that fill the pipeline) at staleness args.staleness; one
    dict per measured step: its time, each pool's busy fraction, the host's time."""
    n, turns = args.staleness, args.turns
    iterations = n + args.steps
    tracer = Tracer()
    devices = Devices(tracer)
    sample = device_sample_fn(model, answers, args.new_tokens, devices)
    schedule = Schedule(cohorts=args.cohorts, asynchronous=True, host_workers=args.host_workers,
                        pool_of_agent=(0, 1), pool_names=tuple(POOLS), tracer=tracer)
    ends = part_ends(turns, n)

    def begin(r: int):
        inputs = RolloutInputs(workflow, sample, encode, np.arange(args.tasks), "train", max_turns=turns, alpha=1.0,
                               key=jax.random.fold_in(jax.random.key(0), r), schedule=schedule)
        return TreeRollout(args.k).begin(inputs)

    def make_parts(r: int, parts: list[int]):  # a rollout's due parts, in order
        if r not in flight:
            flight[r] = begin(r)
        for j in parts:
            if j == 0 or ends[j] > ends[j - 1]:
                flight[r].advance(ends[j])

    first = begin(1)
    first.advance()  # step 1 samples with its own weights, before the pipeline starts
    flight, done, steps = {1: first}, {1: n}, []
    try:
        for i in range(1, iterations + 1):
            t0 = time.perf_counter()
            samples, _ = flight.pop(i).result()
            updates = [devices.update(p, model.update_s(pool_tokens(samples, a)), args.mini_batches)
                       for a, p in enumerate(POOLS)]
            due: dict[int, list[int]] = {}
            for r, j in due_parts(i, n, iterations + n, done):  # (a measured step is never the last)
                due.setdefault(r, []).append(j)
                done[r] = j + 1
            with ThreadPoolExecutor(max(1, len(due)), thread_name_prefix="ahead") as threads:  # as the trainer
                for part in [threads.submit(make_parts, r, parts) for r, parts in due.items()]:
                    part.result()
            for u in updates:
                u.result()
            t1 = time.perf_counter()
            if i > n:
                steps.append(step_report(tracer, t0, t1))
    finally:
        devices.close()
    return steps


def step_report(tracer: Tracer, t0: float, t1: float) -> dict:
    """One iteration's time, each pool's busy fraction in it, and the host workers' seconds in it."""
    def busy(track):
        return sum(max(0.0, min(e, t1 - tracer.t0) - max(s, t0 - tracer.t0)) for s, e in tracer.spans(track))
    total = t1 - t0
    return {"total": total, **{f"pool_busy_{p}": busy(f"device {p}") / total for p in POOLS},
            "host_s": busy("host")}
