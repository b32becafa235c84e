"""The paper's data sets that are too big to ship: where each lives on the Hugging Face hub and how
its rows become the project's records (docs/data.md has the column mapping and licenses).

Records written (one JSON object per line):
- math: {"id", "problem", "answer"} (answer a string);
- search: {"id", "question", "answers"} (answers a list of strings); search_corpus: {"id", "title", "text"};
- code: {"id", "kind", "question", "starter_code", "setup", "tests", "solutions", "incorrect_solutions",
  "source", "difficulty"}; kind "io": tests are [{"input", "output"}] (stdin -> expected stdout);
  kind "function": tests are assert statements run after the program (with `setup` before it).
  solutions / incorrect_solutions are Python 3 programs known to pass / fail (where the source has them).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import pickle
import zlib
from typing import Any, Callable, Iterable, Iterator

from atgrpo_jax.data.readers import DataError

MAX_SOLUTIONS = 5  # reference programs kept per problem (CodeContests has hundreds)
CC_PYTHON3 = 3  # deepmind/code_contests language ids: 0 unknown, 1 Python 2, 2 C++, 3 Python 3, 4 Java
LEETCODE_SETUP = ("from typing import *\nfrom collections import *\nfrom functools import *\nfrom itertools import *\n"
                  "from heapq import *\nfrom bisect import *\nfrom math import *\nimport math, string, re\n")


@dataclasses.dataclass(frozen=True)
class PaperSet:
    name: str  # the file written: NAME.jsonl
    task: str  # "math", "code", "search" (questions) or "search_corpus" (passages)
    repo: str  # Hugging Face dataset id
    patterns: tuple[str, ...]  # files of the repository to read (fnmatch)
    convert: Callable[[Iterable[dict]], Iterator[dict]]
    about: str  # one line for `list` and docs
    license: str
    columns: tuple[str, ...] | None = None  # parquet columns to read (None: all)


def _first(row: dict, keys: Iterable[str], default: Any = None) -> Any:
    return next((row[k] for k in keys if k in row and row[k] is not None), default)


def _text(value: Any) -> str:
    """A test's input or output as text: lists of lines are joined (APPS stores both forms)."""
    if isinstance(value, (list, tuple)):
        return "\n".join(str(v) for v in value)
    return "" if value is None else str(value)


# ---------------------------------------------------------------- math

def _math(prefix: str, problem_keys=("problem", "Problem", "question"), answer_keys=("answer", "Answer"),
          id_keys=("id", "ID")) -> Callable[[Iterable[dict]], Iterator[dict]]:
    def convert(rows):
        seen = set()  # a repository may hold the same problems twice (JSON and parquet copies)
        for i, row in enumerate(rows):
            problem, answer = _first(row, problem_keys), _first(row, answer_keys)
            if isinstance(answer, (list, tuple)):  # OlympiadBench: final_answer is a list
                answer = ", ".join(str(a) for a in answer)
            if problem is None or answer is None or str(answer).strip() == "" or str(problem).strip() in seen:
                continue
            seen.add(str(problem).strip())
            ident = _first(row, id_keys)
            yield {"id": f"{prefix}-{ident if ident is not None else i}", "problem": str(problem).strip(),
                   "answer": str(answer).strip()}
    return convert


# ---------------------------------------------------------------- code

def _code(ident, kind, question, tests, starter="", setup="", solutions=(), incorrect=(), source="", difficulty=""):
    return {"id": str(ident), "kind": kind, "question": question.strip(), "starter_code": starter or "",
            "setup": setup, "tests": tests, "solutions": list(solutions)[:MAX_SOLUTIONS],
            "incorrect_solutions": list(incorrect)[:MAX_SOLUTIONS], "source": source, "difficulty": str(difficulty)}


def _python3(programs: dict | None) -> list[str]:
    programs = programs or {}
    return [code for lang, code in zip(programs.get("language") or [], programs.get("solution") or [])
            if lang == CC_PYTHON3]


def _codecontests(tests_field: str):
    """deepmind/code_contests -> io problems. As the reference prepares it: the training split is
    graded on `private_tests`, the test split on `public_tests`; problems without tests are dropped."""
    def convert(rows):
        for row in rows:
            tests = row.get(tests_field) or {}
            pairs = [{"input": i, "output": o} for i, o in zip(tests.get("input") or [], tests.get("output") or [])]
            if not pairs or row.get("input_file") or row.get("output_file"):  # file I/O problems: not stdin
                continue
            yield _code(row["name"], "io", row.get("description") or "", pairs,
                        solutions=_python3(row.get("solutions")), incorrect=_python3(row.get("incorrect_solutions")),
                        source="code_contests", difficulty=row.get("difficulty", ""))
    return convert


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench pickles a JSON string; anything that would import a class is refused."""
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def lcb_tests(raw: str, where: str = "livecodebench") -> list[dict]:
    """LiveCodeBench test cases: a JSON list, or that JSON pickled, zlib-compressed and base64-encoded."""
    if not raw:
        return []
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        text = _StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(raw.encode("utf-8"))))).load()
        return json.loads(text)
    except (pickle.UnpicklingError, zlib.error, binascii.Error, ValueError, TypeError, EOFError) as e:
        raise DataError(f"{where}: test cases are neither JSON nor a pickled JSON string ({e})") from None


def _call_assert(call: str, args: list, expected: Any, loose_list: bool = False) -> str:
    got = f"{call}({', '.join(repr(a) for a in args)})"
    if loose_list:  # APPS's checker also accepts the value wrapped in a one-element list
        return f"assert (lambda got, want: got == want or [got] == want)({got}, {expected!r})"
    return f"assert {got} == {expected!r}"


def _livecodebench(rows):
    """livecodebench/code_generation_lite -> io (AtCoder, Codeforces) or function (LeetCode) problems.
    As the reference: the title and statement, graded on the public tests (the private ones when
    there are none). LeetCode problems call Solution().<func_name>(args) on JSON arguments."""
    for row in rows:
        question = "\n\n".join(p for p in (row.get("question_title") or "", row.get("question_content") or "") if p)
        where = f"livecodebench question {row.get('question_id', '?')}"
        tests = lcb_tests(row.get("public_test_cases") or "", where) or \
            lcb_tests(row.get("private_test_cases") or "", where)
        meta = row.get("metadata") or "{}"
        meta = json.loads(meta) if isinstance(meta, str) else meta
        functional = any(t.get("testtype") == "functional" for t in tests)
        if functional:
            func = meta.get("func_name")
            try:
                tests = [_call_assert(f"Solution().{func}", [json.loads(a) for a in t["input"].split("\n")
                                                             if a.strip()], json.loads(t["output"])) for t in tests]
            except (json.JSONDecodeError, KeyError):
                continue
            if not func:
                continue
        else:
            tests = [{"input": t["input"], "output": t["output"]} for t in tests]
        if tests:
            yield _code(row.get("question_id", ""), "function" if functional else "io", question, tests,
                        starter=row.get("starter_code") or "", setup=LEETCODE_SETUP if functional else "",
                        source=f"livecodebench/{row.get('platform', '')}", difficulty=row.get("difficulty", ""))


def _apps_test500(rows):
    """codeparrot/apps test.jsonl -> the reference's APPS test set: its first 500 problems that have
    tests. Stdin problems are io; call-based ones (input_output has fn_name) are function problems."""
    kept = 0
    for row in rows:
        if kept == 500:
            return
        try:
            spec = json.loads(row.get("input_output") or "{}")
            solutions = json.loads(row.get("solutions") or "[]")
        except json.JSONDecodeError:
            continue
        inputs, outputs, fn = spec.get("inputs") or [], spec.get("outputs") or [], spec.get("fn_name")
        if not inputs or len(inputs) != len(outputs):
            continue
        starter = row.get("starter_code") or ""
        if fn:
            call = f"Solution().{fn}" if "class Solution" in starter else fn
            tests = [_call_assert(call, list(i) if isinstance(i, list) else [i], o, loose_list=True)
                     for i, o in zip(inputs, outputs)]
        else:
            tests = [{"input": _text(i), "output": _text(o)} for i, o in zip(inputs, outputs)]
        kept += 1
        yield _code(f"apps-{row.get('problem_id', kept)}", "function" if fn else "io", row.get("question") or "",
                    tests, starter=starter, solutions=solutions, source="apps", difficulty=row.get("difficulty", ""))


CC_COLUMNS = ("name", "description", "public_tests", "private_tests", "solutions", "incorrect_solutions", "difficulty",
              "input_file", "output_file")

# ---------------------------------------------------------------- search QA

FLASHRAG = "RUC-NLPIR/FlashRAG_datasets"  # the question sets as Search-R1 (and the reference) read them


def _qa(prefix: str) -> Callable[[Iterable[dict]], Iterator[dict]]:
    """{"id", "question", "answers": [...]} from rows with a question and golden_answers (or answer(s))."""
    def convert(rows):
        for i, row in enumerate(rows):
            question, golds = _first(row, ("question",)), _first(row, ("golden_answers", "answers", "answer"))
            if not question or golds in (None, "", []):
                continue
            golds = golds if isinstance(golds, (list, tuple)) else [golds]
            yield {"id": f"{prefix}-{row.get('id', i)}", "question": str(question), "answers": [str(g) for g in golds]}
    return convert


def _passages(rows: Iterable[dict]) -> Iterator[dict]:
    """{"id", "title", "text"} from Wikipedia dump rows {"id", "contents": '"Title"\ntext'}."""
    for i, row in enumerate(rows):
        title, _, text = str(row.get("contents", "")).partition("\n")
        if text:
            yield {"id": str(row.get("id", i)), "title": title.strip('"'), "text": text}


PAPER_SETS = {s.name: s for s in (
    PaperSet("polaris", "math", "POLARIS-Project/Polaris-Dataset-53K", ("*.jsonl",), _math("polaris"),
             "Polaris-53K: the paper's math training set (53K problems)", "Apache-2.0"),
    PaperSet("aime24", "math", "Maxwell-Jia/AIME_2024", ("*.parquet",), _math("aime24"),
             "AIME 2024 (30); shipped too, as envs/data/math/aime24.jsonl", "MIT (the copy); problems (c) MAA"),
    PaperSet("aime25", "math", "yentinglin/aime_2025", ("data/*.parquet",), _math("aime25"),
             "AIME 2025 (30); shipped too, as envs/data/math/aime25.jsonl", "none stated; problems (c) MAA"),
    PaperSet("olympiadbench", "math", "Hothan/OlympiadBench",
             tuple(f"*OE_TO_maths_en_COMP*{ext}" for ext in (".parquet", ".json", ".jsonl")),
             _math("olympiadbench", ("question", "problem"), ("final_answer", "answer")),
             "OlympiadBench OE_TO_maths_en_COMP (675); shipped too (674)", "Apache-2.0 (the hub copy)"),
    PaperSet("codecontests_train", "code", "deepmind/code_contests", ("data/train-*.parquet",),
             _codecontests("private_tests"), "CodeContests training split: the paper's code training set",
             "CC-BY-4.0", CC_COLUMNS),
    PaperSet("codecontests_test", "code", "deepmind/code_contests", ("data/test-*.parquet",),
             _codecontests("public_tests"), "CodeContests test split (165)", "CC-BY-4.0", CC_COLUMNS),
    PaperSet("livecodebench", "code", "livecodebench/code_generation_lite", ("test6.jsonl",), _livecodebench,
             "LiveCodeBench code_generation_lite, the problems added in release_v6 (test6.jsonl), as the reference",
             "CC (the data card says `cc`)"),
    PaperSet("apps_test500", "code", "codeparrot/apps", ("test.jsonl",), _apps_test500,
             "APPS test.jsonl, its first 500 problems with tests, as the reference", "MIT"),
    PaperSet("search_train_nq_hotpotqa", "search", FLASHRAG, ("nq/train.jsonl", "hotpotqa/train.jsonl"),
             _qa("train"), "Natural Questions and HotpotQA training questions (Search-R1's training mix)",
             "CC-BY-SA-3.0 (NQ), CC-BY-SA-4.0 (HotpotQA)"),
    PaperSet("bamboogle", "search", FLASHRAG, ("bamboogle/test.jsonl",), _qa("bamboogle"),
             "Bamboogle (125 two-hop questions): the reference's default search benchmark", "MIT"),
    PaperSet("2wikimultihopqa", "search", FLASHRAG, ("2wikimultihopqa/dev.jsonl",), _qa("2wiki"),
             "2WikiMultihopQA development questions", "Apache-2.0"),
    PaperSet("hotpotqa", "search", FLASHRAG, ("hotpotqa/dev.jsonl",), _qa("hotpotqa"),
             "HotpotQA development questions", "CC-BY-SA-4.0"),
    PaperSet("musique", "search", FLASHRAG, ("musique/dev.jsonl",), _qa("musique"),
             "MuSiQue development questions", "CC-BY-4.0"),
    PaperSet("wiki18", "search_corpus", "PeterJinGo/wiki-18-corpus", ("wiki-18.jsonl.gz",), _passages,
             "Wikipedia (Dec 2018) in 100-word passages, 21M: the corpus Search-R1 retrieves from", "CC-BY-SA-3.0"),
)}
