"""Score a run's checkpoint or any Hugging Face model (Qwen3, Llama, Qwen2; a .gguf file) on held-out splits.

    python -m atgrpo_jax.evaluate --checkpoint=WORKDIR[/checkpoints/STEP] [--splits=aime24,aime25] [--k=4]
    python -m atgrpo_jax.evaluate --config=configs/math_qwen3_8b.py --hf_path=DIR [--splits=...] --out=DIR

A checkpoint is evaluated with its run's own config (config.json; `--config` and
`--config.KEY=VALUE` may replace it); `--hf_path` evaluates a model directory with no run at
all (e.g. the base model, or an exported policy). Each split's problems are all played (a
split of generated levels: `--tasks` of them), `--k` independent episodes each: avg@k is the
mean success over episodes, pass@k the share of tasks solved at least once. Writes to --out
(default: the run's workdir): eval.json (the metrics), eval_episodes.jsonl (one line per
episode: what each agent was shown and said, what was parsed, the rewards) and, for a run
with metrics, learning_curve.png. Paths may be object-store URLs (gs://; needs gcsfs).
"""
from __future__ import annotations

import types

from absl import flags

from atgrpo_jax import cli, workdir as wd
from atgrpo_jax.envs.workflow import episodes_per_problem
from atgrpo_jax.models.hub_ids import local_model_dir
from atgrpo_jax.train.checkpoint import Checkpointer, short_cause
from atgrpo_jax.train.config import from_saved
from atgrpo_jax.train.episodes import evaluation_records
from atgrpo_jax.train.heldout import evaluation
from atgrpo_jax.train.metrics_files import METRICS_FILE
from atgrpo_jax.train.plots import plot_learning_curves
from atgrpo_jax.train.resume import restore_given
from atgrpo_jax.train.setup import Run, build_run
from atgrpo_jax.train.step import policy_states, set_policy_states
from atgrpo_jax.train.validate import resolve

EVAL_FILE = "eval.json"
EVAL_EPISODES_FILE = "eval_episodes.jsonl"



def write_eval_outputs(result: dict, workdir: str | None, out: str, *, label: str, title: str) -> list[str]:
    """Write `out/eval.json` and, when the run has metrics, `out/learning_curve.png`; returns the paths."""

    wd.makedirs(out)
    written = [wd.join(out, EVAL_FILE)]
    wd.write_text(written[0], cli.dumps(result, indent=2))
    if workdir and wd.exists(wd.join(workdir, METRICS_FILE)):
        written.append(plot_learning_curves({label: workdir}, wd.join(out, "learning_curve.png"),
                                            metric="eval_success", title=title))
    return written


def parse_policies(items) -> dict[str, tuple[str, str | None, int | None]]:
    """{agent: (workdir, policy name or None, step or None)} from AGENT=WORKDIR[:POLICY][@STEP] items."""
    out = {}
    for item in items:
        agent, eq, source = item.partition("=")
        if not eq or not agent or not source:
            raise cli.UsageError(f"--policies: {item!r} is not AGENT=WORKDIR[:POLICY][@STEP]")
        source, _, step = source.partition("@")
        workdir, _, policy = source.partition(":")
        if step and not step.isdigit():
            raise cli.UsageError(f"--policies: step {step!r} of {item!r} is not a number")
        out[agent] = (workdir, policy or None, int(step) if step else None)
    return out


def load_policies_from(run: Run, sources: dict) -> None:
    """Replace the policy acting for each agent of `sources` by one restored from another run."""

    names = [a.name for a in run.workflow.agents]
    if len(run.policies) != len(names):
        raise cli.UsageError("--policies needs one policy per agent (policy.sharing per_role or lora)")
    for agent, (workdir, policy, step) in sources.items():
        if agent not in names:
            raise cli.UsageError(f"--policies: {agent!r} is not an agent ({names})")
        mine = run.policies[int(run.policy_of_agent[names.index(agent)])]
        ckpt = Checkpointer(wd.checkpoint_dir(workdir), keep_last=0, read_only=True)
        name = policy or mine.name
        saved = ckpt.saved_names(step)  # that run's policies, which may not be this run's (a role trained alone)
        if name not in saved:
            raise cli.UsageError(f"--policies: {workdir} has no policy {name!r} ({saved})")
        try:  # each read as this agent's policy is: the same model and optimizer
            target = policy_states(run)[mine.name]
            states, _ = ckpt.restore(step, target={n: target for n in saved})
        except Exception as e:  # noqa: BLE001 - another model's shapes, or damaged files: the cause says which
            at = "its latest checkpoint" if step is None else f"its checkpoint {step}"
            raise cli.UsageError(f"--policies: {workdir}: {at} does not restore as {agent!r}'s policy "
                                 f"({short_cause(e)})") from None
        mine.load(states[name])


def check_flags(config, tasks: int | None, k: int | None, temperature: float | None) -> None:
    """One-line errors for evaluation settings that cannot work or would mislead (before any work)."""
    if k is not None and k < 1:
        raise cli.UsageError(f"--k={k}: must be >= 1 (episodes per task)")
    if tasks is not None and tasks < 1:
        raise cli.UsageError(f"--tasks={tasks}: must be >= 1 (tasks of a split of generated tasks)")
    if temperature is not None and temperature < 0:
        raise cli.UsageError(f"--temperature={temperature}: must be >= 0 (0 = greedy)")
    k = config.train.eval_k if k is None else k
    t = config.rollout.eval_temperature if temperature is None else temperature
    if k > 1 and t == 0:
        raise cli.UsageError(f"--k={k} at temperature 0: greedy decoding plays the same episode {k} times, so "
                             f"avg@{k} = pass@{k} = avg@1; give --temperature > 0 (e.g. 0.6) or --k=1")


def run_evaluation(config, checkpoint: str | None = None, hf_path: str | None = None, splits=(),
                   tasks: int | None = None, k: int | None = None, temperature: float | None = None, out: str = "",
                   policies_from=None, print_result: bool = True) -> dict:
    """Evaluate a checkpoint of a run (config: the run's) or the model at `hf_path`; returns eval.json's dict
    (printed too unless print_result is False, as the Python API calls it). policies_from: `parse_policies`'
    mapping (some agents' policies from other runs)."""

    if (checkpoint is None) == (hf_path is None):
        raise cli.UsageError("give exactly one of --checkpoint and --hf_path")
    workdir = ckpt_dir = step = None
    if hf_path:
        local_model_dir(hf_path, "--hf_path")  # a hub id: downloaded (or found in the cache) now, or one line
        config.model.hf_path = hf_path
        config.model.preset = ""  # the checkpoint's own architecture (config.json), not the config's preset
        if config.tokenizer == "qwen3":
            config.tokenizer = hf_path  # the model's own tokenizer files
    else:
        workdir, ckpt_dir, step = wd.locate_checkpoint(checkpoint)
        wd.require_support(ckpt_dir, checkpoints=True)  # missing gs:// packages: fail before compiling
    out = out or workdir
    if not out:
        raise cli.UsageError("--out is required with --hf_path")
    wd.require_support(out)
    check_flags(config, tasks, k, temperature)
    wd.check_writable(out, "--out")  # before hours of evaluation, not after
    config = resolve(config)
    run = build_run(config)
    splits = list(splits) or list(run.workflow.test_splits)
    unknown = [s for s in splits if s not in run.workflow.splits]
    if unknown:
        raise cli.UsageError(f"--splits: {unknown} not in the workflow's splits {list(run.workflow.splits)}")
    if checkpoint:
        ckpt = Checkpointer(ckpt_dir, keep_last=0, read_only=True)
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {ckpt_dir}")
        states, _ = restore_given(ckpt, step, policy_states(run), f"--checkpoint={ckpt_dir}/STEP", config, workdir)
        set_policy_states(run, states)
    if policies_from:
        load_policies_from(run, policies_from)
    tasks = config.train.eval_tasks if tasks is None else tasks
    k = episodes_per_problem(run.workflow, config.train.eval_k) if k is None else k
    metrics, episodes = evaluation(run, splits, tasks, k, temperature)
    result = {"model": hf_path or checkpoint, "step": step, "workflow": config.env.workflow,
              "sharing": config.policy.sharing, "k": k, "splits": splits,
              **({"policies_from": {a: list(v) for a, v in policies_from.items()}} if policies_from else {}), **metrics}
    write_eval_outputs(result, workdir, out, label=config.policy.sharing,
                       title=f"{config.env.workflow}: held-out success")
    names = [a.name for a in run.workflow.agents]
    lines = [cli.dumps(record, default=float)
             for split in splits
             for record in evaluation_records(split, episodes[split], names, run.tokenizer,
                                              len(episodes[split].success))]
    wd.write_text(wd.join(out, EVAL_EPISODES_FILE), "\n".join(lines) + "\n")
    if print_result:
        print(cli.dumps(result))
    return result


def config_for(checkpoint: str | None, spec: str | None, overrides):
    """The config to evaluate with: --config, else the run's own config.json."""

    if spec:
        return cli.config_from_args(spec, overrides)
    if not checkpoint:
        raise cli.UsageError("--config is required with --hf_path")
    saved = wd.saved_config(wd.locate_checkpoint(checkpoint)[0])
    if saved is None:
        raise cli.UsageError(f"{checkpoint} has no config.json: give --config")
    return cli.apply_overrides(from_saved(saved), overrides)


def main(f, overrides=()):
    """The command (run by `cli.command`: flags parsed, errors as one line)."""
    config = config_for(f.checkpoint.value, f.config.value, overrides)
    run_evaluation(config, f.checkpoint.value, f.hf_path.value, f.splits.value, f.tasks.value, f.k.value,
                   f.temperature.value, f.out.value, parse_policies(f.policies.value))


def _flags() -> types.SimpleNamespace:
    """The command's flags (defined when it runs, so importing this module defines none)."""
    return types.SimpleNamespace(
        config=flags.DEFINE_string("config", None, "config file (default with --checkpoint: the run's config.json)"),
        checkpoint=flags.DEFINE_string("checkpoint", None, "a run's workdir, or WORKDIR/checkpoints/STEP"),
        hf_path=flags.DEFINE_string("hf_path", None, "a Hugging Face model (Qwen3, Llama, Qwen2) to evaluate instead: "
                                   "a directory, a .gguf file or a hub id org/name[@revision] (downloaded into the HF "
                                   "cache; offline: from it)"),
        splits=flags.DEFINE_list("splits", [], "splits to evaluate (default: the workflow's test splits)"),
        tasks=flags.DEFINE_integer("tasks", None, "tasks of a split of generated tasks (default: train.eval_tasks)"),
        k=flags.DEFINE_integer("k", None, "episodes per task (default: config.train.eval_k)"),
        temperature=flags.DEFINE_float("temperature", None, "sampling temperature (default: rollout.eval_temperature)"),
        out=flags.DEFINE_string("out", "", "directory for the outputs (default: the run's workdir)"),
        policies=flags.DEFINE_list("policies", [], "AGENT=WORKDIR[:POLICY][@STEP],...: the policy acting for AGENT "
                                   "comes from another run's checkpoint (its policy POLICY, default AGENT's own): "
                                   "roles trained apart then combined, or swapped, as the paper's ablations"))


if __name__ == "__main__":
    cli.command(main, _flags)
