"""Grading of final math answers: math_verify first, then a normalizing fallback.

`grade(pred, reference) -> bool` never raises and never hangs. math_verify
(parse + verify, as the reference system uses) runs in one long-lived worker
process (`math_verify_worker.py`): its signal-based timeouts do not work off
the main thread and cannot interrupt C-level arithmetic such as 9^(9^9), so the
worker runs without them and is killed and restarted when one answer takes
longer than `timeout_s`. Answers are equal when math_verify says so OR the
fallback does: the fallback strips LaTeX decoration (`$`, `\\left`/`\\right`,
`\\!`, spaces, `\\text{}`, degrees, a trailing `.`), compares numbers exactly
(fractions) or within 1e-6, tuples and intervals element by element (bracket
kinds must match), and comma-joined multiple answers as multisets.
"""
from __future__ import annotations

import atexit
import fractions
import functools
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from atgrpo_jax.envs.parsers import extract_boxed

MAX_ANSWER_CHARS = 500  # longer "answers" are graded by the fallback only
DEFAULT_TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 120.0
_WORKER_SCRIPT = Path(__file__).with_name("math_verify_worker.py")

# ---------------------------------------------------------------- fallback
_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\quad|\\qquad|\\displaystyle|\\limits|\\\(|\\\)|\\\[|\\\]|\$")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\circ|\\degree")
_TEXT = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_ASSIGNMENT = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?=(?!=)")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(e[+-]?\d+)?$", re.IGNORECASE)
_FRACTION = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$|^([+-]?\d+)/([+-]?\d+)$")


def normalize(answer: str, drop_text: bool = False) -> str:
    """Answer text without LaTeX decoration (see module docstring); `drop_text` removes \\text{...}."""
    text = str(answer)[:MAX_ANSWER_CHARS * 4]
    boxed = extract_boxed(text)
    text = boxed if boxed is not None else text
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = _DEGREES.sub("", _DROP.sub("", text))
    for _ in range(3):  # nested \text{\textbf{..}}
        text = _TEXT.sub("" if drop_text else r"\1", text)
    return re.sub(r"\s+", "", text).rstrip(".")


def _number(text: str) -> fractions.Fraction | float | None:
    try:
        if _NUMBER.match(text):
            value = fractions.Fraction(text)
            return value if abs(value) < 10**40 else float(value)
        frac = _FRACTION.match(text)
        if frac:
            sign, num, den = (frac.group(1), frac.group(2), frac.group(3)) if frac.group(2) else ("", frac.group(4), frac.group(5))
            value = fractions.Fraction(int(num), int(den))
            return -value if sign == "-" else value
    except (ValueError, ZeroDivisionError, OverflowError):
        pass
    return None


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside (), [], {}."""
    parts, depth, current = [], 0, []
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        if char == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _same(a: str, b: str) -> bool:
    a, b = (_ASSIGNMENT.sub("", x) if x.count("=") == 1 else x for x in (a, b))  # "x=3" is "3"
    if a == b:
        return bool(a)
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        if x == y:
            return True
        integers = all(isinstance(v, fractions.Fraction) and v.denominator == 1 for v in (x, y))
        return not integers and math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-9)
    if len(a) > 1 and len(b) > 1 and a[0] in "([" and b[0] in "([" and a[-1] in ")]" and b[-1] in ")]":
        if (a[0], a[-1]) != (b[0], b[-1]):
            return False
        xs, ys = split_top_level(a[1:-1]), split_top_level(b[1:-1])
        return len(xs) == len(ys) and all(_same(p, q) for p, q in zip(xs, ys))
    return False


def _same_multiset(pred: list[str], reference: list[str]) -> bool:
    if len(pred) != len(reference):
        return False
    unused = list(reference)
    for p in pred:
        hit = next((i for i, r in enumerate(unused) if _same(p, r)), None)
        if hit is None:
            return False
        unused.pop(hit)
    return True


def fallback_equal(pred: str, reference: str) -> bool:
    """The normalizing comparison alone (no sympy)."""
    try:
        for drop_text in (False, True):
            a, b = normalize(pred, drop_text), normalize(reference, drop_text)
            if _same(a, b):
                return True
            xs, ys = split_top_level(a), split_top_level(b)
            if len(ys) > 1 and _same_multiset(xs, ys):
                return True
        return False
    except Exception:  # noqa: BLE001 - grading never raises
        return False


# ---------------------------------------------------------------- math_verify worker
class _MathVerifyWorker:
    """One math_verify process, used under a lock; killed and restarted on a timeout."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.unavailable = False
        self.restarts = 0

    def _start(self) -> bool:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(_WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, bufsize=0, start_new_session=True)
            if self._ask("1", "1", STARTUP_TIMEOUT_S) is True:
                return True
        except Exception:  # noqa: BLE001
            pass
        self.stop()
        self.unavailable = True  # math_verify cannot run here: the fallback grades alone
        return False

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait()
            except Exception:  # noqa: BLE001
                pass
        self.proc = None

    def _ask(self, pred: str, reference: str, timeout_s: float) -> bool | None:
        return {b"1\n": True, b"0\n": False}.get(self._request([pred, reference], timeout_s))

    def _request(self, request, timeout_s: float) -> bytes | None:
        proc = self.proc
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            reply = b""
            fd = proc.stdout.fileno()
            while not reply.endswith(b"\n"):
                ready, _, _ = select.select([fd], [], [], timeout_s)
                chunk = os.read(fd, 64) if ready else b""
                if not chunk:
                    raise TimeoutError
                reply += chunk
        except Exception:  # noqa: BLE001 - timeout, dead worker: restart next time
            self.stop()
            self.restarts += 1
            return None
        return reply

    def verify(self, pred: str, reference: str, timeout_s: float) -> bool | None:
        with self.lock:
            if self.unavailable or (self.proc is None and not self._start()):
                return None
            return self._ask(pred, reference, timeout_s)

    def as_written(self, gold_text: str, target_text: str, timeout_s: float) -> bool | None:
        """verify(parse(gold_text), parse(target_text)), nothing wrapped; None when math_verify cannot run."""
        with self.lock:
            if self.unavailable or (self.proc is None and not self._start()):
                return None
            return self._request({"as_written": [gold_text, target_text]}, timeout_s) == b"1\n"

    def extract(self, text: str, timeout_s: float) -> str | None:
        with self.lock:
            if self.unavailable or (self.proc is None and not self._start()):
                return None
            reply = self._request({"extract": text}, timeout_s)
        return json.loads(reply) if reply and reply != b"-\n" else None


_WORKER = _MathVerifyWorker()
atexit.register(_WORKER.stop)


@functools.lru_cache(maxsize=1 << 16)
def _grade_cached(pred: str, reference: str, timeout_s: float, use_math_verify: bool) -> bool:
    if fallback_equal(pred, reference):
        return True
    if not use_math_verify or len(pred) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    return _WORKER.verify(pred, reference, timeout_s) is True


def grade(pred: str | None, reference: str, timeout_s: float = DEFAULT_TIMEOUT_S, use_math_verify: bool = True) -> bool:
    """True if `pred` is the same answer as `reference`; never raises (bad input -> False)."""
    try:
        if not isinstance(pred, str) or not isinstance(reference, str) or not pred.strip() or not reference.strip():
            return False
        return _grade_cached(pred.strip(), reference.strip(), float(timeout_s), bool(use_math_verify))
    except Exception:  # noqa: BLE001
        return False


def answer_anywhere(text: str | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The answer math_verify's parse finds anywhere in `text` ("The answer is $42$." -> "42", a
    program's "42\nDone" -> "42"), as the reference system reads answers ("" for none; \boxed{} or
    the fallback's reading when math_verify cannot run)."""
    if not isinstance(text, str) or not text.strip():
        return ""
    found = _WORKER.extract(text, timeout_s)
    if found is None and _WORKER.unavailable:
        found = extract_boxed(text)
    return found or ""


def verify_as_written(gold_text: str | None, target_text: str | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """math_verify's `verify(parse(gold_text), parse(target_text))` on the texts as they are, as the reference
    system grades (docs/paper.md, "Recipes", row 10): nothing is wrapped in `$`, so a bare LaTeX ground truth
    (`\\dfrac{1}{2}`, `2\\sqrt{3}`) parses to nothing or to a part of it, and no normalizing fallback; an
    undecided or timed-out comparison is False. Raises when math_verify cannot run here: this grading is
    math_verify's alone."""
    if not isinstance(gold_text, str) or not isinstance(target_text, str) or not gold_text.strip() \
            or not target_text.strip():
        return False
    return _verify_as_written_cached(gold_text, target_text, float(timeout_s))


@functools.lru_cache(maxsize=1 << 14)
def _verify_as_written_cached(gold_text: str, target_text: str, timeout_s: float) -> bool:
    reply = _WORKER.as_written(gold_text, target_text, timeout_s)
    if reply is None:
        raise RuntimeError("grading as the reference does (env.kwargs.verify_as_written) needs math_verify, which "
                           "cannot run here: pip install math-verify")
    return reply


def grade_many(preds: Sequence[str | None], references: Sequence[str], **kwargs) -> list[bool]:
    return [grade(p, r, **kwargs) for p, r in zip(preds, references)]
