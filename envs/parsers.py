"""Parsers for model outputs, shared by all workflows. None of them raises.

Every function takes arbitrary input (any object, bytes, huge or malformed
text) and returns a value or None. Inputs are clipped to their last
MAX_TEXT_CHARS characters first: answers come at the end of a response, and a
10 MB string costs no more than a long response. Choices, stated once:

- `extract_code_block`: the LAST fenced block tagged python/py/python3 (or,
  when there is none, the last untagged block). Models often draft and then
  give the final program last. Fences are ``` or ~~~ (three or more); a
  block left open runs to the end of the text.
- `extract_boxed`: the content of the LAST `\\boxed{...}` / `\\fbox{...}` whose
  braces balance (escaped `\\{ \\}` do not count); `\\boxed 5` also works.
- `extract_test_cases`: (input, output) pairs from `**Test Input:**` /
  `**Test Output:**` sections, each a fenced block or plain text.
- `extract_after_marker`: the text after the LAST line that starts with the
  marker, ignoring lines inside fenced code (a `####` comment in code is not
  an answer); if that line is empty after the marker, the next non-blank line.
- `parse_list`: the first bracketed list literal, parsed as Python/JSON.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

MAX_TEXT_CHARS = 100_000
MAX_TEST_CASES = 32
MAX_LIST_CHARS = 20_000

_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([^`\n]*?)[ \t]*$")
_PYTHON_TAGS = {"python", "py", "python3", "py3", "{.python}"}
_BOX = re.compile(r"\\(?:boxed|fbox)\b[ \t]*")
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)
_TEST_MARKER = re.compile(r"\**[ \t]*test[ \t_]*(input|output)[ \t]*\**[ \t]*:[ \t]*\**", re.IGNORECASE)


def as_text(text: Any) -> str:
    """Any input as a str of at most MAX_TEXT_CHARS (its tail)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text[-4 * MAX_TEXT_CHARS:]).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        return ""
    text = text[-MAX_TEXT_CHARS:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def fenced_blocks(text: Any) -> list[tuple[str, str, int, int]]:
    """All fenced blocks as (language tag, body, first line, end line); lines index text.split('\\n')."""
    lines = as_text(text).split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        tag = opening.group(2).strip().lower()
        body, end = _block_body(lines, i + 1, opening.group(1))
        blocks.append((tag.split()[0] if tag else "", body, i, end))
        i = end + 1
    return blocks


def _block_body(lines: list[str], start: int, fence: str) -> tuple[str, int]:
    """Body of a block opened just before lines[start], and the index of its closing line.

    The closing fence is a line of fence characters only, or (tolerated) a fence glued
    to the end of the last code line, as in `print(x)```; an open block runs to the end.
    """
    for end in range(start, len(lines)):
        stripped = lines[end].strip()
        if len(stripped) >= len(fence) and set(stripped) == {fence[0]}:
            return "\n".join(lines[start:end]), end
        if fence[0] == "`" and stripped.endswith(fence) and not stripped.startswith(fence):
            return "\n".join(lines[start:end] + [lines[end].rstrip()[:-len(fence)].rstrip("`")]), end
    return "\n".join(lines[start:]), len(lines)


def extract_code_block(text: Any, which: str = "last") -> str | None:
    """The last (or first) python block; untagged blocks only if no block is tagged python."""
    try:
        blocks = fenced_blocks(text)
        python = [body for tag, body, _, _ in blocks if tag in _PYTHON_TAGS]
        untagged = [body for tag, body, _, _ in blocks if tag == ""]
        candidates = [b for b in (python or untagged) if b.strip()]
        if not candidates:
            return None
        return (candidates[0] if which == "first" else candidates[-1]).strip("\n")
    except Exception:  # noqa: BLE001 - a parser never raises
        return None


def python_block(text: Any) -> str | None:
    """The last block opened by exactly ```` ```python ```` (the reference coder's reading: an untagged or
    otherwise tagged block is no program); None if none."""
    try:
        found = re.findall(r"```python(.*?)```", as_text(text), re.DOTALL)
        return found[-1].strip() or None if found else None
    except Exception:  # noqa: BLE001 - a parser never raises
        return None


_CODE_WORDS = ("def ", "import ", "from ", "=", "print(", "return", "if ", "for ", "while ")


def reference_program(text: Any, unclosed_blocks: bool = False) -> str:
    """The program the reference system runs from a reply in games (`unclosed_blocks`) and math: the
    last ```` ```python ```` block, else the last ```` ``` ```` block, (games: else an unclosed
    ```` ```python ```` block, else an unclosed ```` ``` ```` one that looks like code,) else the whole reply."""
    try:
        text = as_text(text)
        patterns = [r"```python\s*(.*?)```", r"```\s*(.*?)```"]
        if unclosed_blocks:
            patterns += [r"```python\s*(.*?)$", r"```\s*(.*?)$"]
        for n, pattern in enumerate(patterns):
            found = re.findall(pattern, text, re.DOTALL)
            if found and (n < 3 or any(word in found[-1] for word in _CODE_WORDS)):
                return found[-1].strip()
        return text.strip()
    except Exception:  # noqa: BLE001 - a parser never raises
        return ""


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each unescaped '{' -> index of its matching '}' (linear, one pass)."""
    stack, match = [], {}
    for token in _BRACE_TOKENS.finditer(text):
        char = token.group()
        if char == "{":
            stack.append(token.start())
        elif char == "}" and stack:
            match[stack.pop()] = token.start()
    return match


def extract_boxed(text: Any) -> str | None:
    r"""Content of the last balanced \boxed{...} or \fbox{...} (or `\boxed 5`); None if none."""
    try:
        text = as_text(text)
        starts = [m.end() for m in _BOX.finditer(text)]
        if not starts:
            return None
        match = _matching_braces(text)
        for start in reversed(starts):
            if start < len(text) and text[start] == "{":
                close = match.get(start)
                content = text[start + 1:close].strip() if close is not None else ""
            else:
                content = re.match(r"[^\s$]*", text[start:start + 1000]).group().rstrip(".,;")
            if content:
                return content
        return None
    except Exception:  # noqa: BLE001
        return None


def _trim_blank_lines(text: str) -> str:
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def _section_body(section: str) -> str:
    """A section's payload: its first fenced block if it starts with one, else its plain text."""
    lines = section.lstrip(" \t\n").split("\n")
    fence = re.match(r"(`{3,}|~{3,})", lines[0])
    if not fence:
        return _trim_blank_lines(section)
    first = lines[0][fence.end():]
    if fence.group(1) in first:  # ```5``` on one line
        return _trim_blank_lines(first[:first.index(fence.group(1))])
    body, _ = _block_body(lines, 1, fence.group(1))
    return _trim_blank_lines(body)


def extract_test_cases(text: Any, max_cases: int = MAX_TEST_CASES) -> list[tuple[str, str]]:
    """(input, output) pairs from **Test Input:** / **Test Output:** sections, in order."""
    try:
        text = as_text(text)
        markers = list(_TEST_MARKER.finditer(text))
        pairs = []
        pending_input = None
        for n, marker in enumerate(markers):
            end = markers[n + 1].start() if n + 1 < len(markers) else len(text)
            body = _section_body(text[marker.end():end])
            if marker.group(1).lower() == "input":
                pending_input = body
            elif pending_input is not None:
                pairs.append((pending_input, body))
                pending_input = None
                if len(pairs) >= max_cases:
                    break
        return pairs
    except Exception:  # noqa: BLE001
        return []


def extract_after_marker(text: Any, marker: str = "####") -> str | None:
    """Text after the last line starting with `marker`, outside fenced code; None if none."""
    try:
        if not isinstance(marker, str) or not marker:
            return None
        text = as_text(text)
        lines = text.split("\n")
        in_code = [False] * len(lines)
        for _, _, first, end in fenced_blocks(text):
            for n in range(first, min(end + 1, len(lines))):
                in_code[n] = True
        for n in range(len(lines) - 1, -1, -1):
            stripped = lines[n].strip()
            if in_code[n] or not stripped.startswith(marker):
                continue
            rest = stripped[len(marker):].strip()
            if rest:
                return rest
            following = [l.strip() for l, code in zip(lines[n + 1:], in_code[n + 1:]) if l.strip() and not code]
            return following[0] if following else None
        return None
    except Exception:  # noqa: BLE001
        return None


def _matching_brackets(text: str) -> dict[int, int]:
    stack, match = [], {}
    for token in re.finditer(r"[\[\]]", text):
        if token.group() == "[":
            stack.append(token.start())
        elif stack:
            match[stack.pop()] = token.start()
    return match


def parse_list(text: Any, max_attempts: int = 64) -> list | None:
    """The first [...] literal in text (Python or JSON syntax); None if none parses."""
    try:
        text = as_text(text)
        match = _matching_brackets(text)
        attempts = 0
        for start in sorted(match):
            end = match[start]
            if end - start > MAX_LIST_CHARS:
                continue
            attempts += 1
            value = _literal(text[start:end + 1])
            if isinstance(value, list):
                return value
            if attempts >= max_attempts:
                break
        return None
    except Exception:  # noqa: BLE001
        return None


def _literal(literal: str) -> Any:
    if literal.count("[") + literal.count("{") + literal.count("(") > 200:
        return None  # deep nesting can exhaust the parser's recursion
    for parse in (ast.literal_eval, json.loads):
        try:
            return parse(literal)
        except Exception:  # noqa: BLE001
            continue
    return None
