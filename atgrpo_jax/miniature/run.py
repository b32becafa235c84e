"""The paper's table in miniature (configs/miniature.py): SFT warm start, then regimes x recipes.

    OUT/traces.jsonl        noised solver play of the team and the single agent, under every recipe
    OUT/tokenizer/          Qwen3's tokenizer trimmed to what those prompts and the held-out prompts use
    OUT/sft/                the warm start: one model, trained on every row of traces.jsonl
    OUT/RECIPE/REGIME/seedS the RL runs (atgrpo_jax.ablate), each from the warm start, at an equal budget
    OUT/table.md, table.json, curves.png

Every stage is skipped when its output is complete, so a run that stopped resumes where it was.
"""
from __future__ import annotations

import json
import os

import numpy as np

from atgrpo_jax import cli, workdir as wd
from atgrpo_jax.ablate import run_table
from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.miniature import traces
from atgrpo_jax.models.tokenizer import qwen3_tokenizer, render_chat
from atgrpo_jax.models.trimmed import save_trimmed, trim_qwen3
from atgrpo_jax.train.metrics_files import read_metrics

RECIPES = ("paper", "reference")
REGIMES = ("single_agent", "shared", "per_role", "plain_grpo")


def game_of(config) -> str:
    return config.env.workflow.removesuffix("_tool_plan")


def workflow_for(config, recipe: str, single_agent: bool):
    return make_workflow(config.env.workflow, single_agent=single_agent, recipe=recipe, **config.env.kwargs)


def write_traces(config, out: str, tasks: int, noise: float, recipes) -> str:
    """OUT/traces.jsonl: `tasks` scripted episodes per (recipe, team or single agent)."""
    path = os.path.join(out, "traces.jsonl")
    if not os.path.exists(path):
        rows = []
        for i, recipe in enumerate(recipes):
            for j, single in enumerate((False, True)):
                wf = workflow_for(config, recipe, single)
                rows += list(traces.episodes(wf, game_of(config), range(tasks), noise, seed=2 * i + j))
        np.random.default_rng(0).shuffle(rows)
        traces.write_jsonl(rows, path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def held_out_prompts(config, recipes, tasks: int) -> list[str]:
    """The first turn's prompts of the held-out levels (only their wording reaches the tokenizer)."""
    tok, texts = qwen3_tokenizer(), []
    for recipe in recipes:
        for single in (False, True):
            wf = workflow_for(config, recipe, single)
            split = "test" if "test" in wf.splits else next(iter(wf.splits))
            state = wf.reset(list(range(tasks)), split)
            for agent in range(len(wf.agents)):
                texts += [render_chat(tok, m) for m in wf.prompts(state, agent, 0)]
    return texts


def write_tokenizer(config, out: str, trace_path: str, recipes) -> str:
    directory = os.path.join(out, "tokenizer")
    if not os.path.exists(os.path.join(directory, "trimmed.json")):
        tok = qwen3_tokenizer()
        with open(trace_path) as f:
            texts = [render_chat(tok, json.loads(line)["messages"], add_generation_prompt=False) for line in f]
        texts += held_out_prompts(config, recipes, config.train.eval_tasks)
        trimmed, ids = trim_qwen3(texts)
        save_trimmed(trimmed, ids, directory)
    return directory


def with_tokenizer(config, directory: str):
    c = config.copy_and_resolve_references()
    with open(os.path.join(directory, "trimmed.json")) as f:
        c.model.vocab_size = len(json.load(f)["qwen3_ids"])
    c.tokenizer = directory
    return c


def warm_start(config, out: str, trace_path: str) -> str:
    from atgrpo_jax.sft.loop import run_sft

    workdir = os.path.join(out, "sft")
    rows = read_metrics(workdir) if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else []
    if not rows or rows[-1]["step"] < config.sft.steps:
        c = config.copy_and_resolve_references()
        c.sft.train_path = trace_path
        print(f"SFT warm start on {trace_path}: {workdir}", flush=True)
        run_sft(c, workdir)
    return workdir


def run_miniature(config, out: str, *, recipes=RECIPES, regimes=REGIMES, seeds=("0",), tasks: int = 128,
                  noise: float = 0.5) -> dict:
    wd.check_writable(out, "--out")
    os.makedirs(out, exist_ok=True)
    trace_path = write_traces(config, out, tasks, noise, recipes)
    config = with_tokenizer(config, write_tokenizer(config, out, trace_path, recipes))
    sft_dir = warm_start(config, out, trace_path)
    for recipe in recipes:
        c = config.copy_and_resolve_references()
        c.recipe, c.model.init_from = recipe, sft_dir
        run_table(c, list(regimes), list(seeds), os.path.join(out, recipe))
    table = combine(out, recipes, regimes, seeds)
    write_outputs(table, out)
    return table


def combine(out: str, recipes, regimes, seeds) -> dict:
    """{recipe: {regime: {"start": [...], "final": [...], "curve": {step: mean}}}} from the runs' metrics."""
    table = {}
    for recipe in recipes:
        table[recipe] = {}
        for regime in regimes:
            start, final, curves = [], [], []
            for seed in seeds:
                rows = read_metrics(os.path.join(out, recipe, regime, f"seed{seed}"))
                evals = {r["step"]: r["eval_success"] for r in rows if r.get("eval_success") is not None}
                start.append(evals.get(0, float("nan")))
                final.append(evals[max(evals)] if evals else float("nan"))
                curves.append(evals)
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            table[recipe][regime] = {"start": start, "final": final,
                                     "curve": {s: float(np.mean([c[s] for c in curves])) for s in steps}}
    return table


NAMES = {"single_agent": "single agent", "shared": "AT-GRPO, shared policy", "per_role": "AT-GRPO, per role",
         "plain_grpo": "plain GRPO (no tree)"}


def markdown(table: dict) -> str:
    recipes = list(table)
    head = "| arm | " + " | ".join(f"{r}: start | {r}: end" for r in recipes) + " |"
    lines = [head, "|---|" + "---|---|" * len(recipes)]
    regimes = list(table[recipes[0]])
    team = [r for r in regimes if r != "single_agent"]
    if team:  # both agents from the warm start, no RL: the team regimes' step-0 evaluation
        cells = [f"{np.mean(table[rc][team[0]]['start']):.1%} | —" for rc in recipes]
        lines.append("| both agents untrained (warm start only) | " + " | ".join(cells) + " |")
    for regime in regimes:
        cells = [f"{np.mean(table[rc][regime]['start']):.1%} | {np.mean(table[rc][regime]['final']):.1%}"
                 for rc in recipes]
        lines.append(f"| {NAMES.get(regime, regime)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(table: dict, out: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(markdown(table))
    with open(os.path.join(out, "table.json"), "w") as f:
        f.write(cli.dumps(table, indent=2))
    fig = Figure(figsize=(4.2 * len(table), 3.6), dpi=100)
    FigureCanvasAgg(fig)
    for i, (recipe, rows) in enumerate(table.items()):
        ax = fig.add_subplot(1, len(table), i + 1)
        for regime, t in rows.items():
            xs = sorted(t["curve"])
            ax.plot(xs, [t["curve"][x] for x in xs], marker="o", markersize=3, label=NAMES.get(regime, regime))
        ax.set_title(f'recipe="{recipe}"')
        ax.set_xlabel("training step")
        ax.set_ylabel("held-out success")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"))
