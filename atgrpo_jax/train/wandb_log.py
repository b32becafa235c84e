"""Weights & Biases as one more place metrics go (`train.loggers` with "wandb").

`pip install -e ".[wandb]"`; log in once (`wandb login`, or WANDB_API_KEY), or run with
WANDB_MODE=offline and `wandb sync` later. The W&B run gets the run's config (flat keys), the
same scalars as metrics.jsonl at the same steps (non-finite values left out), and each logged
step's episodes as a table (one row per branch: task, turn, agent, prompt, response, what was
parsed, reward, advantage). The W&B run id is kept in the workdir (`wandb_run_id`), so a resumed
run continues the same W&B run. W&B keeps steps in order: the steps a killed run logged after
its last checkpoint stay in W&B as they were (metrics.jsonl and TensorBoard drop and redo them).
"""
from __future__ import annotations

import os
import uuid

from atgrpo_jax import workdir as wd

RUN_ID_FILE = "wandb_run_id"
EPISODE_COLUMNS = ("step", "task", "turn", "agent", "prompt", "response", "parsed_as", "reward", "advantage")


def missing() -> str | None:
    """Why "wandb" cannot be used here, or None."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return "the wandb package, which is not installed: pip install -e \".[wandb]\" (or pip install wandb)"
    return None


def episode_rows(records) -> list[list]:
    """The rows of the episodes table for training records (train/episodes.py)."""
    rows = []
    for r in records:
        for turn in r["log"]:
            for b in turn["branches"]:
                rows.append([r["step"], r["task"], turn["turn"], b.get("agent", turn["agent"]), turn["prompt"],
                             b["response"], b["parsed_as"], b["reward"], b.get("advantage")])
    return rows


class WandbLogger:
    """Scalars, episodes tables and the config to one W&B run, continued on resume."""

    def __init__(self, workdir: str, config_flat: dict, *, project: str, entity: str, resumed: bool):
        import wandb

        self._wandb = wandb
        id_path = wd.join(workdir, RUN_ID_FILE)
        run_id = None
        if resumed and wd.exists(id_path):
            with wd.as_epath(id_path).open("r") as f:
                run_id = f.read().strip() or None
        fresh = run_id is None
        run_id = run_id or uuid.uuid4().hex[:12]
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or "atgrpo-jax",
                              entity=entity or None, id=run_id, resume="allow", name=wd.basename(workdir) or None,
                              dir=None if wd.is_remote(workdir) else workdir,
                              config={k: list(v) if isinstance(v, tuple) else v for k, v in config_flat.items()})
        if fresh:
            wd.write_text(id_path, run_id + "\n")
        self.run_id = run_id

    def scalars(self, step: int, values: dict):
        shown = {k: v for k, v in values.items() if v is not None}
        if shown:
            self._wandb.log(shown, step=int(step))

    def rows(self, name: str, records):
        if records:
            table = self._wandb.Table(columns=list(EPISODE_COLUMNS), data=episode_rows(records))
            self._wandb.log({name.removesuffix(".jsonl"): table}, step=int(records[0]["step"]))

    def close(self):
        self._wandb.finish()
