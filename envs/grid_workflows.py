"""Workflows for the grid games (Plan-Path, Sokoban, Sudoku); contract in `workflow.py`.

Four workflows over one base (`make_grid_workflow(kind, game)`):

- "tool_plan" (the paper's): a **tool** agent writes one Python block that
  prints `**Actions List**: [...]`; the block runs in the sandbox (stdin = the
  rendered grid) and the printed list is simulated on a copy of the state.
  Tool local reward = that simulated step reward, `tool_penalty` (-2) when no
  list parses (no code block, crash before printing, malformed or empty list); its team
  reward is 0 because the environment does not move. Then a **plan** agent sees
  the code, its output and the parsed actions, and ends with a line
  `#### [actions]` (the last `####` line outside code blocks; the list may also
  be on the next non-blank line). Those actions step the real environment:
  plan local reward = `plan_scale` (2) x step reward, `plan_penalty` (-2) when
  the answer is missing, unparsable or empty; team reward = step reward.
- "tool_plan_single": one **solver** agent with the plan agent's format and rewards.
- "direct" (for a tiny model trained from scratch with a character tokenizer):
  a **planner** proposes 1..`plan_len` moves (letters UDLR; Sudoku: one
  placement "rcd"), simulated on a copy for its local reward; an **executor**
  sees the proposal and answers 1..`exec_len` moves that are applied (local =
  team = step reward; letters may be lower case or spaced). Any other answer
  gets `format_penalty` (-1) and changes nothing. Prompts are one short line of
  printable ASCII, the grid as rows joined by '/'.
- "direct_single": one **actor** with the executor's format and rewards.

A "step reward" is the sum of the game's per-move rewards over the answer's
actions (cut to `game.max_actions`). Turns after the environment is done get
zero rewards and no sandbox runs. State: the game state (JAX arrays) plus NumPy
object arrays of text (history of earlier turns, this turn's hand-over).
`reset(task_ids, split)`: task i is the level drawn from key
fold_in(PRNGKey(seed), i), restricted to the split's level-hash buckets
(`grid` module), so a train level is never a test level.

Demo (`plan_path_demo()`): 6x6 Plan-Path, walls 0.22, start-goal BFS distance 2..8,
4 turns, executor <= 2 moves per turn. A uniformly random executor (1..2 random
moves per turn) succeeds on about 7% of training levels (measured with the
reference stepper over 2000 levels in tests/envs/test_grid_workflows.py; the
test asserts < 20%).
"""
from __future__ import annotations

import dataclasses
import re
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid, plan_path, sudoku
from atgrpo_jax.envs.grid_tasks import GridGame, make_game
from atgrpo_jax.envs.workflow import Agent, Messages, StepOut, branch

KINDS = ("tool_plan", "tool_plan_single", "direct", "direct_single")
ACTIONS_MARKER = "**Actions List**:"
_HISTORY_CHARS = 1500


class GridState(NamedTuple):
    env: Any  # game State; leaves [B] (or [B, K] after a step)
    history: np.ndarray  # object str: one line per earlier turn
    handoff: np.ndarray  # object str: what this turn's first agent passed on


@dataclasses.dataclass
class WorkflowConfig:
    max_turns: int = 4
    seed: int = 0
    tool_penalty: float = -2.0
    plan_penalty: float = -2.0
    plan_scale: float = 2.0
    format_penalty: float = -1.0
    plan_len: int = 4
    exec_len: int = 2
    sandbox_limits: Any = None  # sandbox.Limits; None = its defaults (20 s wall clock)
    sandbox_workers: int | None = None
    view: str = "grid"  # direct prompts: "grid" (rows joined by '/') or "local" (Plan-Path only)
    lenient: bool = False  # direct answers: the UDLR letters among the first max_len characters


def actions_from_output(stdout: str, game: GridGame) -> list[int] | None:
    """Actions from the last `**Actions List**:` line a program printed."""
    if not isinstance(stdout, str):
        return None
    at = stdout.rfind(ACTIONS_MARKER)
    if at < 0:
        at = stdout.rfind("Actions List:")
        if at < 0:
            return None
    return game.parse_list(stdout[at:].split(":", 1)[1][:20_000])


def actions_from_answer(text: str, game: GridGame) -> list[int] | None:
    """Actions after the last `####` line outside code blocks (None if absent or empty)."""
    from atgrpo_jax.envs.parsers import extract_after_marker

    rest = extract_after_marker(text, "####")
    actions = game.parse_list(rest) if rest is not None else None
    return actions or None


def _texts(shape, value: str = "") -> np.ndarray:
    out = np.empty(shape, dtype=object)
    out.fill(value)
    return out


def _clip(text: str, limit: int, keep: str = "head") -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + "\n...(truncated)" if keep == "head" else "(truncated)...\n" + text[-limit:]


class GridWorkflow:
    """A grid game played by the agents of one workflow kind (see the module docstring)."""

    def __init__(self, kind: str, game: GridGame | str = "plan_path", config: WorkflowConfig | None = None):
        if kind not in KINDS:
            raise ValueError(f"unknown grid workflow {kind!r}; choose from {KINDS}")
        self.kind = kind
        self.game = make_game(game) if isinstance(game, str) else game
        self.config = config or WorkflowConfig()
        if self.config.view not in ("grid", "local") or (self.config.view == "local" and self.game.name != "plan_path"):
            raise ValueError(f"view must be 'grid', or 'local' for plan_path; got {self.config.view!r} "
                             f"for {self.game.name}")
        self.max_turns = self.config.max_turns
        self.name = f"{self.game.name}_{kind}"
        roles = {"tool_plan": ("tool", "plan"), "tool_plan_single": ("solver",),
                 "direct": ("planner", "executor"), "direct_single": ("actor",)}[kind]
        self.agents = tuple(Agent(role, self._parser(role)) for role in roles)
        limits = {"max_turns": 10_000, "plan_len": self.game.max_actions, "exec_len": self.game.max_actions}
        for key, top in limits.items():
            value = getattr(self.config, key)
            if not 1 <= value <= top:
                raise ValueError(f"grid workflow config: {key}={value} must be in 1..{top}")
        self._compile()

    # ------------------------------------------------------------ jitted pieces

    def _compile(self) -> None:
        self._reset, self._step = _compiled(self.game, self.config.seed)

    def compiled_step_count(self) -> int:
        """Compiled variants of the branch step (tests check it stays at one per B, K)."""
        return self._step._cache_size()

    # ------------------------------------------------------------ protocol

    def reset(self, task_ids: Sequence[int], split: str) -> GridState:
        if split not in self._reset:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        ids = np.asarray(list(task_ids))
        ok = ids.ndim == 1 and ids.size > 0 and np.issubdtype(ids.dtype, np.integer)
        if not ok or ids.min() < 0 or ids.max() >= 2**32:
            raise ValueError("task_ids must be a non-empty 1-D sequence of integers in [0, 2**32)")
        ids = jnp.asarray(ids.astype(np.uint32))
        env = self._reset[split](ids)
        return GridState(env, _texts(len(ids)), _texts(len(ids)))

    def done(self, state: GridState) -> np.ndarray:
        return np.asarray(state.env.done)

    def success(self, state: GridState) -> np.ndarray:
        return np.asarray(state.env.success)

    def prompts(self, state: GridState, agent: int, turn: int) -> list[Messages]:
        role = self.agents[agent].name
        envs = jax.device_get(state.env)
        out = []
        for b in range(len(state.history)):
            env_b = jax.tree.map(lambda x: x[b], envs)
            out.append(self._prompt(role, env_b, str(state.history[b]), str(state.handoff[b]), turn))
        return out

    def step(self, state: GridState, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        role = self.agents[agent].name
        n_tasks = len(state.history)
        if len(responses) != n_tasks or len({len(r) for r in responses}) != 1:
            raise ValueError("responses must be [B][K] with the state's B tasks")
        k = len(responses[0])
        active = ~self.done(state)
        texts = [[r if isinstance(r, str) else "" for r in row] for row in responses]
        history, handoff = branch(state.history, k), _texts((n_tasks, k))
        if role == "tool":
            actions, handoff = self._run_tools(state, texts, active)
            penalty, applies = self.config.tool_penalty, False
        elif role == "planner":
            actions = [[self._parse_direct(t, self.config.plan_len) for t in row] for row in texts]
            penalty, applies = self.config.format_penalty, False
            for b in range(n_tasks):
                for j in range(k):
                    handoff[b, j] = self._short(actions[b][j])
        elif role in ("executor", "actor"):
            actions = [[self._parse_direct(t, self.config.exec_len) for t in row] for row in texts]
            penalty, applies = self.config.format_penalty, True
        else:  # plan, solver
            actions = [[actions_from_answer(t, self.game) for t in row] for row in texts]
            penalty, applies = self.config.plan_penalty, True

        parsed = np.array([[a is not None and len(a) > 0 for a in row] for row in actions]) & active[:, None]
        rows = [a if (a and active[b]) else None for b, row in enumerate(actions) for a in row]
        padded = grid.pad_actions(rows, self.game.max_actions).reshape(n_tasks, k, -1)
        new_env, reward, done, success = self._step(state.env, jnp.asarray(padded))
        reward = np.asarray(reward, np.float32) * parsed
        scale = self.config.plan_scale if role in ("plan", "solver") else 1.0
        local = np.where(parsed, scale * reward, np.float32(penalty)) * active[:, None]
        if applies:
            team = reward
            for b in range(n_tasks):
                for j in range(k):
                    if active[b]:
                        shown = self.game.show_actions(actions[b][j]) if actions[b][j] else "nothing (unparsed)"
                        line = f"Turn {turn + 1}: played {shown}, reward {reward[b, j]:+.2f}\n"
                        history[b, j] = _clip(history[b, j] + line, _HISTORY_CHARS, keep="tail")
        else:  # proposals are only simulated: the environment stays as it was
            new_env, team = branch(state.env, k), np.zeros_like(reward)
            done, success = branch(state.env.done, k), branch(state.env.success, k)
        return StepOut(
            state=GridState(new_env, history, handoff),
            local_reward=local.astype(np.float32),
            team_reward=team.astype(np.float32),
            done=np.asarray(done),
            success=np.asarray(success),
            info={"parsed": parsed},
        )

    # ------------------------------------------------------------ pieces

    def _parser(self, role: str):
        if role in ("plan", "solver"):
            return lambda text: actions_from_answer(text, self.game)
        if role == "tool":
            from atgrpo_jax.envs.parsers import extract_code_block

            return extract_code_block
        length = self.config.plan_len if role == "planner" else self.config.exec_len
        return lambda text: self._parse_direct(text, length)

    def _parse_direct(self, text: str, max_len: int) -> list[int] | None:
        """Strict: exactly 1..max_len move letters. Lenient (a model learning from
        scratch): the move letters among the first max_len characters, if any."""
        if not self.config.lenient or self.game.name == "sudoku":
            return self.game.parse_direct(text, max_len)
        if not isinstance(text, str):
            return None
        moves = [grid.LETTERS.index(ch) for ch in text[:max_len] if ch in grid.LETTERS[:4]]
        return moves or None

    def _run_tools(self, state: GridState, texts, active):
        """Extract, run (sandbox) and parse the tool agent's programs."""
        from atgrpo_jax.envs.parsers import extract_code_block
        from atgrpo_jax.envs.sandbox import run_many

        n_tasks, k = len(texts), len(texts[0])
        envs = jax.device_get(state.env)
        grids = [self.game.render(jax.tree.map(lambda x: x[b], envs)) for b in range(n_tasks)]
        codes = [[extract_code_block(t) if active[b] else None for t in row] for b, row in enumerate(texts)]
        jobs = [(b, j) for b in range(n_tasks) for j in range(k) if codes[b][j]]
        results = run_many([codes[b][j] for b, j in jobs], [grids[b] for b, _ in jobs],
                           self.config.sandbox_limits, self.config.sandbox_workers)
        actions = [[None] * k for _ in range(n_tasks)]
        handoff = _texts((n_tasks, k), "The tool agent wrote no Python code block.")
        for (b, j), res in zip(jobs, results):
            actions[b][j] = actions_from_output(res.stdout, self.game)
            output = _clip(res.stdout, 1500, keep="tail") or "(no output)"
            if not res.ok:
                why = "timed out" if res.timed_out else f"exit code {res.exit_code}"
                output += f"\n[{why}] {_clip(res.stderr_tail, 400, keep='tail')}"
            handoff[b, j] = (f"The tool agent's code:\n```python\n{_clip(codes[b][j], 3000)}\n```\n"
                             f"Its output:\n```\n{output}\n```\n"
                             f"Actions parsed from it: {self.game.show_actions(actions[b][j])}")
        return actions, handoff

    def _prompt(self, role: str, env, history: str, handoff: str, turn: int) -> Messages:
        game = self.game
        if role in ("planner", "executor", "actor"):
            return [{"role": "user", "content": self._direct_prompt(role, env, handoff, history)}]
        board = f"Current state:\n```\n{game.render(env)}\n```\n{game.status(env)}\n"
        past = f"Earlier turns:\n{history}" if history else ""
        if role == "tool":
            example = "[[0, 1, 3], [2, 2, 4]]" if game.name == "sudoku" else '["U", "R", "D", "L"]'
            system = ("You are the tool agent of a two-agent team. You solve puzzles by writing Python "
                      "code; a plan agent checks your result and makes the final move.")
            ask = (f"Write one Python program in a ```python block that computes a solution (for example "
                   f"with BFS or A*) and prints it as {game.answer_format()} on one line:\n"
                   f"{ACTIONS_MARKER} {example}\nThe state above is also given on standard input. "
                   "If you cannot solve it completely, print a short sequence that makes progress.")
            return [{"role": "system", "content": system},
                    {"role": "user", "content": f"{game.rules()}\n\n{board}{past}\n{ask}"}]
        example = "#### [[0, 1, 3], [2, 2, 4]]" if game.name == "sudoku" else '#### ["U", "R", "D"]'
        if role == "plan":
            system = ("You are the plan agent of a two-agent team. A tool agent wrote code for the task; "
                      "check its actions against the state, correct them if needed, and give the final actions.")
            body = f"{handoff}\n\n"
        else:
            system = "You solve grid puzzles step by step."
            body = ""
        ask = (f"Reason briefly, then end your answer with one line holding {game.answer_format()}:\n"
               f"{example}\nThese actions are applied from the current state.")
        return [{"role": "system", "content": system},
                {"role": "user", "content": f"{game.rules()}\n\n{board}{past}\n{body}{ask}"}]

    def _short(self, actions: list[int] | None) -> str:
        """A direct answer as the model writes it ('?' when nothing parsed)."""
        if not actions:
            return "?"
        if self.game.name == "sudoku":
            return "".join(str(x) for x in sudoku.decode(actions[0]))
        return grid.letters_of(actions)

    def _direct_prompt(self, role: str, env, proposal: str, history: str = "") -> str:
        if self.config.view == "local":
            return _local_view(env, history) + (f" P:{proposal or '?'}" if role == "executor" else "")
        rows = self.game.render(env, row_sep="/")
        title = {"plan_path": "Path S to G, # wall", "sokoban": "Sokoban", "sudoku": "Sudoku"}[self.game.name]
        if self.game.name == "sudoku":
            want = "1 move rcd"
        else:
            n = self.config.plan_len if role == "planner" else self.config.exec_len
            want = f"1-{n} moves UDLR"
        if role == "executor":
            return f"{title}. {rows} Plan:{proposal or '?'} Act, {want}:"
        return f"{title}. {rows} {'Plan' if role == 'planner' else 'Act'}, {want}:"


@functools.lru_cache(maxsize=None)
def _compiled(game: GridGame, seed: int):
    """Jitted reset (per split) and branch step, shared by workflows of the same game."""
    module, params = game.module, game.params
    base = jax.random.PRNGKey(seed)

    def make_reset(holdout):
        def reset_one(task_id):
            return module.reset(jax.random.fold_in(base, task_id), params, holdout)

        return jax.jit(jax.vmap(reset_one))

    def branch_step(env, actions):  # env leaves [B]; actions [B, K, L]
        per_task = lambda e, acts: jax.vmap(lambda a: module.step(e, a, params))(acts)  # noqa: E731
        new, reward, done, _ = jax.vmap(per_task)(env, actions)
        return new, reward, done, new.success

    return {"train": make_reset(False), "test": make_reset(True)}, jax.jit(branch_step)


def _local_view(env, history: str = "") -> str:
    """Plan-Path seen from the agent: goal offset, the four neighbours, the last move.

    'G+0-1 U# D. LG R. >R' = the goal is 1 column left; up is a wall or the
    edge, down and right are free, left is the goal; the last move played was
    R ('-' before the first).
    """
    walls, (r, c), (gr, gc) = np.asarray(env.walls), np.asarray(env.pos).tolist(), np.asarray(env.goal).tolist()
    h, w = walls.shape

    def cell(dr, dc):
        y, x = r + dr, c + dc
        if not (0 <= y < h and 0 <= x < w) or walls[y, x]:
            return "#"
        return "G" if (y, x) == (gr, gc) else "."

    near = " ".join(f"{name}{cell(dr, dc)}" for name, (dr, dc) in zip("UDLR", ((-1, 0), (1, 0), (0, -1), (0, 1))))
    played = re.findall(r'"([UDLR])"', history.strip().splitlines()[-1]) if history.strip() else []
    return f"G{gr - r:+d}{gc - c:+d} {near} >{played[-1] if played else '-'}"


def make_grid_workflow(kind: str, game: GridGame | str = "plan_path", params: Any = None,
                       max_actions: int | None = None, **config) -> GridWorkflow:
    """A grid workflow of `kind` (one of KINDS); game params and WorkflowConfig fields as keywords."""
    if isinstance(game, str):
        game = make_game(game, params, max_actions)
    elif params is not None or max_actions is not None:
        raise ValueError("pass params/max_actions either in the GridGame or as keywords, not both")
    return GridWorkflow(kind, game, WorkflowConfig(**config))


DEMO_PARAMS = plan_path.Params(height=6, width=6, wall_prob=0.22, min_distance=2, max_distance=8)


def plan_path_demo(kind: str = "direct", params: plan_path.Params = DEMO_PARAMS, **config) -> GridWorkflow:
    """The CPU demo: small Plan-Path for a tiny model (see the module docstring)."""
    config = {"max_turns": 4, "plan_len": 4, "exec_len": 2, **config}
    return make_grid_workflow(kind, make_game("plan_path", params, max_actions=8), **config)
