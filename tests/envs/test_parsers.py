"""Parsers on hostile, malformed and random outputs: right answers, zero exceptions."""
import random
import time

import pytest

from atgrpo_jax.envs.parsers import (
    MAX_TEXT_CHARS, extract_after_marker, extract_boxed, extract_code_block, extract_test_cases,
    fenced_blocks, parse_list)

PARSERS = [extract_code_block, extract_boxed, extract_test_cases, extract_after_marker, parse_list, fenced_blocks]


# ---------------------------------------------------------------- code blocks
def test_code_block_takes_the_last_python_block():
    text = "Draft:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\nDone."
    assert extract_code_block(text) == "print(2)"
    assert extract_code_block(text, which="first") == "print(1)"


def test_code_block_variants():
    assert extract_code_block("```py\nx = 1\n```") == "x = 1"
    assert extract_code_block("~~~python\nx = 2\n~~~") == "x = 2"
    assert extract_code_block("```\nx = 3\n```") == "x = 3"  # no language tag
    assert extract_code_block("```python\nx = 4\nprint(x)") == "x = 4\nprint(x)"  # unterminated
    assert extract_code_block("```python\nprint(5)```") == "print(5)"  # fence glued to the code
    assert extract_code_block("```python\r\nx = 6\r\n```") == "x = 6"
    assert extract_code_block("````python\ns = '```'\n````") == "s = '```'"  # longer fence
    # A python-tagged block wins over untagged ones and other languages.
    assert extract_code_block("```python\na\n```\n```\nb\n```\n```bash\nls\n```") == "a"
    assert extract_code_block("```bash\nrm -rf /\n```") is None
    assert extract_code_block("```python\n\n```") is None
    assert extract_code_block("no code here") is None


def test_code_block_keeps_inner_markers():
    code = "#### not an answer\nprint('\\\\boxed{1}')\nprint('**Test Input:**')"
    assert extract_code_block(f"```python\n{code}\n```\n#### [1]") == code


# ---------------------------------------------------------------- boxed
@pytest.mark.parametrize("text,expected", [
    (r"The answer is \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"first \boxed{1} then \boxed{2}", "2"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"\boxed{a} and \boxed{b", "a"),  # the last box is unterminated
    (r"\fbox{x^{2}}", "x^{2}"),
    (r"\boxed {7}", "7"),
    (r"$\boxed 5$.", "5"),
    (r"\boxed{}", None),
    (r"\boxedx{3}", None),
    ("", None),
    (r"\boxed{\text{(A) } \left( 1, 2 \right)}", r"\text{(A) } \left( 1, 2 \right)"),
    (r"\boxed{ 𝟙 ∞ é }", "𝟙 ∞ é"),
])
def test_boxed(text, expected):
    assert extract_boxed(text) == expected


def _reference_boxed(text):
    """Plain character walk: last \\boxed/\\fbox with balanced braces (escapes skip a char)."""
    import re
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)\b[ \t]*", text))):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                c = text[j]
                if c == "\\":
                    j += 2
                    continue
                depth += (c == "{") - (c == "}")
                if depth == 0:
                    break
                j += 1
            if j < len(text) and text[i + 1:j].strip():
                return text[i + 1:j].strip()
        else:
            token = re.match(r"[^\s$]*", text[i:]).group().rstrip(".,;")
            if token:
                return token
    return None


# ---------------------------------------------------------------- test cases
def test_test_cases_fenced_and_plain():
    text = ("Here are tests.\n**Test Input:**\n```\n3\n1 2 3\n```\n**Test Output:**\n```\n6\n```\n\n"
            "**Test Input:**\n5 5\n**Test Output:**\n10\n"
            "**Test Input:** ```7``` **Test Output:** ```49```\n"
            "**Test Input:**\n```\n1\n```\n")  # dangling input without output is dropped
    assert extract_test_cases(text) == [("3\n1 2 3", "6"), ("5 5", "10"), ("7", "49")]


def test_test_cases_marker_spellings_and_limits():
    text = "Test input: 1\nTEST OUTPUT: 2\n**Test Output:** 9\n**Test Input**: 3\n**Test Output**: 4"
    assert extract_test_cases(text) == [("1", "2"), ("3", "4")]  # an output without input is ignored
    many = "".join(f"**Test Input:**\n{i}\n**Test Output:**\n{i * i}\n" for i in range(100))
    assert len(extract_test_cases(many)) == 32
    assert extract_test_cases(many, max_cases=3) == [("0", "0"), ("1", "1"), ("2", "4")]
    assert extract_test_cases("**Test Input:**```\n") == []


# ---------------------------------------------------------------- marker, lists
def test_after_marker_ignores_code_and_takes_last():
    text = "#### [0]\n```python\n#### [9]\nprint(1)\n```\nreasoning\n#### [1, 2]\n"
    assert extract_after_marker(text) == "[1, 2]"
    assert extract_after_marker("```python\n#### [9]\n```") is None
    assert extract_after_marker("####\n\n  [3] \n") == "[3]"
    assert extract_after_marker("answer: 5") is None
    assert extract_after_marker("#### 42", marker="") is None
    assert extract_after_marker("Final: 7\nFinal: 8", marker="Final:") == "8"


def test_parse_list():
    assert parse_list('#### ["U", "D", "L"]') == ["U", "D", "L"]
    assert parse_list("[1, [2, 3]] [4]") == [1, [2, 3]]
    assert parse_list("**Actions List**: [U, D] then ['R']") == ["R"]  # bare names are not literals
    assert parse_list("[true, null]") == [True, None]  # JSON
    assert parse_list("[__import__('os')]") is None
    assert parse_list("[" * 5000 + "]" * 5000) is None
    assert parse_list("no list") is None


# ---------------------------------------------------------------- hostile inputs
HOSTILE = [
    "", " ", "\n" * 1000, None, 123, b"```python\nprint(1)\n```", bytearray(b"\xff\xfe"), ["list"],
    "```", "```python", "~~~\n~~~\n~~~", "\\boxed{" * 10000, "}" * 10000 + "\\boxed{1}",
    "\\boxed{\\}", "\\\\boxed{1}", "#### " * 1000, "**Test Input:**" * 1000, "\udcff\ud800 surrogate",
    "\x00\x01\x02 control", "🙂" * 5000, "[" * 100000, "```python\n" + "#### x\n" * 1000,
]


@pytest.mark.parametrize("parser", PARSERS, ids=lambda f: f.__name__)
def test_hostile_inputs_never_raise(parser):
    for text in HOSTILE:
        parser(text)


@pytest.fixture(scope="module")
def ten_megabytes():
    pieces = ["```python\n", "\\boxed{", "{", "**Test Input:**\n", "#### ", "[", "x = 1\n", "é🙂"]
    rng = random.Random(0)
    return "".join(rng.choices(pieces, k=1_500_000))[: 10 * 1024 * 1024]


@pytest.mark.parametrize("parser", PARSERS, ids=lambda f: f.__name__)
def test_ten_megabytes_is_fast(parser, ten_megabytes):
    big = ten_megabytes
    assert len(big) > 5 * MAX_TEXT_CHARS
    started = time.perf_counter()
    parser(big)
    assert time.perf_counter() - started < 1.0


def test_the_tail_is_what_counts_in_huge_text():
    big = "x" * (10 * MAX_TEXT_CHARS) + r" so \boxed{17}"
    assert extract_boxed(big) == "17"


TOKENS = ["```", "```python\n", "```py\n", "~~~", "\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "\\{", "\\}",
          "\\", "####", "**Test Input:**", "**Test Output:**", "[", "]", "'", '"', ",", "\n", "\r\n", " ",
          "\t", "$", "é", "ß", "中", "🙂", "\u200b", "\udcff", "\x00"]


def _random_text(rng):
    parts = []
    for _ in range(rng.randint(0, 60)):
        if rng.random() < 0.5:
            parts.append(rng.choice(TOKENS))
        else:
            parts.append("".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0x2FFF)]))
                                 for _ in range(rng.randint(1, 8))))
    return "".join(parts)


def test_fuzz_zero_exceptions_and_boxed_matches_reference():
    rng = random.Random(1234)
    for _ in range(3000):
        text = _random_text(rng)
        code = extract_code_block(text)
        assert code is None or (isinstance(code, str) and code.strip())
        assert extract_boxed(text) == _reference_boxed(text), text
        cases = extract_test_cases(text)
        assert all(isinstance(i, str) and isinstance(o, str) for i, o in cases)
        after = extract_after_marker(text)
        assert after is None or isinstance(after, str)
        value = parse_list(text)
        assert value is None or isinstance(value, list)


def test_fuzz_constructed_responses_recover_the_last_python_block():
    rng = random.Random(7)
    for _ in range(1000):
        pieces, last_python = [], None
        for _ in range(rng.randint(1, 5)):
            pieces.append(_random_text(rng).replace("`", "").replace("~", "") + "\n")
            tag = rng.choice(["python", "py", "bash", "text"])
            body = "\n".join(f"x{rng.randint(0, 99)} = {rng.randint(0, 9)}" for _ in range(rng.randint(1, 4)))
            pieces.append(f"```{tag}\n{body}\n```\n")
            if tag in ("python", "py"):
                last_python = body
        assert extract_code_block("".join(pieces)) == last_python
