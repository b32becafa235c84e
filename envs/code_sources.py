"""Code problems from prepared data sets and sources of your own (docs/data.md).

A record (the format `python -m atgrpo_jax.data prepare` writes, atgrpo_jax/data/paper_sets.py):
{"id", "question", "tests", "kind" ("io", default, or "function"), "starter_code", "setup",
"solutions", "incorrect_solutions"}. Only "question" and "tests" are required, and `fields` maps them to
a source's columns. io tests may be given as [{"input", "output"}, ...], as {"input": [...], "output":
[...]} (CodeContests), as {"inputs": [...], "outputs": [...]} (APPS), or as a JSON string of either;
function tests are assert statements.
"""
from __future__ import annotations

import json
from typing import Any

from atgrpo_jax.envs.code_mutants import MAX_KNOWN_WRONG

from atgrpo_jax.data import is_prepared_name, is_source, load_records, prepared_path


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def io_pairs(tests: Any, where: str) -> tuple[tuple[str, str], ...]:
    """(stdin, expected stdout) pairs from any of the forms in the module docstring."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: tests is a string but not JSON") from None
    if isinstance(tests, dict):
        ins = tests.get("input", tests.get("inputs"))
        outs = tests.get("output", tests.get("outputs"))
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise ValueError(f"{where}: tests needs equally long input/output lists")
        return tuple((_text(i), _text(o)) for i, o in zip(ins, outs))
    if isinstance(tests, list) and all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
        return tuple((_text(t["input"]), _text(t["output"])) for t in tests)
    raise ValueError(f"{where}: tests must be [{{'input', 'output'}}, ...] or {{'input': [...], 'output': [...]}}")


def problem_fields(record: dict, where: str) -> dict:
    """The fields of a code_problems.CodeProblem for one record."""
    kind = record.get("kind") or "io"
    if kind not in ("io", "function"):
        raise ValueError(f"{where}: kind must be 'io' or 'function', got {kind!r}")
    if kind == "io":
        tests = io_pairs(record["tests"], where)
    else:
        tests = tuple(str(t) for t in record["tests"])
    if not tests:
        raise ValueError(f"{where}: a problem needs at least one test")
    statement = str(record["question"])
    starter = record.get("starter_code") or ""
    if starter:
        statement += f"\n\nStart from this code:\n```python\n{starter.rstrip()}\n```"
    solutions = record.get("solutions") or ()
    if isinstance(solutions, str):  # APPS stores them as a JSON string
        solutions = json.loads(solutions)
    wrong = record.get("incorrect_solutions") or ()
    if isinstance(wrong, str):
        wrong = json.loads(wrong)
    return dict(id=str(record.get("id", where)), kind=kind, statement=statement, tests=tests,
                setup=record.get("setup") or "", solutions=tuple(solutions),
                wrong_solutions=tuple(wrong)[:MAX_KNOWN_WRONG])


def load_source_problems(name: str, fields: dict | None = None, data_dir: str = "",
                         shipped: tuple[str, ...] = ()) -> list[dict]:
    """A prepared set by name (from data_dir) or a source of your own (a file, directory or hf: name),
    as CodeProblem fields; `shipped` names the shipped sets for the error on an unknown name."""
    if is_prepared_name(name, "code"):
        source, fields = prepared_path(name, data_dir), None
    elif is_source(name):
        source = name
    else:
        raise ValueError(f"unknown code data set {name!r}; choose one of {list(shipped)}, a prepared set "
                         "(codecontests_train, codecontests_test, livecodebench, apps_test500), a .jsonl/.parquet "
                         "file, a save_to_disk directory or hf:org/name")
    records = load_records(source, ("question", "tests"), fields)
    return [problem_fields(r, f"{source}: record {n}") for n, r in enumerate(records, 1)]
