"""Grid-game stepping: vmapped + jitted JAX vs plain-Python per-object steppers.

`python -m atgrpo_jax.bench envs [--games plan_path,sokoban,sudoku]
[--batches 1,64,4096] [--moves 32] [--json]`

For each game and batch size B, the same random levels and the same random
moves are stepped by
- JAX, one move per call: `jit(vmap(step))` over B states, called once per move
  (the state stays on the device);
- JAX, a whole move list per call: the same with a `lax.scan` over the moves;
- Python: the reference stepper (`envs.reference_steppers`), each of the B
  objects `copy.deepcopy`-ed and then stepped, per move -- the way the
  reference system steps deep-copied state objects for its branches.
Throughput is env-moves per second, excluding compilation; the Python side runs
as many moves as fit in about `--python-seconds`. Per-move rewards of both sides
are compared on the moves both ran. One run; numbers depend on the machine.
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.bench.common import machine_notes
from atgrpo_jax.envs import plan_path, reference_steppers, sokoban, sudoku

GAMES = {
    "plan_path": (plan_path, reference_steppers.PlanPathRef, 5),
    "sokoban": (sokoban, reference_steppers.SokobanRef, 5),
    "sudoku": (sudoku, reference_steppers.SudokuRef, 64),
}
TARGET_RATIO = 200.0


def _time_jax(fn, states, actions, repeats: int = 3) -> tuple[float, np.ndarray]:
    """Best wall time of `fn(states, actions)` over repeats, and its per-move rewards."""
    out = jax.block_until_ready(fn(states, actions))  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(states, actions))
        best = min(best, time.perf_counter() - start)
    return best, np.asarray(out)


def _bench_one(name: str, batch: int, moves: int, python_seconds: float, seed: int) -> dict:
    module, ref_cls, n_codes = GAMES[name]
    params = module.Params()
    keys = jax.random.split(jax.random.PRNGKey(seed), batch)
    states = jax.block_until_ready(jax.jit(jax.vmap(lambda k: module.reset(k, params)))(keys))
    rng = np.random.default_rng(seed)
    actions = jnp.asarray(rng.integers(0, n_codes, size=(moves, batch)), jnp.int32)

    one_move = jax.jit(jax.vmap(lambda s, a: module.step(s, a, params)[:2]))

    def per_call(s, acts):  # one dispatch per move, state kept on the device
        rewards = []
        for m in range(moves):
            s, r = one_move(s, acts[m])
            rewards.append(r)
        return jnp.stack(rewards)

    scanned = jax.jit(jax.vmap(lambda s, a: module.step(s, a, params)[3]["rewards"], in_axes=(0, 1), out_axes=1))
    jax_s, jax_rewards = _time_jax(per_call, states, actions)
    scan_s, scan_rewards = _time_jax(scanned, states, actions)

    host = jax.device_get(states)
    objects = [ref_cls(jax.tree.map(lambda x: x[b], host), params) for b in range(batch)]
    acts = np.asarray(actions).tolist()
    py_rewards, done_moves, start = [], 0, time.perf_counter()
    while done_moves < moves and (done_moves == 0 or time.perf_counter() - start < python_seconds):
        row = []
        for b in range(batch):
            branch = copy.deepcopy(objects[b])  # a branch copy, as the reference system makes
            row.append(branch.step(acts[done_moves][b]))
            objects[b] = branch
        py_rewards.append(row)
        done_moves += 1
    py_s = time.perf_counter() - start
    agree = bool(np.allclose(np.array(py_rewards), jax_rewards[:done_moves], rtol=1e-5, atol=1e-5)
                 and np.allclose(scan_rewards, jax_rewards, rtol=1e-5, atol=1e-5))
    py_rate, jax_rate, scan_rate = batch * done_moves / py_s, batch * moves / jax_s, batch * moves / scan_s
    return {"game": name, "batch": batch, "python_steps_per_s": py_rate, "jax_steps_per_s": jax_rate,
            "jax_scan_steps_per_s": scan_rate, "ratio": jax_rate / py_rate, "ratio_scan": scan_rate / py_rate,
            "python_moves_timed": done_moves, "rewards_agree": agree}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench envs", description=__doc__.split("\n")[0])
    parser.add_argument("--games", default="plan_path,sokoban,sudoku")
    parser.add_argument("--batches", default="1,64,4096")
    parser.add_argument("--moves", type=int, default=32, help="moves per environment")
    parser.add_argument("--python-seconds", type=float, default=2.0, help="time budget of each Python run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print a JSON line last")
    args = parser.parse_args(argv)
    games = [g for g in args.games.split(",") if g]
    unknown = sorted(set(games) - set(GAMES))
    if unknown:
        parser.error(f"unknown games {unknown}; choose from {sorted(GAMES)}")
    batches = [int(b) for b in args.batches.split(",") if b]

    notes = machine_notes()
    print(f"machine: {notes}")
    rows = []
    header = (f"{'game':<10} {'batch':>6} {'python/s':>11} {'jax/s':>12} {'jax scan/s':>12} "
              f"{'ratio':>8} {'ratio scan':>10}  agree")
    print(header)
    print("-" * len(header))
    for name in games:
        for batch in batches:
            r = _bench_one(name, batch, args.moves, args.python_seconds, args.seed)
            rows.append(r)
            print(f"{name:<10} {batch:>6} {r['python_steps_per_s']:>11,.0f} {r['jax_steps_per_s']:>12,.0f} "
                  f"{r['jax_scan_steps_per_s']:>12,.0f} {r['ratio']:>7.1f}x {r['ratio_scan']:>9.1f}x  "
                  f"{r['rewards_agree']}", flush=True)
    big = [r for r in rows if r["batch"] == max(batches)]
    print(f"steps = env moves per second; Python = deepcopy + step per object; target >= {TARGET_RATIO:.0f}x "
          f"at batch {max(batches)} (one move per call): "
          + ", ".join(f"{r['game']} {r['ratio']:.0f}x" for r in big))
    if args.json:
        print(json.dumps({"bench": "envs", "devices": str(jax.devices()[0].platform), "machine": notes,
                          "moves": args.moves,
                          "target_ratio": TARGET_RATIO, "results": rows}))
    return 0 if all(r["rewards_agree"] for r in rows) else 1
