"""Workflows by name, for configs: `make_workflow(name, single_agent, **kwargs)`.

A name is one of:
- a registered workflow: `math`, `math_aggregation` (three roles: envs/math_aggregation.py), `code`,
  `prompt_reward` (a dataset of prompts scored by a reward function of yours), `plan_path_demo` (the
  CPU demo), `search` (search QA, envs/search_workflow.py),
  `mixture` (several of these in one run, envs/mixture.py), or one of yours
  (`@WORKFLOWS.register("my_task")` on a factory);
- `<game>_<kind>` for every game in envs/games.py and every kind of grid workflow:
  tool_plan (the paper's tool agent + plan agent) or direct (short direct actions for tiny
  models), e.g. `sokoban_tool_plan`;
- `"package.module:factory"`: any importable factory, so a task of your own needs no
  change to this package.
A factory is called as `factory(single_agent=..., **config.env.kwargs)` and returns an
object with the `Workflow` protocol of envs/workflow.py; `single_agent` picks its
one-agent variant (grid workflows: `env.kwargs.alone=ROLE` picks the one that trains that
role alone, grid_roles.SINGLE).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from atgrpo_jax.envs.code_workflow import code_roles, make_code_workflow
from atgrpo_jax.envs.episode import as_workflow
from atgrpo_jax.envs.games import GAMES
from atgrpo_jax.envs.grid_roles import single_kind
from atgrpo_jax.envs.grid_workflows import make_grid_workflow, plan_path_demo
from atgrpo_jax.envs.math_aggregation import aggregation_roles, make_math_aggregation
from atgrpo_jax.envs.math_workflow import make_math_workflow, math_roles
from atgrpo_jax.envs.mixture import MixtureWorkflow, check_settings, position_roles
from atgrpo_jax.envs.prompt_reward import PromptReward, make_prompt_reward
from atgrpo_jax.envs.search_workflow import make_search_workflow, search_roles
from atgrpo_jax.registry import Registry, closest, import_function, registered

WORKFLOWS: Registry = Registry("env.workflow")
GRID_KINDS = ("tool_plan", "direct")  # `<game>_<kind>`; single_agent picks `<kind>_single`


@WORKFLOWS.register("math")
def _math(single_agent: bool = False, recipe: str = "paper", **kwargs):
    return make_math_workflow(single_agent=single_agent, recipe=recipe, **kwargs)


@WORKFLOWS.register("math_aggregation")
def _math_aggregation(single_agent: bool = False, recipe: str = "paper", **kwargs):
    return make_math_aggregation(single_agent=single_agent, recipe=recipe, **kwargs)


@WORKFLOWS.register("code")
def _code(single_agent: bool = False, recipe: str = "paper", **kwargs):
    return make_code_workflow(single_agent=single_agent, recipe=recipe, **kwargs)


@WORKFLOWS.register("mixture")
def _mixture(single_agent: bool = False, recipe: str = "paper", weights=None, roles=(), **settings):
    """Several workflows in one run (envs/mixture.py), each built here with its env.kwargs.NAME."""
    if not weights:
        raise ValueError("env.kwargs.weights: a mixture names its workflows and how often each is drawn, e.g. "
                         "--config.env.kwargs.weights='{\"math\": 1, \"code\": 1}'")
    weights = dict(weights)
    check_settings(weights, settings)
    parts = {name: make_workflow(name, single_agent=single_agent, recipe=recipe, **dict(settings.get(name, {})))
             for name in weights}
    return MixtureWorkflow(parts, weights, tuple(roles))


@WORKFLOWS.register("search")
def _search(single_agent: bool = False, recipe: str = "paper", **kwargs):
    return make_search_workflow(single_agent=single_agent, recipe=recipe, **kwargs)


@WORKFLOWS.register("prompt_reward")
def _prompt_reward(single_agent: bool = False, **kwargs):
    return make_prompt_reward(single_agent=single_agent, **kwargs)


def _single(kind: str, single_agent: bool, alone: str) -> str:
    """The grid kind to build: `kind`, or with single_agent its variant that trains role `alone`."""

    if alone and not single_agent:
        raise ValueError(f"env.kwargs.alone={alone!r} trains one role in its single-agent environment: "
                         "it needs env.single_agent=True (regime=single_agent)")
    return single_kind(kind, alone) if single_agent else kind


@WORKFLOWS.register("plan_path_demo")
def _demo(single_agent: bool = False, alone: str = "", **kwargs):
    return plan_path_demo(_single("direct", single_agent, alone), **kwargs)


def _grid_factory(name: str) -> Callable[..., Any] | None:
    for kind in GRID_KINDS:
        game = name[:-len(kind) - 1] if name.endswith("_" + kind) else None
        if game in GAMES:
            def make(single_agent: bool = False, alone: str = "", recipe: str = "paper", **kwargs):
                return make_grid_workflow(_single(kind, single_agent, alone), game, recipe=recipe, **kwargs)
            return make
    return None


def known_names() -> list[str]:
    return sorted(WORKFLOWS.names()) + [f"{g}_{k}" for g in GAMES for k in GRID_KINDS]


def factory_of(name: str) -> Callable[..., Any]:
    """The factory a workflow name stands for; an unknown name is a ValueError naming the choices."""
    if name.startswith("py:"):  # a workflow object of the Python API (an Episode is made one)

        obj = registered(name, "env.workflow")
        return lambda single_agent=False, **kwargs: as_workflow(obj)
    if ":" in name:
        return import_function(name, "env.workflow")
    if name in WORKFLOWS:
        return WORKFLOWS[name]
    grid = _grid_factory(name)
    if grid is None:
        names = known_names()
        raise ValueError(f"env.workflow: unknown {name!r}{closest(name, names)}; known: {', '.join(names)}, "
                         "or 'package.module:factory'")
    return grid


def make_workflow(name: str, single_agent: bool = False, recipe: str = "paper", **kwargs):
    """The workflow `name` (see the module docstring) built with the factory's keyword arguments;
    an unknown keyword is a ValueError naming the factory's arguments. `recipe` (config.recipe)
    goes to the factories that name a `recipe` argument: the paper's workflows, whose switches
    follow it (docs/paper.md, "Recipes"); a workflow of yours without one has nothing to switch."""
    factory = factory_of(name)
    if "recipe" in inspect.signature(factory).parameters:
        kwargs["recipe"] = recipe
    try:
        return factory(single_agent=single_agent, **kwargs)
    except TypeError as e:
        if "unexpected keyword argument" not in str(e):
            raise
        raise ValueError(f"env.kwargs: {e} (workflow {name!r})") from None


def _mixture_roles(single_agent: bool = False, recipe: str = "paper", weights=None, roles=(), **settings):
    parts = {name: workflow_roles(name, single_agent, recipe, **dict(settings.get(name, {})))
             for name in dict(weights or {})}
    return position_roles(parts, roles) if parts else tuple(roles)


# The roles of the workflows that read data sets or files, known without them: what the planner counts on a
# machine where the data is not prepared. Every other workflow is built to be asked.
ROLES: dict[str, Callable[..., tuple[str, ...]]] = {
    "math": math_roles, "math_aggregation": aggregation_roles, "code": code_roles, "search": search_roles,
    "mixture": _mixture_roles,
    "prompt_reward": lambda single_agent=False, **_: PromptReward.roles[:1] if single_agent else PromptReward.roles,
}


def workflow_roles(name: str, single_agent: bool = False, recipe: str = "paper", **kwargs) -> tuple[str, ...]:
    """The role names (turn order) of the workflow `make_workflow(name, ...)` builds, without its data for the
    built-in workflows that read data; a workflow of yours is built (an error building it is raised)."""
    if name in ROLES:
        return tuple(ROLES[name](single_agent=single_agent, recipe=recipe, **kwargs))
    return tuple(a.name for a in make_workflow(name, single_agent, recipe, **kwargs).agents)
