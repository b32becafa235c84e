"""The README.md model card `export` writes: YAML front matter as the Hugging Face Hub reads it
(base_model, library_name, pipeline_tag, tags, license where known), then the task, the regime,
the steps, the run's held-out results at the exported step and the run's config (an sft run's: its data,
steps and held-out loss)."""
from __future__ import annotations

import json

from atgrpo_jax.models.hub_ids import parse_hub_id
from atgrpo_jax.train.config import REGIMES, flat

# Licenses of base models we know (the Qwen3 and SmolLM2 families are Apache-2.0); others are left out.
KNOWN_LICENSES = {"Qwen/Qwen3-": "apache-2.0", "HuggingFaceTB/SmolLM2-": "apache-2.0"}


def regime_of(config) -> str:
    """The regime name whose settings the (resolved) config has, or a description of them."""
    settings = {"policy.sharing": config.policy.sharing, "rollout.tree": config.rollout.tree,
                "env.single_agent": config.env.single_agent}
    for name, wanted in REGIMES.items():
        if wanted == settings:
            return name
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def eval_rows(metrics: list[dict], step: int) -> tuple[int | None, list[tuple[str, float]]]:
    """(the step evaluated, [(metric, value)]) of the last evaluation at or before `step`."""
    evaluated = [r for r in metrics if r["step"] <= step and any(k.startswith("eval") for k in r)]
    if not evaluated:
        return None, []
    row = evaluated[-1]
    return row["step"], [(k, row[k]) for k in sorted(row) if k.startswith("eval") and row[k] is not None]


def _yaml_list(items) -> str:
    return "".join(f"\n- {json.dumps(x)}" for x in items)


def sft_lines(config, step: int, metrics: list[dict], start: str) -> list[str]:
    """The body of an sft run's card (atgrpo_jax/sft): its data, steps and last held-out loss."""
    s = config.sft
    lines = ["# Supervised warm start (atgrpo-jax)", "",
             f"Fine-tuned by atgrpo-jax's sft command (the negative log-likelihood of the assistant tokens of "
             f"chat data) from {start}.", "", "| | |", "|---|---|", f"| data | `{s.train_path}` |",
             f"| steps | {step} of {s.steps} ({s.rows} packed rows of {s.row_tokens} tokens per step) |", ""]
    held = [r for r in metrics if r["step"] <= step and r.get("valid_loss") is not None]
    if held:
        lines += [f"Held-out loss on `{s.valid_path}` at step {held[-1]['step']}: {held[-1]['valid_loss']:.4g}.", ""]
    return lines


def model_card(config, *, step: int, policy: str, adapter: bool, metrics: list[dict], agents: list[str],
               sft: bool = False) -> str:
    """The card's text (see the module docstring); `sft`: of an sft run (atgrpo_jax/sft)."""
    base = config.model.hf_path
    hub = parse_hub_id(base) if base else None
    base_id = hub[0] if hub else None
    regime = regime_of(config)
    workflow = config.env.workflow
    start = f"`{base}`" if base else "random weights"
    if config.model.init_from:
        start = f"the weights of the run `{config.model.init_from}` (model.init_from)"
    front = ["---"]
    if base_id:
        front.append(f"base_model: {json.dumps(base_id)}")
    front.append(f"library_name: {'peft' if adapter else 'transformers'}")
    front.append("pipeline_tag: text-generation")
    tags = ["atgrpo-jax", "sft"] if sft else \
        ["atgrpo-jax", "reinforcement-learning", "grpo", "at-grpo" if config.rollout.tree else "plain-grpo",
         "multi-agent" if len(agents) > 1 else "single-agent", workflow.replace(":", "-")] + \
        (["lora"] if adapter else [])
    front.append("tags:" + _yaml_list(tags))
    license_ = next((lic for prefix, lic in KNOWN_LICENSES.items() if base_id and base_id.startswith(prefix)), None)
    if license_:
        front.append(f"license: {license_}")
    front.append("---")
    at, rows = eval_rows(metrics, step)
    lines = [f"# {workflow} policy `{policy}` (atgrpo-jax)", "",
             "Trained with atgrpo-jax (AT-GRPO, [arXiv 2510.11062](https://arxiv.org/abs/2510.11062)) "
             f"from {start}" + (" (a PEFT LoRA adapter on it)" if adapter else "")
             + ".", "",
             "| | |", "|---|---|",
             f"| task | `{workflow}`{' (single-agent variant)' if config.env.single_agent else ''}; agents: "
             f"{', '.join(agents)} |",
             f"| regime | `{regime}` |",
             f"| steps | {step} of {config.train.steps} (K = {config.rollout.k} per group, {config.rollout.num_tasks} "
             f"tasks per step) |", ""]
    if sft:
        lines = sft_lines(config, step, metrics, start)
    elif rows:
        lines += [f"## Held-out results (step {at})", "", "| metric | value |", "|---|---|"]
        lines += [f"| `{k}` | {v:.4g} |" if isinstance(v, float) else f"| `{k}` | {v} |" for k, v in rows]
        lines.append("")
    else:
        lines += ["No held-out evaluation was logged up to this step.", ""]
    shown = {k: list(v) if isinstance(v, tuple) else v for k, v in flat(config).items()}
    lines += ["## Config", "", "```json", json.dumps(shown, indent=1, sort_keys=True, default=str), "```", ""]
    return "\n".join(front) + "\n" + "\n".join(lines)
