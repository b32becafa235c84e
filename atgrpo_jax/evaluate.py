"""`python -m atgrpo_jax.evaluate --config=configs/X.py --checkpoint=WORKDIR[/checkpoints/STEP]`

Restores the policies of a checkpoint (the run's latest, or a given step),
runs independent episodes on held-out tasks and prints and writes
`eval.json` (avg@k success: grid success, math accuracy, code pass@1), plus
`learning_curve.png` from the run's metrics.jsonl. WORKDIR and --out may be
object-store URLs (`gs://bucket/run`; needs `pip install gcsfs google-cloud-storage`).
"""
from __future__ import annotations

import json

from absl import app, flags, logging
from ml_collections import config_flags

from atgrpo_jax.train import workdir as wd
from atgrpo_jax.train.metrics import METRICS_FILE

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file", lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run's workdir, or WORKDIR/checkpoints/STEP")
_TASKS = flags.DEFINE_integer("tasks", 0, "held-out tasks (default: config.train.eval_tasks)")
_K = flags.DEFINE_integer("k", 0, "episodes per task for avg@k (default: config.train.eval_k)")
_TEMPERATURE = flags.DEFINE_float("temperature", -1.0, "sampling temperature (default: rollout.eval_temperature)")
_OUT = flags.DEFINE_string("out", "", "directory for eval.json and the PNG (default: the run's workdir)")
flags.mark_flags_as_required(["config", "checkpoint"])


def write_eval_outputs(result: dict, workdir: str, out: str, *, label: str, title: str) -> list[str]:
    """Write `out/eval.json` and, when the run has metrics, `out/learning_curve.png`; returns the paths."""
    from atgrpo_jax.train.plots import plot_learning_curves

    wd.makedirs(out)
    written = [wd.join(out, "eval.json")]
    wd.write_text(written[0], json.dumps(result, indent=2))
    if wd.exists(wd.join(workdir, METRICS_FILE)):
        written.append(plot_learning_curves({label: workdir}, wd.join(out, "learning_curve.png"),
                                            metric="eval_success", title=title))
    return written


def run_evaluation(config, checkpoint: str, tasks: int = 0, k: int = 0, temperature: float | None = None,
                   out: str = "") -> dict:
    from atgrpo_jax.train.checkpoint import Checkpointer
    from atgrpo_jax.train.step import evaluate, policy_states, set_policy_states
    from atgrpo_jax.train.setup import build_run

    workdir, ckpt_dir, step = wd.locate_checkpoint(checkpoint)
    out = out or workdir
    wd.require_support(ckpt_dir, checkpoints=True)  # missing gs:// packages: fail before compiling
    wd.require_support(out)
    run = build_run(config)
    ckpt = Checkpointer(ckpt_dir, keep_last=0, read_only=True)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint in {ckpt_dir}")
    states, _ = ckpt.restore(step, target=policy_states(run))
    set_policy_states(run, states)
    tasks, k = tasks or config.train.eval_tasks, k or config.train.eval_k
    result = evaluate(run, tasks, k, temperature)
    result = {"step": step, "tasks": tasks, "k": k, "workflow": config.env.workflow,
              "sharing": config.policy.sharing, f"avg@{k}_success": result["eval_success"], **result}
    write_eval_outputs(result, workdir, out, label=config.policy.sharing, title=f"{config.env.workflow}: held-out success")
    print(json.dumps(result))
    return result


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    temp = None if _TEMPERATURE.value < 0 else _TEMPERATURE.value
    run_evaluation(_CONFIG.value, _CHECKPOINT.value, _TASKS.value, _K.value, temp, _OUT.value)


if __name__ == "__main__":
    app.run(main)
