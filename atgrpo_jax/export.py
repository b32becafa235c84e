"""Export a trained policy of a run as a Hugging Face directory that transformers and vLLM load.

    python -m atgrpo_jax.export --checkpoint=WORKDIR [--step=N] [--policy=NAME] [--lora=merge|adapter] --out=DIR

The run is rebuilt from its config.json (`--config.KEY=VALUE` may change it, e.g. the mesh on
another machine) and the policy restored from its checkpoint (default: the latest). A full
policy, or a LoRA policy with `--lora=merge` (the default: adapters added into the base
weights), becomes a checkpoint of its model family (Qwen3, Llama, Qwen2): config.json,
model*.safetensors, the tokenizer files with their chat template, and generation_config.json (the
run's stop and pad ids and how the policy's agents sampled). `--lora=adapter` writes the adapters alone in PEFT's format
(adapter_config.json naming model.hf_path as the base, adapter_model.safetensors) plus the
same tokenizer and generation files, and README.md, a model card (atgrpo_jax/model_card.py).
Nothing is written until the checkpoint is read; the directory is written beside DIR and renamed
into place, so it appears whole or not at all. `--push_to_hub=org/name` then uploads it with
huggingface_hub (refused in one line, before any work, when HF_HUB_OFFLINE=1).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import types

from absl import flags

from atgrpo_jax import cli, errors, workdir as wd
from atgrpo_jax.hf_cache import offline
from atgrpo_jax.model_card import model_card
from atgrpo_jax.models.hf_io import save_pretrained
from atgrpo_jax.models.hub_ids import is_repo_id
from atgrpo_jax.models.peft_io import save_adapter
from atgrpo_jax.train.checkpoint import Checkpointer
from atgrpo_jax.train.config import from_saved
from atgrpo_jax.train.metrics_files import METRICS_FILE, read_metrics
from atgrpo_jax.train.resume import restore_given
from atgrpo_jax.train.setup import Run, build_run
from atgrpo_jax.train.step import policy_states, set_policy_states
from atgrpo_jax.train.validate import resolve

LORA_MODES = ("merge", "adapter")


def pick_policy(names: list[str], wanted: str | None) -> int:
    """The index of policy `wanted` (default: the only one); an error lists the names."""
    if wanted is None:
        if len(names) == 1:
            return 0
        raise cli.UsageError(f"the run has {len(names)} policies: choose one with --policy ({', '.join(names)})")
    if wanted not in names:
        raise cli.UsageError(f"--policy={wanted}: the run has no such policy ({', '.join(names)})")
    return names.index(wanted)


def pick_step(steps: list[int], wanted: int | None, where: str) -> int:
    """`wanted` if it was saved (default: the latest saved step); an error lists the saved steps."""
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint in {where}")
    if wanted is None:
        return steps[-1]
    if wanted not in steps:
        raise cli.UsageError(f"--step={wanted}: no checkpoint of that step in {where} (steps: {steps})")
    return wanted


def generation_config(run: Run, index: int):
    """transformers' GenerationConfig for policy `index`: the run's stop and pad ids and the
    sampling of the agents it acts for (a setting on which they differ: the rollout's)."""
    from transformers import GenerationConfig

    mine = [s for s, p in zip(run.sampling, run.policy_of_agent) if int(p) == index]
    rollout = run.config.rollout.agent("")  # no agent's overrides
    pick = {k: getattr(mine[0], k) if len({getattr(s, k) for s in mine}) == 1 else getattr(rollout, k)
            for k in ("temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty")}
    fields = dict(eos_token_id=list(run.stop_ids), pad_token_id=run.tokenizer.pad_token_id,
                  max_new_tokens=pick["max_new_tokens"], do_sample=pick["temperature"] > 0)
    if pick["temperature"] > 0:  # top_k 0 = off, as in transformers (whose default is 50) and vLLM
        fields.update(temperature=pick["temperature"], top_p=pick["top_p"], top_k=pick["top_k"])
    if pick["repetition_penalty"] != 1:  # transformers' definition is vLLM's (prompt and response ids)
        fields.update(repetition_penalty=pick["repetition_penalty"])
    config = GenerationConfig(**fields)
    config.validate(strict=True)
    return config


def _check_out(out: str, workdir: str, overwrite: bool) -> None:
    """An error for an --out that cannot be written (checked before anything is read)."""
    if not out:
        raise cli.UsageError("--out is required")
    if wd.is_remote(out):
        raise cli.UsageError(f"--out={out}: export to a local directory (copy it to the store afterwards)")
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"--out={out} is a file")
    if os.path.isdir(path) and os.listdir(path):
        if not overwrite:
            raise errors.OutputExists(f"--out={out} exists and is not empty: give a new directory or --overwrite "
                                      "(overwrite=True in Python)")
        run = os.path.abspath(workdir) if not wd.is_remote(workdir) else None
        if run and (run == path or run.startswith(path + os.sep)):
            raise cli.UsageError(f"--out={out} holds the run's workdir {workdir}: --overwrite would delete it")
    wd.check_writable(path, "--out")
    if os.path.isdir(path):
        wd.check_writable(os.path.dirname(path), "--out")  # the export is written beside it, then renamed


def _usual_permissions(top: str) -> None:
    """The modes a plain mkdir/open would give (mkdtemp and some writers make 0700/0600): the export
    is meant to be read by a server running as another user."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(top, 0o777 & ~mask)
    for root, dirs, files in os.walk(top):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~mask)
        for f in files:
            os.chmod(os.path.join(root, f), 0o666 & ~mask)


def _publish(tmp: str, out: str) -> None:
    """Move the finished directory `tmp` to `out`, replacing what is there."""
    _usual_permissions(tmp)
    old = None
    if os.path.isdir(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rename(out, os.path.join(old, "x"))
    os.rename(tmp, out)
    if old:
        shutil.rmtree(old)


def export_policy(workdir: str, out: str, *, step: int | None = None, policy: str | None = None,
                  lora: str = "merge", overwrite: bool = False, overrides=(), print_result: bool = True) -> dict:
    """Write one policy of the run in `workdir` (or `WORKDIR/checkpoints/STEP`) to `out`; returns a summary
    (printed as a JSON line too unless print_result is False, as the Python API calls it)."""
    import jax


    if lora not in LORA_MODES:
        raise cli.UsageError(f"--lora={lora}: not one of {', '.join(LORA_MODES)}")
    workdir, ckpt_dir, in_path = wd.locate_checkpoint(workdir)
    if in_path is not None and step is not None and step != in_path:
        raise cli.UsageError(f"--step={step} contradicts the checkpoint path's step {in_path}")
    step = in_path if step is None else step
    _check_out(out, workdir, overwrite)
    saved = wd.saved_config(workdir) if wd.isdir(workdir) else None
    if saved is None:
        raise FileNotFoundError(f"--checkpoint={workdir}: no config.json there, so not a run's workdir")
    config = resolve(cli.apply_overrides(from_saved(saved), overrides))
    if not wd.exists(ckpt_dir):
        raise FileNotFoundError(f"--checkpoint={workdir}: no checkpoints directory (the run saved no step)")
    ckpt = Checkpointer(ckpt_dir, keep_last=0, read_only=True)
    step = pick_step(ckpt.all_steps(), step, ckpt_dir)

    run = build_run(config)
    index = pick_policy([p.name for p in run.policies], policy)
    chosen = run.policies[index]
    if lora == "adapter" and not chosen.is_lora:
        raise cli.UsageError(f"--lora=adapter: policy {chosen.name} is a full model, not an adapter")
    base = config.model.hf_path
    if lora == "adapter" and not base:
        raise cli.UsageError(f"--lora=adapter: the base of {chosen.name} is random weights (model.hf_path is "
                             "empty), which no one can load the adapter onto: use --lora=merge")
    states, meta = restore_given(ckpt, step, policy_states(run), "--step", config, workdir)
    set_policy_states(run, states)
    ckpt.close()

    out = os.path.abspath(out)
    extras = (run.tokenizer, generation_config(run, index))
    agents = [a.name for a, p in zip(run.workflow.agents, run.policy_of_agent) if p == index]
    role = agents[0] if len(agents) == 1 else None  # the policy's one agent: its model is the role's own
    card = model_card(config.role(role), step=step, policy=chosen.name, adapter=lora == "adapter",
                      metrics=read_metrics(workdir) if wd.exists(wd.join(workdir, METRICS_FILE)) else [],
                      agents=[a.name for a in run.workflow.agents], sft=meta.get("command") == "sft")
    writer = jax.process_index() == 0
    tmp = None
    if writer:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.partial-", dir=os.path.dirname(out))
    try:
        if lora == "adapter":
            save_adapter(chosen.model(), tmp, base)
        else:
            save_pretrained(chosen.export_model(), tmp)  # LoRA merged, masters in the model's param_dtype
        if writer:
            for extra in extras:
                extra.save_pretrained(tmp)
            with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
                f.write(card)
            _publish(tmp, out)
    except BaseException:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary = {"out": out, "workdir": workdir, "step": step, "policy": chosen.name,
               "lora": lora if chosen.is_lora else None, "files": sorted(os.listdir(out)) if writer else []}
    if print_result:
        print(json.dumps(summary))
    return summary


def main(f, overrides=()):
    """The command (run by `cli.command`: flags parsed, errors as one line)."""
    if not f.checkpoint.value:
        raise cli.UsageError("--checkpoint is required (a run's workdir)")
    check_push(f.push_to_hub.value)
    summary = export_policy(f.checkpoint.value, f.out.value, step=f.step.value, policy=f.policy.value,
                            lora=f.lora.value, overwrite=f.overwrite.value, overrides=overrides)
    if f.push_to_hub.value:
        push(summary["out"], f.push_to_hub.value)


def check_push(repo: str | None) -> None:
    """--push_to_hub that cannot work: one line, before any work."""

    if not repo:
        return
    if not is_repo_id(repo):
        raise cli.UsageError(f"--push_to_hub={repo}: give a Hugging Face repository id, org/name")
    if offline():
        raise cli.UsageError(f"--push_to_hub={repo}: HF_HUB_OFFLINE=1, so nothing can be uploaded; export without "
                             "it and upload the directory later (hf upload)")


def push(out: str, repo: str, print_result: bool = True) -> str:
    """Upload the exported directory to the Hub repository `repo` (created if new); returns its URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, exist_ok=True)
    api.upload_folder(folder_path=out, repo_id=repo, commit_message="atgrpo-jax export")
    url = f"https://huggingface.co/{repo}"
    if print_result:
        print(json.dumps({"pushed": url}))
    return url


def _flags() -> types.SimpleNamespace:
    """The command's flags (defined when it runs, so importing this module defines none)."""
    return types.SimpleNamespace(
        checkpoint=flags.DEFINE_string("checkpoint", None, "a run's workdir, or WORKDIR/checkpoints/STEP"),
        step=flags.DEFINE_integer("step", None, "checkpoint step (default: the latest)"),
        policy=flags.DEFINE_string("policy", None, "policy to export (required when the run has several: "
                                   "per_role, lora)"),
        lora=flags.DEFINE_enum("lora", "merge", list(LORA_MODES), "a LoRA policy: merge = the base with the adapters "
                               "added in; adapter = the adapters alone, in PEFT's format"),
        out=flags.DEFINE_string("out", None, "directory to write (must be new or empty unless --overwrite)"),
        overwrite=flags.DEFINE_bool("overwrite", False, "replace a non-empty --out"),
        push_to_hub=flags.DEFINE_string("push_to_hub", None, "org/name: upload the export to this Hugging Face "
                                        "repository (created if new; needs `hf auth login`)"))


if __name__ == "__main__":
    cli.command(main, _flags)
