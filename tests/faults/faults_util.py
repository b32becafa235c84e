"""Helpers of the fault-injection tests: the trainer as a user runs it (a subprocess), what it printed,
what it left on disk."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = os.path.join(ROOT, "tests", "train", "tiny_config.py")
NOISE = ("PyTorch was not found",)  # transformers' import-time notice, not ours


# the reference run's settings (conftest.finished_run): a checkpoint after every step, evaluations at 0, 2, 4
FINISHED = ("--config.train.checkpoint_every=1", "--config.train.eval_every=2", "--config.train.eval_tasks=2")


def train_args(workdir, *extra, steps=4):
    return [sys.executable, "-m", "atgrpo_jax.train", f"--config={CONFIG}", f"--workdir={workdir}",
            f"--config.train.steps={steps}", "--config.train.eval_every=0", "--config.train.keep_last=0",
            *extra]


def run(args, timeout=300, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kwargs)


def stderr_lines(proc) -> list[str]:
    """What the user reads on stderr, without import-time notices of other packages."""
    return [line for line in proc.stderr.splitlines() if line.strip() and not any(n in line for n in NOISE)]


def assert_no_traceback(proc):
    for text in (proc.stdout, proc.stderr):
        assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]


def metrics_rows(workdir) -> list[dict]:
    from atgrpo_jax.train.metrics import is_wall_clock
    from atgrpo_jax.train.metrics_files import read_metrics

    return [{k: v for k, v in r.items() if not is_wall_clock(k)} for r in read_metrics(str(workdir))]


def snapshot(path) -> dict:
    """Every file and folder under `path` with its size and modification time (the workdir's lock file
    aside: every run takes it, even one that then changes nothing)."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + [f for f in files if f != "train.lock"]:
            p = os.path.join(root, name)
            st = os.lstat(p)
            out[os.path.relpath(p, path)] = (st.st_size, st.st_mtime_ns)
    return out


def in_tmpfs(script: str, mount: str, size: str, timeout=300):
    """Run a shell script with a fresh tmpfs of `size` at `mount`, in user and mount namespaces of
    its own (works with or without root; the tmpfs disappears with the script)."""
    os.makedirs(mount, exist_ok=True)
    body = f"mount -t tmpfs -o size={size} tmpfs {mount} || exit 99\n{script}"
    return run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", body], timeout=timeout)



def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst
