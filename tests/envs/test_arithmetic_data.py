"""envs/data/arithmetic: the shipped files are what make.py writes, every answer is the arithmetic's, and no
held-out problem's numbers appear in a training row."""
import importlib.util
import json
import os
import re

from atgrpo_jax.envs.text_state import DATA_DIR

HERE = DATA_DIR / "arithmetic"


def rows(path):
    return [json.loads(line) for line in open(path)]


def test_make_py_rewrites_the_shipped_files_byte_for_byte(tmp_path):
    spec = importlib.util.spec_from_file_location("make_arithmetic", HERE / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    make.main(out=str(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert names == ["expressions_test.jsonl", "expressions_train.jsonl", "test.jsonl", "train.jsonl"]
    for name in names:
        assert (tmp_path / name).read_bytes() == (HERE / name).read_bytes(), name


def test_expressions_are_right_and_held_out():
    numbers = lambda r: tuple(sorted(map(int, re.findall(r"\d+", r["problem"]))))  # noqa: E731
    split = {s: rows(HERE / f"expressions_{s}.jsonl") for s in ("train", "test")}
    for r in split["train"] + split["test"]:
        m = re.fullmatch(r"Compute (\d+) ([+*]) (\d+)(?: \+ (\d+))?\.", r["problem"])
        a, op, b, c = m.groups()
        want = int(a) * int(b) if op == "*" else int(a) + int(b) + int(c)
        assert (op == "*") == (c is None) and r["answer"] == str(want), r
    assert len(split["test"]) == 64 and sum("*" in r["problem"] for r in split["test"]) == 32
    assert len(split["train"]) > 400 and len({r["problem"] for r in split["train"]}) == len(split["train"])
    assert not {numbers(r) for r in split["test"]} & {numbers(r) for r in split["train"]}
