"""Every config file resolves in every regime and builds its workflow; paper configs refuse random weights."""
import copy
import glob
import importlib.util
import os

import pytest

from atgrpo_jax.envs.workflow_registry import make_workflow, workflow_roles
from atgrpo_jax.train.config import REGIMES, ConfigError
from atgrpo_jax.train.validate import resolve

CONFIGS = sorted(p for p in glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "*.py"))
                 if not p.endswith("__init__.py"))
PAPER = [p for p in CONFIGS if "_qwen3_" in os.path.basename(p)]


def load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_the_configs_the_issue_asks_for_exist():
    names = {os.path.basename(p)[:-3] for p in CONFIGS}
    for task in ("plan_path", "sokoban", "sudoku", "math", "code"):
        for size in ("1p7b", "8b"):
            assert f"{task}_qwen3_{size}" in names
    assert "demo" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.basename(p))
def test_config_resolves_in_every_regime_and_builds_its_workflow(path):
    base = load(path)
    if path in PAPER:
        base.model.hf_path = "/checkpoints/qwen3"  # resolve checks the setting, not the files
        for role in base.policy.role_models:  # a role of a model of its own: its own checkpoint
            base.policy.role_models[role].hf_path = f"/checkpoints/qwen3_{role}"
    own_layout = base.policy.sharing != "shared"  # a config that chose its layout takes no regime shorthand
    for regime in [""] if own_layout else REGIMES:
        c = copy.deepcopy(base)
        c.regime = regime
        assert resolve(c).regime == ""
    if own_layout:
        c = copy.deepcopy(base)
        c.regime = "shared"
        with pytest.raises(ConfigError, match="contradicts regime='shared'"):
            resolve(c)
    for single in (False, True) if base.env.workflow != "math_aggregation" else (False,):  # (a team only)
        wf = make_workflow(base.env.workflow, single_agent=single, **dict(base.env.kwargs))
        assert len(wf.agents) == (1 if single or base.env.workflow == "prompt_reward" else
                                  3 if base.env.workflow == "math_aggregation" else 2)  # (one role there)
        # the planner's count of the roles, made without the data, names the same roles
        assert [a.name for a in wf.agents] == list(workflow_roles(base.env.workflow, single, **dict(base.env.kwargs)))


@pytest.mark.parametrize("path", PAPER, ids=lambda p: os.path.basename(p))
def test_a_paper_config_without_weights_refuses_to_start(path):
    c = load(path)
    with pytest.raises(ConfigError, match=r"config\.model\.hf_path: .* has no weights"):
        resolve(c)
    c.model.init = "random"  # on purpose
    resolve(c)


def _leaves(c, prefix=""):
    for key, value in c.items():
        if hasattr(value, "items") and key != "kwargs":
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_every_config_key_has_a_comment_and_the_docs_list_them():
    from atgrpo_jax.train.config import base_config
    from atgrpo_jax.train.config_docs import config_docs, config_docs_page

    docs = {key: comment for key, _, comment in config_docs()}
    leaves = set(_leaves(base_config()))
    assert leaves <= set(docs), f"keys without a comment line: {sorted(leaves - set(docs))}"
    assert all(len(docs[k]) > 10 for k in leaves), [k for k in leaves if len(docs[k]) <= 10]
    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "reference", "config.md"), encoding="utf-8").read()
    assert page == config_docs_page(), \
        "docs/reference/config.md is stale: python -m atgrpo_jax.train.config_docs > docs/reference/config.md"


WORKFLOW_COLUMNS = {"games (Plan-Path, Sokoban, Sudoku)": ("plan_path", "sokoban", "sudoku"), "math": ("math",),
                    "code": ("code",)}


def _paper_tables():
    """docs/paper.md's two settings tables as lists of {column: cell} rows (a row naming several keys
    is one row per key, each cell's i-th comma-separated value going with the i-th key)."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "paper.md"), encoding="utf-8").read()
    section = text[text.index("## Settings of the paper's runs"):].split("\n## ")[0]
    tables, current = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None:
            current = {"header": cells, "rows": []}
            tables.append(current)
        elif not set(cells[0]) <= {"-"}:  # not the separator line
            current["rows"].append(dict(zip(current["header"], cells)))
    out = []
    for table in tables:
        rows = []
        for row in table["rows"]:
            keys = [k.strip().strip("`") for k in row["config key"].split(",")]
            for i, key in enumerate(keys):
                split = {c: v.split(",")[i].strip() if len(keys) > 1 else v for c, v in row.items()
                         if c in WORKFLOW_COLUMNS or c in ("task", "value")}
                rows.append({**split, "config key": key})
        out.append(rows)
    return out


def _leaf(config, key):
    value = config
    for part in key.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value.to_dict() if hasattr(value, "to_dict") else value


def test_docs_table_says_what_the_paper_configs_carry():
    import ast

    from atgrpo_jax.train.paper import paper_config

    main, per_workflow = _paper_tables()
    keys = {row["config key"] for row in main}
    assert {"rollout.top_p", "rollout.repetition_penalty", "rollout.eval_top_k", "optim.min_lr_ratio"} <= keys
    assert {"env.kwargs.params.rewards", "env.kwargs.output_match"} <= {row["config key"] for row in per_workflow}
    for preset in ("qwen3-1.7b", "qwen3-8b"):
        configs = {task: resolve(paper_config(task, preset), weights=False)  # as a run reads it (recipe paper)
                   for tasks in WORKFLOW_COLUMNS.values() for task in tasks}
        for row in main:
            for column, tasks in WORKFLOW_COLUMNS.items():
                for task in tasks:
                    value = _leaf(configs[task], row["config key"])
                    assert ast.literal_eval(row[column]) == value, (row["config key"], task, row[column], value)
        for row in per_workflow:
            value = _leaf(configs[row["task"]], row["config key"])
            assert ast.literal_eval(row["value"]) == value, (row["config key"], row["task"], row["value"], value)


def test_a_saved_config_keeps_the_keys_of_its_open_sections():
    """rollout.agents, algo.role_advantage and env.kwargs name things the user chose: a run's config.json
    with them reads back (resume, evaluate, export) as it was written."""
    import json

    from atgrpo_jax.train.config import base_config, from_saved

    c = base_config()
    c.rollout.agents = {"reasoner": {"max_new_tokens": 64}}
    c.algo.role_advantage = {"reasoner": "drgrpo"}
    c.env.kwargs = {"size": 5}
    back = from_saved(json.loads(c.to_json()))
    assert back.rollout.agents.reasoner.max_new_tokens == 64 and back.algo.role_advantage.reasoner == "drgrpo"
    assert back.env.kwargs.size == 5
