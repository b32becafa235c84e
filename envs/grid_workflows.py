"""Workflows for the grid games (envs/games.py); contract in `workflow.py`.

Four workflows over one base (`make_grid_workflow(kind, game)`), their roles in `KINDS`:

- "tool_plan" (the paper's): a **tool** agent writes one Python block that
  prints `**Actions List**: [...]`; the block runs in the sandbox (stdin = the
  rendered grid) and the printed list is simulated on a copy of the state.
  Then a **plan** agent sees the code, its output and the parsed actions, and
  ends with a line `#### [actions]` (the last `####` line outside code blocks;
  the list may also be on the next non-blank line). Those actions step the
  real environment.
- "tool_plan_single": one **solver** agent with the plan agent's format and rewards.
- "direct" (for a tiny model trained from scratch with a character tokenizer):
  a **planner** proposes 1..`plan_len` moves (letters UDLR; Sudoku: one
  placement "rcd"), simulated on a copy; an **executor** sees the proposal and
  answers 1..`exec_len` moves that are applied (letters may be lower case or
  spaced). Prompts are one short line of printable ASCII, the grid as rows
  joined by '/' (or, for Plan-Path with view="local", the agent's surroundings).
- "direct_single": one **actor** with the executor's format and rewards.
- "tool_single" / "planner_single": the tool agent / the planner alone, its
  actions stepping the environment (the paper's ablation trains a role in its
  single-agent environment, then combines the roles at evaluation). `SINGLE`
  maps (kind, role) to the single-agent kind that trains that role alone.

Roles, their rewards and the answer parsers: `grid_roles.py`. State: the game state (JAX arrays) plus NumPy
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
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid, plan_path
from atgrpo_jax.envs.games import GridGame, make_game
from atgrpo_jax.envs.grid_roles import (ACTIONS_MARKER, DEFAULT_TOOL_PENALTY, FORMAT_PENALTY, KINDS, MAX_TURNS,
                                        NO_MOVE, UNCUT_MAX_ACTIONS, FormatError, Role, WorkflowConfig,
                                        actions_from_answer, actions_from_output, make_roles, reference_tool_actions)
from atgrpo_jax.envs.parsers import extract_code_block, reference_program
from atgrpo_jax.envs.prompt_templates import Prompts
from atgrpo_jax.envs.sandbox import run_many
from atgrpo_jax.envs.workflow import Agent, StepOut, branch

# How much text goes into prompts (characters)
_HISTORY_CHARS = 1500  # the earlier turns' lines (the newest kept)
_OUTPUT_CHARS = 1500  # a tool program's standard output (its tail)
_STDERR_CHARS = 400  # a failed program's standard error (its tail)
_CODE_CHARS = 3000  # the tool agent's program as the plan agent sees it


class GridState(NamedTuple):
    env: Any  # game State; leaves [B] (or [B, K] after a step)
    history: np.ndarray  # object str: one line per earlier turn
    handoff: np.ndarray  # object str: what this turn's first agent passed on
    last_reward: np.ndarray  # float32: the environment's reward of its latest real step (0 before the first)
    last_move: np.ndarray  # object str: the last move of the latest real step, a letter ('-': none)
    pending: np.ndarray  # object str: with handoff_next_turn, what the first agent passed on this turn, shown next turn


def _texts(shape, value: str = "") -> np.ndarray:
    out = np.empty(shape, dtype=object)
    out.fill(value)
    return out


def _last_move(actions: list[int] | None) -> str:
    """The letter of the last move among the actions (codes outside U, D, L, R are skipped), or NO_MOVE."""
    moves = [a for a in actions or () if 0 <= a < len(grid.LETTERS)]
    return grid.LETTERS[moves[-1]] if moves else NO_MOVE


def _clip(text: str, limit: int, keep: str = "head") -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + "\n...(truncated)" if keep == "head" else "(truncated)...\n" + text[-limit:]


class GridWorkflow:
    """A grid game played by the agents of one workflow kind (see the module docstring)."""

    def __init__(self, kind: str, game: GridGame | str = "plan_path", config: WorkflowConfig | None = None):
        if kind not in KINDS:
            raise ValueError(f"unknown grid workflow {kind!r}; choose from {tuple(KINDS)}")
        self.kind = kind
        self.game = make_game(game) if isinstance(game, str) else game
        self.config = config or WorkflowConfig()
        if self.config.tool_penalty is None:
            default = float(getattr(self.game.module, "TOOL_PENALTY", DEFAULT_TOOL_PENALTY))
            self.config = dataclasses.replace(self.config, tool_penalty=default)
        local_ok = hasattr(self.game.module, "local_view")
        if self.config.view not in ("grid", "local") or (self.config.view == "local" and not local_ok):
            raise ValueError(f"view must be 'grid', or 'local' for a game with a local view (plan_path); got "
                             f"{self.config.view!r} for {self.game.name}")
        self.max_turns = self.config.max_turns
        self.name = f"{self.game.name}_{kind}"
        self.splits = {"valid": None, "test": None}  # generated levels: as many as asked for
        self.test_splits = ("test",)
        c = self.config
        for key, value, top in (("max_turns", c.max_turns, MAX_TURNS), ("plan_len", c.plan_len, self.game.max_actions),
                                ("exec_len", c.exec_len, self.game.max_actions)):
            if not 1 <= value <= top:
                raise ValueError(f"grid workflow config: {key}={value} must be in 1..{top}")
        roles = make_roles(c)
        self.templates = Prompts("grid", c.prompt_dir)
        self.roles = tuple(roles[name] for name in KINDS[kind])
        self.agents = tuple(Agent(name, functools.partial(self._parse, roles[name])) for name in KINDS[kind])
        # the game whose max_actions cuts a parsed answer: with uncut_answers none is cut, and the step plays
        # an answer longer than game.max_actions in pieces of that length
        self.parse_game = dataclasses.replace(self.game, max_actions=UNCUT_MAX_ACTIONS) if c.uncut_answers \
            else self.game
        self._reset, self._step, self._step_more = _compiled(self.game, self.config.seed)

    def compiled_step_count(self) -> int:
        """Compiled variants of the branch step (tests check it stays at one per B, K)."""
        return self._step._cache_size()

    # ------------------------------------------------------------ protocol

    def reset(self, task_ids: Sequence[int], split: str) -> GridState:
        if split not in self._reset:
            raise ValueError(f"split must be one of {tuple(self._reset)}, got {split!r}")
        ids = np.asarray(list(task_ids))
        ok = ids.ndim == 1 and ids.size > 0 and np.issubdtype(ids.dtype, np.integer)
        if not ok or ids.min() < 0 or ids.max() >= 2**32:
            raise ValueError("task_ids must be a non-empty 1-D sequence of integers in [0, 2**32)")
        env = self._reset[split](jnp.asarray(ids.astype(np.uint32)))
        return GridState(env, _texts(len(ids)), _texts(len(ids)), np.zeros(len(ids), np.float32),
                         _texts(len(ids), NO_MOVE), _texts(len(ids)))

    def done(self, state: GridState) -> np.ndarray:
        return np.asarray(state.env.done)

    def success(self, state: GridState) -> np.ndarray:
        if self.config.done_is_success:  # the reference's: any end, a step-limit timeout too
            return np.asarray(state.env.success) | np.asarray(state.env.done)
        return np.asarray(state.env.success)

    def prompts(self, state: GridState, agent: int, turn: int) -> list:
        role = self.roles[agent]
        handoff_shown = agent > 0  # what this turn's earlier agent passed on (a proposal, a program's result)
        envs = jax.device_get(state.env)
        out = []
        for b in range(len(state.history)):
            env_b = jax.tree.map(lambda x: x[b], envs)
            history, handoff = str(state.history[b]), str(state.handoff[b]) if handoff_shown else ""
            if role.answer == "direct":
                content = self._direct_prompt(role, env_b, handoff, str(state.last_move[b]), handoff_shown)
                out.append([{"role": "user", "content": content}])
            else:
                out.append(self._long_prompt(role, env_b, history, handoff))
        return out

    def step(self, state: GridState, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        role = self.roles[agent]
        n_tasks = len(state.history)
        if len(responses) != n_tasks or len({len(r) for r in responses}) != 1:
            raise ValueError("responses must be [B][K] with the state's B tasks")
        k = len(responses[0])
        active = ~self.done(state)
        texts = [[r if isinstance(r, str) else "" for r in row] for row in responses]
        history, handoff = branch(state.history, k), _texts((n_tasks, k))
        if role.answer == "code":
            actions, handoff, why = self._run_tools(state, texts, active)
        else:
            actions = [[self._parse(role, t) for t in row] for row in texts]
            why = _texts((n_tasks, k), "unparsed: no '#### [actions]' line" if role.answer == "list" else
                         f"unparsed: not {self.game.module.direct_format(role.max_len)}")
            if role.answer == "direct" and not role.moves_env:  # a proposal the next agent sees
                for b in range(n_tasks):
                    for j in range(k):
                        handoff[b, j] = self.game.module.short(actions[b][j]) if actions[b][j] else "?"

        format_error = np.array([[isinstance(a, FormatError) for a in row] for row in actions]) & active[:, None]
        actions = [[None if isinstance(a, FormatError) else a for a in row] for row in actions]
        parsed = np.array([[a is not None and len(a) > 0 for a in row] for row in actions]) & active[:, None]
        parsed_as = _texts((n_tasks, k))
        for b, j in zip(*np.nonzero(active[:, None].repeat(k, 1))):
            parsed_as[b, j] = self.game.show_actions(actions[b][j]) if parsed[b, j] else why[b, j]
        rows = [a if (a and active[b]) else None for b, row in enumerate(actions) for a in row]
        new_env, reward = self._play(state.env, rows, n_tasks, k)
        # a list the game's step cannot read moves nothing and that step's reward is FORMAT_PENALTY (docs/paper.md,
        # "Recipes", row 3a): the team reward of a role that steps the environment; its local reward is set below
        reward = np.where(format_error, np.float32(FORMAT_PENALTY), reward * parsed)
        penalty = np.float32(role.penalty)
        if role.answer == "code":  # an empty printed list [] is an answer (no moves), not a format error
            empty = np.array([[a is not None and len(a) == 0 for a in row] for row in actions]) & active[:, None]
            penalty = np.where(empty, np.float32(self.config.tool_empty_reward), penalty)
            parsed_as[empty] = "an empty action list []"
        penalty = np.where(format_error, np.float32(FORMAT_PENALTY), penalty)
        for b, j in zip(*np.nonzero(format_error)):
            parsed_as[b, j] = "unparsed: a list the game cannot read as actions"
        local = np.where(parsed, reward, penalty) * active[:, None]
        last_move = branch(state.last_move, k)
        if role.moves_env:
            team, last_reward = reward, reward
            for b in range(n_tasks):
                for j in range(k):
                    if active[b]:
                        shown = self.game.show_actions(actions[b][j]) if actions[b][j] else "nothing (unparsed)"
                        line = f"Turn {turn + 1}: played {shown}, reward {reward[b, j]:+.2f}\n"
                        history[b, j] = _clip(history[b, j] + line, _HISTORY_CHARS, keep="tail")
                        last_move[b, j] = _last_move(actions[b][j])
        else:  # proposals are only simulated: the environment stays as it was
            new_env, last_reward = branch(state.env, k), branch(state.last_reward, k)
            team = last_reward * active[:, None]
        pending = branch(state.pending, k)
        if self.config.handoff_next_turn and agent == 0:  # every prompt is rendered at the turn's start: the
            handoff, pending = pending, handoff  # next agent sees what this one passed on a turn ago
        return StepOut(state=GridState(new_env, history, handoff, last_reward, last_move, pending),
                       local_reward=local.astype(np.float32),
                       team_reward=team.astype(np.float32), parsed_as=parsed_as)

    def _play(self, env, rows: list, n_tasks: int, k: int):
        """Step every branch's actions (rows [B*K], None: no move) -> (env [B, K], summed reward [B, K]); an
        answer longer than game.max_actions (uncut_answers) is played in pieces of that length."""
        length = self.game.max_actions
        pieces = max(1, -(-max((len(r) for r in rows if r), default=0) // length))
        padded = grid.pad_actions(rows, pieces * length).reshape(n_tasks, k, pieces, length)
        new_env, reward = self._step(env, jnp.asarray(padded[:, :, 0]))
        for piece in range(1, pieces):
            new_env, more = self._step_more(new_env, jnp.asarray(padded[:, :, piece]))
            reward = reward + more
        return new_env, np.asarray(reward, np.float32)

    # ------------------------------------------------------------ answers

    def _parse(self, role: Role, text: str) -> Any:
        """A role's answer -> action codes (None when nothing parses); the tool's -> its code block."""
        if role.answer == "list":
            return actions_from_answer(text, self.parse_game, self.config.strict_answer, self.config.format_errors)
        if role.answer == "code":

            return extract_code_block(text)
        return self._parse_direct(text, role.max_len)

    def _parse_direct(self, text: str, max_len: int) -> list[int] | None:
        """Strict: the game's direct format. Lenient (a model learning from scratch; games with
        `parse_lenient`): e.g. the move letters among the first max_len characters, if any."""
        lenient = getattr(self.game.module, "parse_lenient", None)
        if not self.config.lenient or lenient is None:
            return self.game.parse_direct(text, max_len)
        return lenient(text, max_len) if isinstance(text, str) else None

    def _run_tools(self, state: GridState, texts, active):
        """Extract, run (sandbox) and parse the tool agent's programs."""

        n_tasks, k = len(texts), len(texts[0])
        envs = jax.device_get(state.env)
        grids = ["" if self.config.blind_program else self._board(jax.tree.map(lambda x: x[b], envs))
                 for b in range(n_tasks)]
        extract = (lambda t: reference_program(t, unclosed_blocks=True)) if self.config.whole_reply_program \
            else extract_code_block
        codes = [[extract(t) if active[b] else None for t in row] for b, row in enumerate(texts)]
        jobs = [(b, j) for b in range(n_tasks) for j in range(k) if codes[b][j]]
        results = run_many([codes[b][j] for b, j in jobs], [grids[b] for b, _ in jobs],
                           self.config.sandbox_limits, self.config.sandbox_workers)
        actions = [[None] * k for _ in range(n_tasks)]
        handoff = _texts((n_tasks, k), self.templates.render("handoff.j2", code=None, output="", actions=""))
        reasons = _texts((n_tasks, k), "unparsed: no ```python block")
        for (b, j), res in zip(jobs, results):
            read = reference_tool_actions if self.config.reference_tool_output else actions_from_output
            text = res.as_reference_reports if self.config.reference_tool_output else res.stdout
            actions[b][j] = read(text, self.parse_game, self.config.format_errors)
            reasons[b, j] = ("unparsed: the program " + ("timed out" if res.timed_out else "failed") if not res.ok
                         else "unparsed: no '**Actions List**: [...]' line in the program's output")
            output = _clip(res.stdout, _OUTPUT_CHARS, keep="tail") or "(no output)"
            if not res.ok:
                why = "timed out" if res.timed_out else f"exit code {res.exit_code}"
                output += f"\n[{why}] {_clip(res.stderr_tail, _STDERR_CHARS, keep='tail')}"
            got = actions[b][j]  # a format error is shown as the list the program printed
            shown = repr(got.items) if isinstance(got, FormatError) else self.game.show_actions(got)
            handoff[b, j] = self.templates.render("handoff.j2", code=_clip(codes[b][j], _CODE_CHARS), output=output,
                                                  actions=shown)
        return actions, handoff, reasons

    # ------------------------------------------------------------ prompts

    def _static(self) -> bool:
        return self.config.static_observation and hasattr(self.game.module, "static_view")

    def _board(self, env) -> str:
        """What a program reads on its standard input: the state, or with static_observation the static view."""
        return self.game.module.static_view(env) if self._static() else self.game.render(env)

    def _long_prompt(self, role: Role, env, history: str, handoff: str) -> list:
        game = self.game.module
        whole = self.config.whole_grid_answer and role.answer == "code" and hasattr(game, "GRID_ANSWER_FORMAT")
        user = self.templates.render(
            "user.j2", rules=game.RULES, board=self.game.render(env), status=game.status(env),
            static_view=game.static_view(env) if self._static() else None,
            history="" if self.config.no_move_history else history, handoff=handoff,
            board_on_stdin=not self.config.blind_program,
            answer=role.answer, answer_format=game.GRID_ANSWER_FORMAT if whole else game.ANSWER_FORMAT,
            answer_example=game.GRID_ANSWER_EXAMPLE if whole else game.ANSWER_EXAMPLE, actions_marker=ACTIONS_MARKER)
        return self.templates.chat(role.system, user)

    def _direct_prompt(self, role: Role, env, proposal: str, last_move: str, shows_proposal: bool) -> str:
        if self.config.view == "local":
            return self.templates.render("direct_local.j2", view=self.game.module.local_view(env, last_move),
                                         shows_proposal=shows_proposal, proposal=proposal)
        return self.templates.render("direct.j2", title=self.game.module.TITLE, rows=self.game.render(env, row_sep="/"),
                                     shows_proposal=shows_proposal, proposal=proposal, moves_env=role.moves_env,
                                     want=self.game.module.direct_format(role.max_len))


@functools.lru_cache(maxsize=None)
def _compiled(game: GridGame, seed: int):
    """Jitted reset (per split) and branch step, shared by workflows of the same game."""
    module, params = game.module, game.params
    base = jax.random.PRNGKey(seed)

    def make_reset(split):
        def reset_one(task_id):
            return module.reset(jax.random.fold_in(base, task_id), params, split)

        return jax.jit(jax.vmap(reset_one))

    def branch_step(env, actions):  # env leaves [B]; actions [B, K, L]
        per_task = lambda e, acts: jax.vmap(lambda a: module.step(e, a, params))(acts)  # noqa: E731
        new, reward, _, _ = jax.vmap(per_task)(env, actions)
        return new, reward

    def step_more(env, actions):  # env leaves [B, K] (already branched); actions [B, K, L]
        new, reward, _, _ = jax.vmap(jax.vmap(lambda e, a: module.step(e, a, params)))(env, actions)
        return new, reward

    return {split: make_reset(split) for split in grid.SPLITS}, jax.jit(branch_step), jax.jit(step_more)


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
