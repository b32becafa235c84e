"""Chat data for the sft command: rows checked, rendered with the model's chat template, tokenized with
the assistant tokens marked, and packed into rows of sft.row_tokens (docs/guides/sft.md).

A row is {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]} with at least one
assistant message (the Hugging Face chat format). Each assistant message is found by rendering
prefixes: the text up to it with the generation prompt (what the sampler gives the model when it
answers) must be a prefix of the text through it, and the rest, up to and including its end token, is
scored. A template that renders earlier turns differently once the conversation goes on (Qwen3's drops
their think blocks) cannot hold every turn in one sequence: such a conversation becomes one sequence
per assistant turn, each exactly as the model sees it when it answers.

Packing: the sequences of a step come from a stream of epochs, each a permutation drawn from
(train.seed, epoch); a step fills its rows in stream order (`plan_step`), so the sequences of step s
are a pure function of the seed, s and the data, and a resumed run sees what an uninterrupted one would.
Each sequence is a segment of its row of its own (positions from 0), attending only to itself.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from atgrpo_jax.data import read_rows
from atgrpo_jax.errors import DataError
from atgrpo_jax.models.tokenizer import render_chat

ROLES = ("system", "user", "assistant")
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")  # the end of an assistant turn, scored with it (setup.build_run's stops)


@dataclasses.dataclass(frozen=True)
class Example:
    """One training sequence: its token ids and which of them are scored (assistant tokens)."""

    tokens: np.ndarray  # [L] int32
    scored: np.ndarray  # [L] bool; scored[0] is False (nothing predicts the first token)


def check_row(row, source: str, index: int) -> list[dict]:
    """The messages of row `index` (0-based) of `source` as [{"role", "content"}]; a DataError names what is
    wrong (other keys of a message, e.g. a name, are dropped: the chat template reads role and content)."""
    where = f"{source}: row {index + 1}"
    messages = row.get("messages") if isinstance(row, dict) else None
    if messages is None:
        fields = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
        raise DataError(f"{where} has no \"messages\" (a list of {{\"role\", \"content\"}}); its fields: "
                        f"{fields or '(none)'}")
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError(f"{where}: \"messages\" must be a non-empty list, got {messages!r:.80}")
    out = []
    for j, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(f"{where}, message {j + 1}: must be an object with role and content, got {m!r:.80}")
        if m.get("role") not in ROLES:
            raise DataError(f"{where}, message {j + 1}: role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise DataError(f"{where}, message {j + 1}: content must be a string, got "
                            f"{type(m.get('content')).__name__}")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" for m in out):
        raise DataError(f"{where} has no assistant message: nothing to train on")
    return out


def _render(tokenizer, messages, generation_prompt: bool, thinking: bool, where: str) -> str:
    try:
        return render_chat(tokenizer, messages, add_generation_prompt=generation_prompt, enable_thinking=thinking)
    except Exception as e:  # noqa: BLE001 - jinja's errors (a template's raise_exception) name the cause
        raise DataError(f"{where}: the chat template does not render it ({e})") from None


def _scored_end(span: str) -> int:
    """Where the scored part of an assistant span ends: after its last end token (the template's newline
    after it is context, not generated), or the whole span when it has none."""
    ends = [span.rfind(t) + len(t) for t in STOP_TOKENS if t in span]
    return max(ends) if ends else len(span)


def assistant_sequences(tokenizer, messages: list[dict], thinking: bool, where: str) -> list[tuple[str, list]]:
    """[(text, [(start, end) character spans scored])]: the conversation's sequences (one while the template
    keeps earlier turns as they were rendered, else one per assistant turn)."""
    out: list[tuple[str, list]] = []
    for j, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:j], True, thinking, where)
        through = _render(tokenizer, messages[:j + 1], False, thinking, where)
        if not through.startswith(before):
            raise DataError(f"{where}, message {j + 1}: the chat template renders the conversation up to this "
                            "assistant message (with the generation prompt) as something that is not a prefix of "
                            "the conversation through it, so its tokens cannot be found; use a template that does")
        span = (len(before), len(before) + _scored_end(through[len(before):]))
        if out and before.startswith(out[-1][0]):  # the template kept the earlier turns: one sequence
            out[-1] = (through[:span[1]], out[-1][1] + [span])
        else:
            out.append((through[:span[1]], [span]))
    return out


def encode_sequence(tokenizer, text: str, spans: list) -> Example:
    """Token ids of `text`, each piece between span bounds encoded on its own (as the sampler's prompt is
    encoded before the response is generated), the spans' tokens scored."""
    ids, scored, at = [], [], 0
    for start, end in spans:
        for piece, mark in ((text[at:start], False), (text[start:end], True)):
            piece_ids = tokenizer.encode(piece, add_special_tokens=False) if piece else []
            ids += piece_ids
            scored += [mark] * len(piece_ids)
        at = end
    tokens, mask = np.asarray(ids, np.int32), np.asarray(scored, bool)
    if len(mask):
        mask[0] = False  # nothing before it to predict it from
    return Example(tokens, mask)


def examples_of(rows, source: str, tokenizer, thinking: bool = False) -> list[Example]:
    """Every row of `source` checked and tokenized (an error names the row before anything is trained)."""
    out = []
    for i, row in enumerate(rows):
        where = f"{source}: row {i + 1}"
        messages = check_row(row, source, i)
        for text, spans in assistant_sequences(tokenizer, messages, thinking, where):
            example = encode_sequence(tokenizer, text, spans)
            if not example.scored.any():
                raise DataError(f"{where}: its assistant messages encode to no token")
            out.append(example)
    if not out:
        raise DataError(f"{source}: no rows")
    return out


def load_examples(source: str, tokenizer, thinking: bool = False) -> list[Example]:
    """The examples of a data source (a file, a save_to_disk directory, hf:org/name: atgrpo_jax.data)."""

    return examples_of(read_rows(source), source, tokenizer, thinking)


# ---------------------------------------------------------------- packing


class Rows(NamedTuple):
    """A step's packed rows: the fields of train.update.Packed that the forward pass and the loss read
    (segment s + 1: the row's s-th sequence, -1 padding; no prompt segment 0, so no sequence sees another)."""

    tokens: np.ndarray  # [R, W] int32
    positions: np.ndarray  # [R, W] int32: from 0 in each sequence
    segment: np.ndarray  # [R, W] int32
    pred: np.ndarray  # [R, M] int32: the column whose hidden state predicts the entry
    target: np.ndarray  # [R, M] int32
    scored: np.ndarray  # [R, M] bool


class Cursor(NamedTuple):
    """A position in the stream of epochs: the next sequence is permutation(epoch)[index]."""

    epoch: int = 0
    index: int = 0


@functools.lru_cache(maxsize=2)  # the epoch being read (and the next): not one shuffle per step
def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the sequences in `epoch` (read only: the array is shared)."""
    return np.random.default_rng([seed, epoch, 0x5F7]).permutation(n)


def first_fit(indices: Iterable[int], lengths: np.ndarray, rows: int, row_tokens: int) -> list[tuple[int, int, int]]:
    """[(sequence, row, column)]: sequences in the order given, each in the current row if it fits, else in
    the next one (a sequence longer than a row takes a whole row and is cut at its end), until the next
    sequence fits in no row left."""
    placed, row, col = [], 0, 0
    for i in indices:
        take = min(int(lengths[i]), row_tokens)
        if col + take > row_tokens:
            row, col = row + 1, 0
        if row == rows:
            break
        placed.append((i, row, col))
        col += take
    return placed


def stream(n: int, seed: int, cursor: Cursor) -> Iterator[int]:
    """The training sequences from `cursor` on, epoch after epoch (each epoch its own order)."""
    if n == 0:
        raise ValueError("no training sequences to stream")
    epoch, index = cursor
    while True:
        yield from (int(i) for i in epoch_order(n, seed, epoch)[index:])
        epoch, index = epoch + 1, 0


def plan_step(lengths: np.ndarray, cursor: Cursor, rows: int, row_tokens: int, seed: int
              ) -> tuple[list[tuple[int, int, int]], Cursor]:
    """([(sequence, row, column)] of one step, the cursor after it): the stream's next sequences, first fit."""
    n = len(lengths)
    placed = first_fit(stream(n, seed, cursor), lengths, rows, row_tokens)
    epochs, index = divmod(cursor.index + len(placed), n)
    return placed, Cursor(cursor.epoch + epochs, index)


def pack_rows(examples: list[Example], placed: list[tuple[int, int, int]], rows: int, row_tokens: int
              ) -> tuple[Rows, dict]:
    """The step's `Rows` [rows, row_tokens] and its counts: scored tokens, sequences, and sequences cut."""
    w = row_tokens
    tokens = np.zeros((rows, w), np.int32)
    positions = np.zeros((rows, w), np.int32)
    segment = np.full((rows, w), -1, np.int32)
    pred, target = np.zeros((rows, w), np.int32), np.zeros((rows, w), np.int32)
    scored = np.zeros((rows, w), bool)
    used = np.zeros(rows, np.int64)  # scored entries per row so far
    slot = np.zeros(rows, np.int32)
    truncated = 0
    for i, r, c in placed:
        ex = examples[i]
        take = min(len(ex.tokens), w - c)
        truncated += take < len(ex.tokens)
        tokens[r, c:c + take] = ex.tokens[:take]
        positions[r, c:c + take] = np.arange(take)
        slot[r] += 1
        segment[r, c:c + take] = slot[r]
        j = np.flatnonzero(ex.scored[:take])  # j >= 1: predicted from column c + j - 1
        pred[r, used[r]:used[r] + len(j)] = c + j - 1
        target[r, used[r]:used[r] + len(j)] = ex.tokens[j]
        scored[r, used[r]:used[r] + len(j)] = True
        used[r] += len(j)
    counts = {"tokens": int(scored.sum()), "sequences": len(placed), "truncated": int(truncated)}
    return Rows(tokens, positions, segment, pred, target, scored), counts


def held_out_steps(examples: list[Example], rows: int, row_tokens: int) -> list[Rows]:
    """Every held-out sequence once, in order, packed into batches of `rows` rows."""
    lengths = np.array([len(e.tokens) for e in examples])
    out, start = [], 0
    while start < len(examples):
        placed = first_fit(range(start, len(examples)), lengths, rows, row_tokens)
        out.append(pack_rows(examples, placed, rows, row_tokens)[0])
        start += len(placed)
    return out
