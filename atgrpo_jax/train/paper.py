"""The paper's runs: each task's settings as the reference system runs them (docs/paper.md), on top of
`base_config`'s defaults, which are the paper's shared ones."""
from __future__ import annotations

import ml_collections

from atgrpo_jax.train.config import base_config

# Per-task settings of the paper's system (docs/paper.md): workflow, turns (T = 5 for the games and code, as
# the reference runs them), filters, training and evaluation temperatures (games: 1.5 and greedy), episodes per
# evaluation problem, and the workflow's own settings where the reference's differ from the workflow's defaults.
PAPER_CODE_ENV = dict(limits=dict(wall_s=30.0, cpu_s=30.0), output_match="whitespace", max_generated_tests=1,
                      max_train_gt_tests=4, max_gt_tests=None, simultaneous=True)
TASKS = {
    "plan_path": dict(workflow="plan_path_tool_plan", max_turns=5, temperature=1.5, eval_temperature=0.0,
                      drop_low_mean_frac=0.5, drop_zero_variance=False),
    "sokoban": dict(workflow="sokoban_tool_plan", max_turns=5, temperature=1.5, eval_temperature=0.0,
                    drop_low_mean_frac=0.5, drop_zero_variance=False),
    "sudoku": dict(workflow="sudoku_tool_plan", max_turns=5, temperature=1.5, eval_temperature=0.0,
                   drop_low_mean_frac=0.5, drop_zero_variance=False, env=dict(params=dict(rewards="reference"))),
    "math": dict(workflow="math", max_turns=4, temperature=1.0, eval_temperature=0.6,
                 drop_low_mean_frac=0.0, drop_zero_variance=False, env=dict(tool_first=True, simultaneous=True),
                 eval_k=5),
    "code": dict(workflow="code", max_turns=5, temperature=1.0, eval_temperature=0.6,
                 drop_low_mean_frac=0.0, drop_zero_variance=True, env=PAPER_CODE_ENV, eval_k=5),
    "search": dict(workflow="search", max_turns=5, temperature=1.0, eval_temperature=0.0,  # search_L1_prompt.yaml
                   drop_low_mean_frac=0.5, drop_zero_variance=False),
}

# The reference's sampling and schedule for every task (its configs at commit a054fb1, verl's schedule).
PAPER_SAMPLING = dict(top_p=0.9, top_k=20, repetition_penalty=1.2, eval_top_p=0.95, eval_top_k=20,
                      eval_repetition_penalty=1.2)
PAPER_OPTIM = dict(lr=5e-6, schedule="cosine", warmup_steps=10, min_lr_ratio=0.3)
# The paper's data (docs/data.md): AIME and OlympiadBench ship; the rest is prepared once into the data
# directory ($ATGRPO_DATA, else ./data) with `python -m atgrpo_jax.data prepare NAME`, and a run refuses to
# start, naming that command, while one is missing.
PAPER_DATA = {
    "math": dict(train_set="polaris", test_sets=("aime24", "aime25", "olympiadbench")),
    "code": dict(train_sets=("codecontests_train",), test_sets=("livecodebench", "apps_test500", "codecontests_test")),
    "search": dict(train_set="search_train_nq_hotpotqa", test_sets=("bamboogle", "2wikimultihopqa", "hotpotqa",
                                                                   "musique"), corpus="wiki18"),
}


def paper_config(task: str, preset: str) -> ml_collections.ConfigDict:
    """The paper's system for `task` with a Qwen3 `preset` (weights from model.hf_path).

    The rest of the paper's settings (B = 32, K = 8, 4096/2048 tokens, mini-batch 16, 200 steps,
    evaluation every 10) are base_config's defaults."""
    t = TASKS[task]
    c = base_config()
    c.model.update(preset=preset, param_dtype="bfloat16", compute_dtype="bfloat16", remat=True)
    c.env.workflow = t["workflow"]
    c.env.kwargs.update(t.get("env", {}))
    c.train.eval_k = t.get("eval_k", 1)  # the reference's 5 samples per problem (greedy games: 5 equal episodes)
    c.env.kwargs.update(PAPER_DATA.get(task, {}))
    c.rollout.update(max_turns=t["max_turns"], temperature=t["temperature"], eval_temperature=t["eval_temperature"],
                     **PAPER_SAMPLING)
    c.optim.update(**PAPER_OPTIM)
    c.algo.update(drop_low_mean_frac=t["drop_low_mean_frac"], drop_zero_variance=t["drop_zero_variance"])
    return c
