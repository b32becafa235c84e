"""Run one command as N JAX processes on this machine, each with M CPU devices.

    python -m atgrpo_jax.launch --processes=2 --devices=4 -- \\
        python -m atgrpo_jax.train --config=configs/demo.py --workdir=runs/mp

Each process gets ATGRPO_COORDINATOR / ATGRPO_NUM_PROCESSES / ATGRPO_PROCESS_ID
(read by `atgrpo_jax.distributed.init_distributed`), JAX_PLATFORMS=cpu and
XLA_FLAGS forcing M host devices; they talk through gloo. This is how the
multi-host code paths run without a pod. Output lines are prefixed with the
process id; if one process fails the others are stopped, and the exit code is
the first failure's.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading

from atgrpo_jax.distributed import CPU_COLLECTIVES_FLAG, ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

DEVICE_FLAG = "--xla_force_host_platform_device_count"


STOPPED_BY_SIGNAL = (143, 130)  # a trainer stopped by SIGTERM / SIGINT after its collective save


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def process_env(base: dict, process_id: int, processes: int, devices: int, port: int) -> dict:
    """The environment of process `process_id` (a copy of `base`)."""
    env = dict(base)
    flags = re.sub(rf"{DEVICE_FLAG}=\S+", "", env.get("XLA_FLAGS", "")).strip()
    if CPU_COLLECTIVES_FLAG not in flags:
        flags = f"{flags} {CPU_COLLECTIVES_FLAG}"
    env["XLA_FLAGS"] = f"{flags} {DEVICE_FLAG}={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env[ENV_COORDINATOR] = f"localhost:{port}"
    env[ENV_NUM_PROCESSES] = str(processes)
    env[ENV_PROCESS_ID] = str(process_id)
    return env


def _pump(proc: subprocess.Popen, prefix: str, out) -> None:
    for line in proc.stdout:
        out.write(f"{prefix}{line}")
        out.flush()


def launch(command: list[str], processes: int, devices: int, port: int | None = None, out=None) -> int:
    """Run `command` as `processes` processes; returns the exit code (0 if all succeeded)."""
    if processes < 1 or devices < 1:
        raise ValueError(f"need processes >= 1 and devices >= 1, got {processes} and {devices}")
    if not command:
        raise ValueError("no command to launch (put it after --)")
    out = out or sys.stdout
    port = port or free_port()
    procs = [subprocess.Popen(command, env=process_env(os.environ, i, processes, devices, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(processes)]
    pumps = [threading.Thread(target=_pump, args=(p, f"[p{i}] ", out), daemon=True) for i, p in enumerate(procs)]
    for t in pumps:
        t.start()
    code = 0
    pending = set(range(processes))
    while pending:
        for i in list(pending):
            try:
                rc = procs[i].wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            pending.discard(i)
            if rc and not code:
                code = rc
                if rc in STOPPED_BY_SIGNAL:  # the others agreed to stop at the same step: let them save
                    continue
                for j in pending:  # the others would wait forever for the lost peer
                    procs[j].kill()
    for t in pumps:
        t.join()
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=4, help="CPU devices per process")
    parser.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every process runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return launch(command, args.processes, args.devices, args.port or None)


if __name__ == "__main__":
    sys.exit(main())
