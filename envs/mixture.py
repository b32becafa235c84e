"""Several workflows trained in one run (`env.workflow = "mixture"`), as PettingLLMs' mixed environment
trains math and code together.

`env.kwargs.weights = {NAME: WEIGHT}` names the workflows (any name `make_workflow` knows) and how
often each is drawn; `env.kwargs.NAME = {...}` holds a workflow's own keyword arguments. Every workflow
must have the same number of agents: the mixture's agent i is agent i of each (its role in the team:
a reasoner and a coder are both the first to answer), named by their names joined with "_" unless
`roles` names them, so one policy per role (`per_role`) learns that role in every task.

A training task's workflow is a function of its id (a draw by the weights, seeded by the id), so a run
resumes exactly. The state holds every workflow's state for all B tasks (each reset on all of them;
only the tasks drawn for it are prompted and stepped), so it has the [B] leading axis the rollout
slices, branches and selects. Evaluation runs each workflow's own splits, named `NAME/SPLIT`; `valid`
is the workflows' validation problems one after another (or, for generated tasks, drawn as training's).
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import numpy as np

from atgrpo_jax.envs.workflow import Agent, StepOut, branch

SEP = "/"  # a split of one workflow: "NAME/SPLIT"


def position_roles(part_roles: dict[str, Sequence[str]], roles: Sequence[str] = ()) -> tuple[str, ...]:
    """The mixture's role names: `roles`, else each position's names across the parts joined by "_"
    (math's reasoner and code's coder at position 0: "reasoner_coder")."""
    counts = {name: len(r) for name, r in part_roles.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"env.kwargs.weights: the workflows' agents are matched by position, so their "
                         f"numbers must agree; got {counts}")
    count = next(iter(counts.values()))
    if roles and len(roles) != count:
        raise ValueError(f"env.kwargs.roles: {count} names wanted (one per position), got {list(roles)}")
    return tuple(roles) or tuple("_".join(dict.fromkeys(r[i] for r in part_roles.values())) for i in range(count))


class MixtureWorkflow:
    def __init__(self, parts: dict[str, Any], weights: dict[str, float], roles: Sequence[str] = ()):
        if len(parts) < 2:
            raise ValueError(f"env.kwargs.weights: a mixture needs two workflows or more, got {list(parts)}")
        names = position_roles({name: [a.name for a in w.agents] for name, w in parts.items()}, roles)
        bad = {n: w for n, w in weights.items() if not (isinstance(w, (int, float)) and w > 0)}
        if bad:
            raise ValueError(f"env.kwargs.weights: every weight must be a number > 0, got {bad}")
        self.parts, self.names = parts, list(parts)
        self.cumulative = np.cumsum([float(weights[n]) for n in self.names]) / sum(map(float, weights.values()))
        self.agents = tuple(Agent(n, functools.partial(self._parse, i)) for i, n in enumerate(names))
        self.max_turns = max(w.max_turns for w in parts.values())
        self.name = "mixture_" + "_".join(self.names)
        self.test_splits = tuple(f"{n}{SEP}{s}" for n, w in parts.items() for s in w.test_splits)
        self.splits = {f"{n}{SEP}{s}": size for n, w in parts.items() for s, size in w.splits.items()}
        valid = [w.splits.get("valid", "none") for w in parts.values()]
        if "none" not in valid:
            self.splits["valid"] = None if None in valid else sum(valid)

    def _parse(self, agent: int, text: str):
        return self.parts[self.names[0]].agents[agent].parse(text)  # (what the rollout shows; steps parse their own)

    # ------------------------------------------------------------ which workflow a task is
    def kinds(self, task_ids: Sequence[int], split: str) -> np.ndarray:
        """[B] the index (in `names`) of each task's workflow."""
        if SEP in split:
            return np.full(len(task_ids), self.names.index(split.split(SEP)[0]))
        if split == "valid" and self.splits["valid"] is not None:
            sizes = np.cumsum([w.splits["valid"] for w in self.parts.values()])
            return np.searchsorted(sizes, np.asarray(task_ids), side="right")
        draws = np.array([np.random.default_rng([int(t)]).random() for t in task_ids])
        return np.searchsorted(self.cumulative, draws, side="right").clip(max=len(self.names) - 1)

    def _local(self, kind: int, task_ids, split: str) -> tuple[np.ndarray, str]:
        """(the task ids, the split) as workflow `kind` knows them."""
        if SEP in split:
            return np.asarray(task_ids), split.split(SEP, 1)[1]
        if split == "valid" and self.splits["valid"] is not None:
            before = sum(w.splits["valid"] for w in list(self.parts.values())[:kind])
            return np.clip(np.asarray(task_ids) - before, 0, None), split
        return np.asarray(task_ids), split

    # ------------------------------------------------------------ the protocol
    def reset(self, task_ids: Sequence[int], split: str) -> dict:
        kinds = self.kinds(task_ids, split)
        present = np.unique(kinds) if SEP in split or split == "valid" else range(len(self.names))
        state = {"kind": kinds}
        for k in present:  # every task in each workflow's state; only its own are used
            ids, local = self._local(k, task_ids, split)
            if local == "valid" and self.splits["valid"] is not None:
                ids = np.clip(ids, 0, self.parts[self.names[k]].splits["valid"] - 1)
            state[self.names[k]] = self.parts[self.names[k]].reset(ids, local)
        return state

    def _each(self, state):
        """(workflow, its name, the rows of its tasks) for every workflow with tasks in `state`."""
        kinds = np.asarray(state["kind"])
        kinds = kinds if kinds.ndim == 1 else kinds[:, 0]  # a branched state: [B, K]
        for k, name in enumerate(self.names):
            rows = np.flatnonzero(kinds == k)
            if len(rows):
                yield self.parts[name], name, rows

    def prompts(self, state, agent: int, turn: int) -> list:
        out = [None] * len(state["kind"])
        for w, name, rows in self._each(state):
            for r, p in zip(rows, w.prompts(_rows(state[name], rows), agent, turn)):
                out[r] = p
        return out

    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        b, k = len(state["kind"]), len(responses[0])
        out = {key: branch(value, k) for key, value in state.items()}
        local, team = np.zeros((b, k), np.float32), np.zeros((b, k), np.float32)
        parsed = np.full((b, k), "", object)
        for w, name, rows in self._each(state):
            s = w.step(_rows(state[name], rows), agent, turn, [responses[r] for r in rows])
            out[name] = jax.tree.map(lambda full, part: _put(full, rows, part), out[name], s.state)
            local[rows], team[rows] = s.local_reward, s.team_reward
            if s.parsed_as is not None:
                parsed[rows] = s.parsed_as
        return StepOut(out, local, team, parsed)

    def done(self, state) -> np.ndarray:
        return self._gather(state, lambda w, s: w.done(s), False)

    def success(self, state) -> np.ndarray:
        return self._gather(state, lambda w, s: w.success(s), False)

    def _gather(self, state, fn, fill) -> np.ndarray:
        out = np.full(np.shape(state["kind"]), fill)
        for w, name, rows in self._each(state):
            out[rows] = np.asarray(fn(w, _rows(state[name], rows)))
        return out


def _rows(tree, rows: np.ndarray):
    return jax.tree.map(lambda x: x[rows], tree)


def _put(full, rows: np.ndarray, part):
    """`full` with its `rows` replaced by `part` (a NumPy copy; JAX arrays come back as NumPy)."""
    full = np.array(full, copy=True)
    full[rows] = np.asarray(part)
    return full


def check_settings(weights: dict, settings: dict) -> None:
    """Every workflow's own arguments (env.kwargs.NAME) name a workflow of the mixture."""
    stray = sorted(set(settings) - set(weights))
    if stray:
        raise ValueError(f"env.kwargs: {stray} are not workflows of the mixture ({sorted(weights)}); a workflow's "
                         "own arguments go under env.kwargs.NAME")
