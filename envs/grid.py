"""What the three grid games share: moves, branch selection, level hashing, parsers.

Moves are ints: 0..3 = up, down, left, right (letters U D L R). In a padded move
array, -1 (`NOOP`) is a no-op (no reward, no step counted); any other value
outside 0..3 (e.g. `INVALID`) is a move the game rejects with its invalid-move
penalty, the way the reference system treats an unknown action string.

Splits: a level's identity (the arrays that define it) is hashed to one of
`SPLIT_BUCKETS` buckets; test levels are exactly those in bucket 0, validation
levels those in bucket 1 and training levels those in the others, so the three
sets are disjoint by construction (`reset(..., split=...)` rejects levels of the
other splits).
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3
NOOP = -1
INVALID = 4
LETTERS = "UDLR"
DELTAS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], dtype=np.int32)
SPLIT_BUCKETS = 8

_MOVE_WORDS = {"U": 0, "UP": 0, "D": 1, "DOWN": 1, "L": 2, "LEFT": 2, "R": 3, "RIGHT": 3}
_MAX_PARSE_CHARS = 20_000  # longer list texts are rejected before any parsing work


# ---------------------------------------------------------------- JAX helpers


def select_best_branch(states: Any, scores: jax.Array) -> Any:
    """Every slot of the leading branch axis K gets the argmax-score branch.

    states: pytree, leaves [K, ...]; scores: [K]. A gather (jittable, vmappable
    over tasks); ties go to the lowest index.
    """
    best = jnp.argmax(scores)
    idx = jnp.full(scores.shape, best)
    return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), states)


def move_delta(action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(delta [2], is_move) for an int action; non-moves get a zero delta."""
    is_move = (action >= 0) & (action <= 3)
    delta = jnp.asarray(DELTAS)[jnp.clip(action, 0, 3)]
    return jnp.where(is_move, delta, 0), is_move


def in_bounds(pos: jax.Array, height: int, width: int) -> jax.Array:
    return (pos[0] >= 0) & (pos[0] < height) & (pos[1] >= 0) & (pos[1] < width)


def cell(grid: jax.Array, pos: jax.Array) -> jax.Array:
    """grid[pos] with the index clipped (callers mask out-of-bounds themselves)."""
    h, w = grid.shape
    return grid[jnp.clip(pos[0], 0, h - 1), jnp.clip(pos[1], 0, w - 1)]


def apply_actions(step_one, state, actions):
    """A game's public step: run_moves plus the (state, reward, done, info) contract.

    The state must have `success`, `invalid` and `done` fields.
    """
    new, rewards = run_moves(step_one, state, actions)
    info = {"success": new.success, "rewards": rewards, "invalid": new.invalid - state.invalid}
    return new, rewards.sum(), new.done, info


def run_moves(step_one, state, actions: jax.Array):
    """Apply a scalar action or a padded [L] action array with `step_one`.

    step_one(state, action) -> (state, reward). Returns (state, per-move
    rewards [L]); a scalar action is treated as L = 1.
    """
    actions = jnp.atleast_1d(jnp.asarray(actions, jnp.int32))
    return jax.lax.scan(step_one, state, actions)


def uniform_parts(key: jax.Array, sizes: Sequence[int]) -> list[jax.Array]:
    """Several uniform [0, 1) vectors from one draw (one PRNG call compiles much faster)."""
    u = jax.random.uniform(key, (sum(sizes),))
    offsets = np.cumsum([0, *sizes])
    return [u[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def randint_from(u: jax.Array, n) -> jax.Array:
    """Uniform ints in [0, n) from uniform floats."""
    return jnp.minimum((u * n).astype(jnp.int32), jnp.asarray(n, jnp.int32) - 1)


def _fmix32(h):
    # murmur3's finalizer: spreads every input bit over the 32 output bits.
    h = h ^ (h >> 16)
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _position_weights(n: int) -> np.ndarray:
    i = np.arange(n, dtype=np.uint64)
    return ((i * 0x9E3779B1 + 0x7F4A7C15) % (1 << 32) | 1).astype(np.uint32)


def level_bucket(arrays: Sequence[jax.Array]) -> jax.Array:
    """Split bucket (0..SPLIT_BUCKETS-1) of a level given its defining int arrays."""
    flat = jnp.concatenate([jnp.ravel(a).astype(jnp.uint32) for a in arrays])
    h = jnp.sum(flat * jnp.asarray(_position_weights(flat.shape[0])), dtype=jnp.uint32)
    return (_fmix32(h) % np.uint32(SPLIT_BUCKETS)).astype(jnp.int32)


def level_bucket_np(arrays: Sequence[np.ndarray]) -> int:
    """NumPy mirror of `level_bucket` (for tests and host-side checks)."""
    flat = np.concatenate([np.ravel(a).astype(np.uint32) for a in arrays])
    with np.errstate(over="ignore"):
        h = np.sum(flat * _position_weights(flat.shape[0]), dtype=np.uint32)
        h = np.uint32(h)
        h ^= h >> np.uint32(16)
        h = np.uint32(h * np.uint32(0x85EBCA6B))
        h ^= h >> np.uint32(13)
        h = np.uint32(h * np.uint32(0xC2B2AE35))
        h ^= h >> np.uint32(16)
    return int(h % np.uint32(SPLIT_BUCKETS))


SPLITS = ("train", "valid", "test")  # buckets 2.., 1, 0


def split_ok(bucket: jax.Array, split: str | None) -> jax.Array:
    """Whether a level with this bucket belongs to `split` ("train", "valid", "test"; None: any)."""
    if split is None:
        return jnp.bool_(True)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    return {"test": bucket == 0, "valid": bucket == 1, "train": bucket >= 2}[split]


def stack_states(states: Sequence[Any]) -> Any:
    """Stack single-level states into one batched state (leading axis)."""
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *states)


def unstack_state(state: Any, index: int) -> Any:
    """Host (NumPy) copy of level `index` of a batched state."""
    return jax.tree.map(lambda x: np.asarray(x)[index], state)


# ---------------------------------------------------------------- text parsers (never raise)


def move_from_word(item: Any) -> int:
    """One list item -> move code; anything but U/D/L/R (or up/down/...) -> INVALID."""
    if isinstance(item, str):
        return _MOVE_WORDS.get(item.strip().upper(), INVALID)
    return INVALID


def moves_from_letters(text: str, max_len: int) -> list[int] | None:
    """'URDL' / 'U R, D' -> move codes; None unless 1..max_len letters of UDLR only."""
    if not isinstance(text, str):
        return None
    letters = re.sub(r"[\s,]", "", text[: 4 * max_len + 64]).upper()
    if len(text) > 4 * max_len + 64 or not 1 <= len(letters) <= max_len:
        return None
    if any(ch not in LETTERS for ch in letters):
        return None
    return [LETTERS.index(ch) for ch in letters]


def literal_list(text: str) -> list | None:
    """The first bracketed list in `text` as a Python value (JSON or Python literal)."""
    if not isinstance(text, str):
        return None
    start = text.find("[")
    if start < 0:
        return None
    depth, end = 0, -1
    for i in range(start, min(len(text), start + _MAX_PARSE_CHARS)):
        ch = text[i]
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end < 0:
        return None
    body = text[start : end + 1]
    for loader in (json.loads, ast.literal_eval):
        try:
            value = loader(body)
        except Exception:  # noqa: BLE001 - any malformed literal is a parse failure
            continue
        if isinstance(value, list):
            return value
    # Unquoted letters: [U, R, D]
    items = [w for w in re.split(r"[\s,]+", body[1:-1]) if w]
    if items and all(re.fullmatch(r"[A-Za-z]+", w) for w in items):
        return items
    return None if body[1:-1].strip() else []


def moves_from_list_text(text: str, max_len: int) -> list[int] | None:
    """'["U","R"]', "['U', 'R']", '[U, R]' or 'U R' -> move codes (at most max_len).

    None when nothing parses; unknown items become INVALID moves; longer lists
    are cut to max_len.
    """
    if not isinstance(text, str):
        return None
    if "[" in text:
        items = literal_list(text)
        if items is None:
            return None
        return [move_from_word(x) for x in items[:max_len]]
    words = [w for w in re.split(r"[\s,]+", text.strip()) if w][: max_len + 1]
    if words and all(w.upper() in _MOVE_WORDS for w in words):
        return [_MOVE_WORDS[w.upper()] for w in words[:max_len]]
    return moves_from_letters(text, max_len)


def pad_actions(rows: Sequence[Sequence[int] | None], length: int) -> np.ndarray:
    """Lists of move codes -> int32 [N, length] padded with NOOP (None -> all NOOP)."""
    out = np.full((len(rows), length), NOOP, dtype=np.int32)
    for i, row in enumerate(rows):
        if row:
            row = list(row)[:length]
            out[i, : len(row)] = row
    return out


def letters_of(moves: Sequence[int]) -> str:
    """Move codes -> 'UDLR' letters ('?' for invalid codes, pads skipped)."""
    return "".join(LETTERS[m] if 0 <= m <= 3 else "?" for m in moves if m != NOOP)


# ---------------------------------------------------------------- what the moving games share

MOVES_ANSWER_FORMAT = 'a list of moves such as ["U", "R", "D", "L"]'
MOVES_EXAMPLE = '["U", "R", "D", "L"]'


def show_moves(codes: Sequence[int] | None) -> str:
    """Move codes as the model writes them: '["U", "R"]'."""
    if codes is None:
        return "none (nothing parsed)"
    return "[" + ", ".join(f'"{LETTERS[a]}"' if 0 <= a <= 3 else '"?"' for a in codes) + "]"


def direct_moves(text: str, max_len: int) -> list[int] | None:
    """A short direct answer: 1..max_len letters of UDLR (spaces and commas allowed), or None."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    return moves_from_letters(text.strip(), max_len)


def lenient_moves(text: str, max_len: int) -> list[int] | None:
    """The UDLR letters among the first max_len characters (a model learning from scratch)."""
    moves = [LETTERS.index(ch) for ch in text[:max_len] if ch in LETTERS[:4]]
    return moves or None


def direct_moves_format(max_len: int) -> str:
    return f"1-{max_len} moves UDLR"
