"""Plain-Python solvers: independent checks for the JAX games (tests, rewards).

Inputs are NumPy arrays or nested lists; moves are 0..3 = U, D, L, R.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

_DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))


def plan_path_shortest(walls, start, goal) -> list[int] | None:
    """A shortest move list from start to goal (BFS), or None if unreachable."""
    walls = np.asarray(walls, bool)
    h, w = walls.shape
    start, goal = tuple(int(x) for x in start), tuple(int(x) for x in goal)
    if walls[start] or walls[goal]:
        return None
    prev = {start: None}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        if cur == goal:
            moves = []
            while prev[cur] is not None:
                cur, move = prev[cur]
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in enumerate(_DELTAS):
            nxt = (cur[0] + dr, cur[1] + dc)
            if 0 <= nxt[0] < h and 0 <= nxt[1] < w and not walls[nxt] and nxt not in prev:
                prev[nxt] = (cur, move)
                queue.append(nxt)
    return None


def plan_path_distance(walls, start, goal) -> int | None:
    path = plan_path_shortest(walls, start, goal)
    return None if path is None else len(path)


def sokoban_solve(walls, goals, boxes, player, max_states: int = 500_000) -> list[int] | None:
    """A shortest move list that puts every box on a goal (BFS over player and boxes).

    None if unsolvable (or more than max_states states were explored).
    """
    walls, goals = np.asarray(walls, bool), np.asarray(goals, bool)
    h, w = walls.shape
    goal_set = {tuple(p) for p in np.argwhere(goals).tolist()}
    start = (tuple(int(x) for x in player), frozenset(tuple(p) for p in np.argwhere(np.asarray(boxes, bool)).tolist()))
    prev = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        pos, box_set = state
        if box_set <= goal_set:
            moves = []
            while prev[state] is not None:
                state, move = prev[state]
                moves.append(move)
            return moves[::-1]
        if len(prev) > max_states:
            return None
        for move, (dr, dc) in enumerate(_DELTAS):
            nxt = (pos[0] + dr, pos[1] + dc)
            if not (0 <= nxt[0] < h and 0 <= nxt[1] < w) or walls[nxt]:
                continue
            new_boxes = box_set
            if nxt in box_set:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not (0 <= beyond[0] < h and 0 <= beyond[1] < w) or walls[beyond] or beyond in box_set:
                    continue
                new_boxes = (box_set - {nxt}) | {beyond}
            new_state = (nxt, new_boxes)
            if new_state not in prev:
                prev[new_state] = (state, move)
                queue.append(new_state)
    return None


def sudoku_count_solutions(puzzle: Sequence[Sequence[int]], limit: int = 2) -> int:
    """Number of completions of an n x n Sudoku (0 = empty), counting up to `limit`."""
    grid = [list(map(int, row)) for row in puzzle]
    n = len(grid)
    box = int(round(n ** 0.5))

    def allowed(r, c, v):
        if any(grid[r][j] == v for j in range(n)) or any(grid[i][c] == v for i in range(n)):
            return False
        br, bc = r - r % box, c - c % box
        return all(grid[i][j] != v for i in range(br, br + box) for j in range(bc, bc + box))

    # Givens must not clash among themselves.
    for r in range(n):
        for c in range(n):
            v = grid[r][c]
            if v:
                grid[r][c] = 0
                ok = allowed(r, c, v)
                grid[r][c] = v
                if not ok:
                    return 0

    empties = [(r, c) for r in range(n) for c in range(n) if grid[r][c] == 0]

    def count(i):
        if i == len(empties):
            return 1
        r, c = empties[i]
        total = 0
        for v in range(1, n + 1):
            if allowed(r, c, v):
                grid[r][c] = v
                total += count(i + 1)
                grid[r][c] = 0
                if total >= limit:
                    break
        return total

    return count(0)


def sudoku_solve(puzzle: Sequence[Sequence[int]]) -> list[list[int]] | None:
    """The first completion found by backtracking, or None."""
    grid = [list(map(int, row)) for row in puzzle]
    n = len(grid)
    box = int(round(n ** 0.5))

    def allowed(r, c, v):
        if v in grid[r] or any(grid[i][c] == v for i in range(n)):
            return False
        br, bc = r - r % box, c - c % box
        return all(grid[i][j] != v for i in range(br, br + box) for j in range(bc, bc + box))

    def fill(i):
        if i == n * n:
            return True
        r, c = divmod(i, n)
        if grid[r][c]:
            return fill(i + 1)
        for v in range(1, n + 1):
            if allowed(r, c, v):
                grid[r][c] = v
                if fill(i + 1):
                    return True
                grid[r][c] = 0
        return False

    if sudoku_count_solutions(puzzle, limit=1) == 0:
        return None
    return grid if fill(0) else None
