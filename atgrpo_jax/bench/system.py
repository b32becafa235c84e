"""`python -m atgrpo_jax.bench system`: one training step, synchronous vs asynchronous schedule.

A CPU with 2 cores cannot show two device pools working at once, so the device work is a
latency model and the host work is real: each pool's sampling and update take the time a
chip would (`LatencyModel`: FLOPs at a fraction of the chip's peak, or weight reads at its
memory bandwidth for decode steps; per pool of `--chips`), spent as a sleep in the pool's
worker; the environments, prompts, parsing and the sandbox runs of model-written code are the
project's own code, run for real on canned answers (a BFS program for the tool agent of
Plan-Path, programs and tests for the code workflow). Both schedules run the same step
(per_role: one policy per agent, each on its own pool) with the same tasks, the same
`--sandbox-workers` programs at most at once, and both pools' updates dispatched together (as
the trainer does in either schedule):

- sync: each stage samples all tasks on the acting agent's pool, then steps them on the host
  (its sandbox runs `--sandbox-workers` programs at once); then both updates;
- async: `--cohorts` cohorts of tasks move through their stages independently (dispatch.py; the
  requests waiting at a pool are sampled in one call), the environment steps run on
  `--host-workers` threads while the pools decode (each step's
  sandbox runs sandbox-workers / host-workers programs at once), and a pool's update starts as
  soon as its agents' stages are done in every cohort (its groups read from the rollout's queue of finished
  groups, as train/step.py: early_updates).

Reports per schedule the best and median step time, each pool's busy fraction, the host's time
and how much of it overlapped device work, and the ratio async / sync; and, apart from the host,
the device-only bound: both schedules replayed on the measured sampling times with host work
taking no time (the ratio any host overlap can reach at best); and the bound of any schedule
that keeps the synchronous loop's samples and parameters (`schedule_bound`).
"""
from __future__ import annotations

import argparse
import dataclasses
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from atgrpo_jax.bench.common import machine_notes, print_json_last
from atgrpo_jax.bench.system_ahead import canned_out, run_pipeline
from atgrpo_jax.envs.workflow_registry import make_workflow as make
from atgrpo_jax.models.model_config import get_preset
from atgrpo_jax.models.tokenizer import encode_chat, qwen3_tokenizer
from atgrpo_jax.rollout.tree import RolloutInputs, Schedule, TreeRollout
from atgrpo_jax.trace import Tracer, overlap_seconds

TARGET_RATIO = 0.75
CHIPS = {  # bf16 peak FLOP/s and HBM bytes/s of one chip
    "v4": (275e12, 1.2e12), "v5e": (197e12, 0.82e12), "v5p": (459e12, 2.77e12), "v6e": (918e12, 1.64e12)}


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    """Seconds of a policy's device work on a pool of `chips` chips."""

    params: float
    peak_flops: float
    hbm_bytes_per_s: float
    chips: int = 2
    mfu: float = 0.4  # of the peak, for prefill and update
    bytes_per_param: int = 2  # bf16 weights

    def sample_s(self, prompt_tokens: int, rows: int, new_tokens: int) -> float:
        """Prefill the prompts, then decode `new_tokens` steps of `rows` rows (each step reads the weights)."""
        flops = self.peak_flops * self.mfu * self.chips
        step = max(self.params * self.bytes_per_param / (self.hbm_bytes_per_s * self.chips), 2 * self.params * rows / flops)
        return 2 * self.params * prompt_tokens / flops + new_tokens * step

    def update_s(self, tokens: int) -> float:
        return 6 * self.params * tokens / (self.peak_flops * self.mfu * self.chips)


BFS = '''```python
import sys
from collections import deque
rows = sys.stdin.read().split("\\n")
cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
start = next(p for p, ch in cells.items() if ch in "S*")
goal = next(p for p, ch in cells.items() if ch in "G*")
moves = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
prev, queue = {start: None}, deque([start])
while queue:
    cur = queue.popleft()
    for name, (dr, dc) in moves.items():
        nxt = (cur[0] + dr, cur[1] + dc)
        if cells.get(nxt, "#") != "#" and nxt not in prev:
            prev[nxt] = (cur, name)
            queue.append(nxt)
path, cur = [], goal
while prev.get(cur) is not None:
    cur, name = prev[cur]
    path.append(name)
print("**Actions List**:", path[::-1][:2])
```'''
CANNED = {  # workflow -> agent -> answer (the tool agent's program runs in the sandbox)
    "plan_path": ["Here is my program.\n" + BFS, 'I checked the tool agent\'s moves.\n#### ["U"]'],
    "code": ["**Code:**\n```python\nimport sys\ndata = sys.stdin.read().split()\nprint(len(data))\n```",
             "**Test Input:**\n```\n1 2 3\n```\n**Test Output:**\n```\n3\n```\n"
             "**Test Input:**\n```\n7\n```\n**Test Output:**\n```\n1\n```"],
}


def model_sample_fn(model: LatencyModel, answers, new_tokens: int):
    """A pool's sampling as its modeled device time, then the canned answer of the agent, K times."""
    def sample(agent, prompts, k, keys):
        rows = len(prompts) * k
        time.sleep(model.sample_s(sum(len(p) for p in prompts), rows, new_tokens))
        return canned_out(answers[agent], rows, new_tokens)
    return sample


def make_workflow(name: str, turns: int, sandbox_workers: int):
    """The benchmark's workflow; each environment step runs at most `sandbox_workers` programs at once."""
    if name == "plan_path":
        return make("plan_path_tool_plan", max_turns=turns, sandbox_workers=sandbox_workers)
    return make("code", max_turns=turns, max_workers=sandbox_workers, train_sets=("apps_train",))


def pool_tokens(samples, a: int) -> int:
    """Tokens of agent a's samples: what its pool's update runs."""
    return int((samples.sample_prompt_len() + samples.response_len)[samples.mask & (samples.sample_agent == a)].sum())


def run_step(args, model: LatencyModel, asynchronous: bool, encode) -> dict:
    """One step: the rollout (real environments, modeled sampling), then both pools' modeled updates,
    dispatched together; async: each as soon as its pool's groups are complete."""
    per_step = max(1, args.sandbox_workers // args.host_workers) if asynchronous else args.sandbox_workers
    wf = make_workflow(args.workflow, args.turns, per_step)
    tracer = Tracer()
    updates = ThreadPoolExecutor(2, thread_name_prefix="update")
    started, tokens = {}, [0, 0]

    def update(a: int, samples):
        tokens[a] = pool_tokens(samples, a)
        with tracer.span("update", track=f"pool {'AB'[a]}"):
            time.sleep(model.update_s(tokens[a]))

    finished: queue.Queue | None = queue.Queue() if asynchronous else None

    def start_early():  # the update side: each pool's update as soon as its groups are complete
        while (groups := finished.get()) is not None:
            started[groups.pool] = updates.submit(update, groups.pool, groups.samples)

    schedule = Schedule(cohorts=args.cohorts if asynchronous else 1, asynchronous=asynchronous,
                        host_workers=args.host_workers, pool_of_agent=(0, 1), pool_names=("A", "B"), tracer=tracer,
                        finished=finished)
    reader = threading.Thread(target=start_early, name="early-updates", daemon=True) if asynchronous else None
    if reader is not None:
        reader.start()
    t0 = time.perf_counter()
    try:
        inputs = RolloutInputs(wf, model_sample_fn(model, CANNED[args.workflow], args.new_tokens), encode,
                               np.arange(args.tasks), "train", max_turns=args.turns, alpha=1.0,
                               key=jax.random.key(0), schedule=schedule)
        samples, _ = TreeRollout(args.k).begin(inputs).run()
    finally:
        if reader is not None:
            finished.put(None)
            reader.join()
    rollout_s = time.perf_counter() - t0
    for a in (0, 1):
        if a not in started:
            started[a] = updates.submit(update, a, samples)
    for future in started.values():
        future.result()
    updates.shutdown()
    total = time.perf_counter() - t0
    pools = tracer.spans("pool")
    host = [s for s in tracer.spans("host")]
    host_s = sum(e - s for s, e in host)
    return {"total": total, "rollout": rollout_s, "update": total - rollout_s,
            "pool_busy_A": tracer.busy_seconds("pool A") / total, "pool_busy_B": tracer.busy_seconds("pool B") / total,
            "host_s": host_s, "host_overlapped": overlap_seconds(host, pools) / max(host_s, 1e-9),
            "update_tokens": tokens, "stages": stage_times(tracer)}


def stage_times(tracer: Tracer) -> list[tuple[tuple[int, ...], str, float]]:
    """(cohorts, pool, seconds) of every sampling call (one call may serve several cohorts' stages),
    in the order they started."""
    cohorts = lambda c: tuple(c) if isinstance(c, (list, tuple)) else (c,)  # noqa: E731
    return [(cohorts(args.get("cohort", 0)), track[-1], seconds)
            for track, _, _, seconds, args in tracer.records("sample")]


def device_only(stages: list[tuple[tuple[int, ...], str, float]], update_s: dict[str, float], early: bool) -> float:
    """Seconds of a step whose host work takes no time: each cohort's stages in order, each on its
    pool, a pool serving calls first come first served (a call serving several cohorts starts when
    all of them are ready); then each pool's update, as soon as its own stages are all done
    (`early`) or after the whole rollout."""
    free = {p: 0.0 for p in update_s}  # when each pool is next idle
    ready: dict[int, float] = {}  # when each cohort's next stage may start
    last = {p: 0.0 for p in update_s}
    for cohorts, pool, seconds in stages:  # in the order the measured run issued them
        start = max([free[pool]] + [ready.get(c, 0.0) for c in cohorts])
        free[pool] = last[pool] = start + seconds
        ready.update({c: start + seconds for c in cohorts})
    rollout = max(ready.values(), default=0.0)
    return max((last[p] if early else rollout) + update_s[p] for p in update_s)


def schedule_bound(stages: list[tuple[tuple[int, ...], str, float]], update_s: dict[str, float]) -> float:
    """The shortest step any schedule can reach on these sampling calls when its samples and
    parameters must equal the synchronous loop's: a pool's update waits for all of its own
    sampling, and the next step's sampling waits for the update (it needs the new parameters),
    so each pool needs at least its sampling plus its update, one after the other."""
    return max(sum(sec for _, p, sec in stages if p == pool) + update_s[pool] for pool in update_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench system", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflow", choices=sorted(CANNED), default="plan_path")
    ap.add_argument("--preset", default="qwen3-1.7b", help="the policies' size (models.config.PRESETS)")
    ap.add_argument("--chip", choices=sorted(CHIPS), default="v5p")
    ap.add_argument("--chips", type=int, default=2, help="chips per pool")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens per response")
    ap.add_argument("--cohorts", type=int, default=4)
    ap.add_argument("--host-workers", type=int, default=4)
    ap.add_argument("--sandbox-workers", type=int, default=8, help="programs run at once, on both sides")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--staleness", type=int, default=0,
                    help="the async side's system.staleness: N >= 1 pipelines the steps as the trainer does "
                         "(system_ahead.py): the next N steps' rollouts, in parts, during each update")
    ap.add_argument("--mini-batches", type=int, default=4, help="an update's mini-batches (staleness >= 1: the "
                    "rollout's sampling runs between them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tokenizer = qwen3_tokenizer()
    encode = lambda messages, agent: encode_chat(tokenizer, messages)  # noqa: E731
    model = LatencyModel(get_preset(args.preset).num_params(), *CHIPS[args.chip], chips=args.chips)
    if args.staleness < 0 or args.mini_batches < 1:
        ap.error("--staleness must be >= 0 and --mini-batches >= 1")
    sides = {}
    for name, asynchronous in (("sync", False), ("async", True)):
        if asynchronous and args.staleness:
            sides[name] = pipelined_side(args, model, encode)
            continue
        run_step(args, model, asynchronous, encode)  # warm-up: compiles, sandbox start-up
        steps = [run_step(args, model, asynchronous, encode) for _ in range(args.steps)]
        best = min(steps, key=lambda x: x["total"])
        update_s = {p: model.update_s(t) for p, t in zip("AB", best["update_tokens"])}
        sides[name] = {"steps": steps, "best": best["total"], "median": float(np.median([s["total"] for s in steps])),
                       "device_only": device_only(best["stages"], update_s, early=asynchronous),
                       "bound": schedule_bound(best["stages"], update_s)}
    ratio = sides["async"]["best"] / sides["sync"]["best"]
    median_ratio = sides["async"]["median"] / sides["sync"]["median"]
    print(f"{args.workflow}, per_role on 2 pools of {args.chips} x {args.chip}, {args.preset}: B={args.tasks} "
          f"K={args.k} T={args.turns}, {args.new_tokens} tokens per response; async at staleness {args.staleness}")
    for name, side in sides.items():
        s = min(side["steps"], key=lambda x: x["total"])
        rollout = f"rollout {s['rollout']:.2f} s, update {s['update']:.2f} s; " if "rollout" in s else ""
        overlapped = f", {s['host_overlapped']:.0%} of it during device work" if "host_overlapped" in s else ""
        print(f"  {name:5s} step {side['best']:.2f} s best ({side['median']:.2f} median): {rollout}pools busy "
              f"{s['pool_busy_A']:.0%} / {s['pool_busy_B']:.0%}; host {s['host_s']:.2f} s{overlapped}")
    print(f"  async / sync = {ratio:.2f} best, {median_ratio:.2f} median (target <= {TARGET_RATIO} at staleness 2)")
    device_ratio = bound = None
    if not args.staleness:
        device_ratio = sides["async"]["device_only"] / sides["sync"]["device_only"]
        print(f"  device work alone (host instant): {sides['async']['device_only']:.2f} / "
              f"{sides['sync']['device_only']:.2f} s = {device_ratio:.2f}")
        bound = min(side["bound"] for side in sides.values()) / sides["sync"]["device_only"]
        print(f"  no schedule with the synchronous loop's samples and parameters beats {bound:.2f} of the "
              "synchronous device-only step (each pool: its own sampling, then its update)")
    print_json_last({"benchmark": "system", "config": vars(args), "ratio": ratio, "median_ratio": median_ratio,
                     "device_only_ratio": device_ratio, "bound_ratio": bound,
                     "sides": sides,
                     "latency_model": dataclasses.asdict(model), "machine": machine_notes()}, args.json)
    return 0


def pipelined_side(args, model: LatencyModel, encode) -> dict:
    """The async side at system.staleness >= 1: the trainer's pipeline of steps (system_ahead.py)."""
    # the rollouts in flight (N at most) step at once, each on host-workers threads: the same
    # sandbox-workers programs at most at once as the other side
    per_step = max(1, args.sandbox_workers // (args.host_workers * args.staleness))
    workflow = make_workflow(args.workflow, args.turns, per_step)
    steps = run_pipeline(args, model, encode, workflow, CANNED[args.workflow], pool_tokens)
    return {"steps": steps, "best": min(s["total"] for s in steps),
            "median": float(np.median([s["total"] for s in steps]))}


if __name__ == "__main__":
    raise SystemExit(main())
