"""What the agents said: episode records for `episodes.jsonl` (training) and `eval_episodes.jsonl`.

A training record is one task of a step: for each turn and agent, the prompt, the K
responses with what the environment read from each (`parsed_as`: the action, or why
nothing parsed), their local/team/mixed rewards and advantages, and the branch the
episode continued from. An evaluation record is one episode: its turns, one response
each. Texts are cut to `MAX_CHARS`, so a record stays readable and the files bounded.
"""
from __future__ import annotations

import numpy as np

from atgrpo_jax.rollout.samples import Samples
from atgrpo_jax.rollout.tree import Episodes

MAX_CHARS = 4000


def _clip(text) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS // 2] + "\n[...]\n" + text[-MAX_CHARS // 2:]


def _prompt(tokenizer, samples: Samples, g: int, k: int) -> str:
    return _clip(tokenizer.decode([int(t) for t in samples.prompt_ids(g, k)]))


def _branch(samples: Samples, g: int, k: int, adv: np.ndarray | None, agent_names=None) -> dict:
    out = {"agent": agent_names[int(samples.sample_agent[g, k])]} if agent_names else {}
    out |= {"response": _clip(samples.text[g, k]), "parsed_as": _clip(samples.parsed_as[g, k]),
           "local": float(samples.local_reward[g, k]), "team": float(samples.team_reward[g, k]),
           "reward": float(samples.reward[g, k])}
    if adv is not None:
        out["advantage"] = float(adv[g, k])
    return out


def training_records(step: int, samples: Samples, episodes: Episodes, adv: np.ndarray, agent_names, tokenizer,
                     num_tasks: int) -> list[dict]:
    """Records of the first `num_tasks` tasks of a step (the groups it trained on, turn by turn)."""
    records = []
    for task in range(min(num_tasks, len(episodes.success))):
        turns = []
        for g in np.flatnonzero(samples.task == task):  # (turn, agent) order: the rollout merged them so
            live = np.flatnonzero(samples.mask[g])
            mixed = samples.agent[g] < 0  # a plain-GRPO group of every agent: each branch names its agent
            turns.append({"turn": int(samples.turn[g]),
                          "agent": "(several)" if mixed else agent_names[int(samples.agent[g])],
                          "prompt": _prompt(tokenizer, samples, g, live[0]), "selected": int(samples.selected[g]),
                          "branches": [_branch(samples, g, k, adv, agent_names if mixed else None) for k in live]})
        records.append({"step": int(step), "task": task, "success": float(episodes.success[task]),
                        "turns": float(episodes.turns[task]), "log": turns})
    return records


def evaluation_records(split: str, episodes: Episodes, agent_names, tokenizer, num_tasks: int) -> list[dict]:
    """One record per evaluation episode of the first `num_tasks` tasks: task, episode, success, its turns."""
    t = episodes.trajectory
    k = episodes.episode_success.shape[1]
    records = []
    for e in range(num_tasks * k):
        turns = [{"turn": int(t.turn[g]), "agent": agent_names[int(t.agent[g])], "prompt": _prompt(tokenizer, t, g, 0),
                  **_branch(t, g, 0, None)} for g in np.flatnonzero((t.task == e) & t.mask[:, 0])]
        records.append({"split": split, "task": e // k, "episode": e % k,
                        "success": bool(episodes.episode_success[e // k, e % k]), "log": turns})
    return records


def as_markdown(record: dict) -> str:
    """A training record as short markdown, for TensorBoard's text tab."""
    lines = [f"**task {record['task']}**, success {record['success']:.2f}"]
    for turn in record["log"]:
        lines.append(f"\n**turn {turn['turn']}, {turn['agent']}** (selected branch {turn['selected']})\n")
        lines.append("```\n" + turn["prompt"][-1500:] + "\n```")
        for k, b in enumerate(turn["branches"]):
            lines.append(f"- branch {k}: reward {b['reward']:+.3f} (local {b['local']:+.3f}, team {b['team']:+.3f}), "
                         f"advantage {b.get('advantage', 0.0):+.3f}; parsed as: `{b['parsed_as'][:200]}`\n\n"
                         "  ```\n  " + b["response"][:800].replace("\n", "\n  ") + "\n  ```")
    return "\n".join(lines)
