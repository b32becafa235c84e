"""Plain-Python, per-object steppers of the grid games' rules.

Mutable objects with tuples, sets and lists, stepped one move at a time (the way
the reference system steps deep-copied Python state objects). They restate the
rules of `plan_path`, `sokoban` and `sudoku` independently of the JAX code, for
property tests and as the baseline of `python -m atgrpo_jax.bench envs`.
Moves: 0..3 = U, D, L, R; -1 is a no-op; any other int is an invalid move.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from atgrpo_jax.envs import plan_path, sokoban, sudoku
from atgrpo_jax.envs.solvers import plan_path_distance

_DELTAS = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}


class _Stepper:
    done: bool

    def step_many(self, actions) -> list[float]:
        """Per-move rewards of a move list (a done episode pays 0)."""
        return [self.step(int(a)) for a in actions]


class PlanPathRef(_Stepper):
    def __init__(self, state: Any, params: plan_path.Params = plan_path.Params()):
        self.p = params
        walls = np.asarray(state.walls)
        self.h, self.w = walls.shape
        self.walls = {(r, c) for r, c in np.argwhere(walls).tolist()}
        self.pos = tuple(np.asarray(state.pos).tolist())
        self.goal = tuple(np.asarray(state.goal).tolist())
        self.start = tuple(np.asarray(state.start).tolist())
        self.optimal = plan_path_distance(walls, self.start, self.goal)
        self.steps, self.invalid = int(state.steps), int(state.invalid)
        self.done, self.success = bool(state.done), bool(state.success)

    def _phi(self, pos) -> float:
        return -float(abs(pos[0] - self.goal[0]) + abs(pos[1] - self.goal[1]))

    def step(self, action: int) -> float:
        if self.done or action == -1:
            return 0.0
        valid = False
        nxt = self.pos
        if action in _DELTAS:
            dr, dc = _DELTAS[action]
            cand = (self.pos[0] + dr, self.pos[1] + dc)
            if 0 <= cand[0] < self.h and 0 <= cand[1] < self.w and cand not in self.walls:
                valid, nxt = True, cand
        p = self.p
        reward = p.r_step if valid else p.r_invalid
        reward += p.lambda_pot * (p.gamma * self._phi(nxt) - self._phi(self.pos))
        self.pos = nxt
        self.steps += 1
        self.invalid += not valid
        if self.pos == self.goal:
            reward += p.r_goal + (p.r_optimal if self.steps == self.optimal else 0.0)
            self.done = self.success = True
        elif self.steps >= p.max_steps:
            reward += p.r_fail
            self.done = True
        return reward

    def arrays(self) -> dict:
        return {"pos": np.array(self.pos), "steps": self.steps, "invalid": self.invalid,
                "done": self.done, "success": self.success}


class SokobanRef(_Stepper):
    def __init__(self, state: Any, params: sokoban.Params = sokoban.Params()):
        self.p = params
        walls = np.asarray(state.walls)
        self.h, self.w = walls.shape
        self.walls = {(r, c) for r, c in np.argwhere(walls).tolist()}
        self.goals = {(r, c) for r, c in np.argwhere(np.asarray(state.goals)).tolist()}
        self.boxes = {(r, c) for r, c in np.argwhere(np.asarray(state.boxes)).tolist()}
        self.player = tuple(np.asarray(state.player).tolist())
        self.steps, self.invalid = int(state.steps), int(state.invalid)
        self.done, self.success = bool(state.done), bool(state.success)

    def _phi(self) -> float:
        if not self.goals:
            return 0.0
        return -float(sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in self.goals) for b in self.boxes))

    def _inside(self, pos) -> bool:
        return 0 <= pos[0] < self.h and 0 <= pos[1] < self.w

    def step(self, action: int) -> float:
        if self.done or action == -1:
            return 0.0
        p = self.p
        phi_old = self._phi()
        valid, bonus = False, 0.0
        if action in _DELTAS:
            dr, dc = _DELTAS[action]
            nxt = (self.player[0] + dr, self.player[1] + dc)
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if self._inside(nxt) and nxt not in self.walls:
                if nxt not in self.boxes:
                    valid = True
                elif self._inside(beyond) and beyond not in self.walls and beyond not in self.boxes:
                    valid = True
                    self.boxes.remove(nxt)
                    self.boxes.add(beyond)
                    if nxt not in self.goals and beyond in self.goals:
                        bonus = p.r_box_on_goal
                    elif nxt in self.goals and beyond not in self.goals:
                        bonus = p.r_box_off_goal
            if valid:
                self.player = nxt
        reward = (p.r_step if valid else p.r_invalid) + bonus
        reward += p.lambda_pot * (p.gamma * self._phi() - phi_old)
        self.steps += 1
        self.invalid += not valid
        if self.boxes <= self.goals:
            reward += p.r_win
            self.done = self.success = True
        elif self.steps >= p.max_steps:
            reward += p.r_fail
            self.done = True
        return reward

    def arrays(self) -> dict:
        boxes = np.zeros((self.h, self.w), bool)
        for b in self.boxes:
            boxes[b] = True
        return {"boxes": boxes, "player": np.array(self.player), "steps": self.steps,
                "invalid": self.invalid, "done": self.done, "success": self.success}


class SudokuRef(_Stepper):
    def __init__(self, state: Any, params: sudoku.Params = sudoku.Params()):
        self.p = params
        self.puzzle = np.asarray(state.puzzle).tolist()
        self.grid = np.asarray(state.grid).tolist()
        self.solution = np.asarray(state.solution).tolist()
        self.steps, self.invalid = int(state.steps), int(state.invalid)
        self.done, self.success = bool(state.done), bool(state.success)

    def _clashes(self, r: int, c: int, v: int) -> bool:
        for i in range(4):
            if (i != c and self.grid[r][i] == v) or (i != r and self.grid[i][c] == v):
                return True
        br, bc = r - r % 2, c - c % 2
        return any(self.grid[i][j] == v for i in (br, br + 1) for j in (bc, bc + 1) if (i, j) != (r, c))

    def _filled(self) -> int:
        return sum(v != 0 for row in self.grid for v in row)

    def _satisfied(self) -> int:
        """The reference's constraint count: per row, column and box with no repeat, its filled cells - 1."""
        units = [[(r, c) for c in range(4)] for r in range(4)] + [[(r, c) for r in range(4)] for c in range(4)]
        units += [[(br + i, bc + j) for i in (0, 1) for j in (0, 1)] for br in (0, 2) for bc in (0, 2)]
        total = 0
        for unit in units:
            values = [self.grid[r][c] for r, c in unit if self.grid[r][c]]
            if len(values) == len(set(values)) and len(values) > 1:
                total += len(values) - 1
        return total

    def _step_reference(self, action: int) -> float:
        """The reference system's scoring of one placement (sudoku module docstring)."""
        r, c, v = action // 16, (action // 4) % 4, action % 4 + 1
        if 0 <= action < 64 and self.grid[r][c] == v:
            return 0.0  # a restated digit: nothing happens
        valid = 0 <= action < 64 and self.grid[r][c] == 0 and not self._clashes(r, c, v)
        self.steps += 1
        self.invalid += not valid
        reward = -0.3
        if valid:
            candidates = [d for d in range(1, 5) if not self._clashes(r, c, d)]
            reward = -0.01 + (0.2 if len(candidates) == 1 else 0.1 if len(candidates) <= 2 else 0.0)
            filled, satisfied = self._filled(), self._satisfied()
            self.grid[r][c] = v
            reward += 0.5 * (self._filled() - filled) / 16 + 0.02 * (self._satisfied() - satisfied)
            reward += 0.1 * self._filled() / 16 + (0.05 if self._filled() < 16 else 0.0)
        if self.grid == self.solution:
            empties = sum(v == 0 for row in self.puzzle for v in row)
            reward += 2.0 + (0.5 if self.steps <= empties else 0.0)
            self.done = self.success = True
        return reward

    def step(self, action: int) -> float:
        if self.done or action == -1:
            return 0.0
        if self.p.rewards == "reference":
            return self._step_reference(action)
        p = self.p
        valid, reward = False, 0.0
        if 0 <= action < 64:
            r, c, v = action // 16, (action // 4) % 4, action % 4 + 1
            given = self.puzzle[r][c]
            if not self._clashes(r, c, v) and given in (0, v):
                valid = True
                old, sol = self.grid[r][c], self.solution[r][c]
                self.grid[r][c] = v
                if v == sol and old != sol:
                    reward += p.r_correct
                elif v != sol and old == sol:
                    reward -= p.r_correct
        reward += p.r_step if valid else p.r_invalid
        self.steps += 1
        self.invalid += not valid
        if self.grid == self.solution:
            reward += p.r_solved
            self.done = self.success = True
        elif self.steps >= p.max_steps:
            reward += p.r_fail
            self.done = True
        return reward

    def arrays(self) -> dict:
        return {"grid": np.array(self.grid), "steps": self.steps, "invalid": self.invalid,
                "done": self.done, "success": self.success}
