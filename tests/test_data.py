"""Data sources (jsonl, json, parquet, save_to_disk arrow, hf:org/name from the hub cache, a field
mapping) and `python -m atgrpo_jax.data prepare` on tiny files laid out as the hub lays them out, with
each data set's real column names and nesting, in a Hugging Face cache (`datasets--org--name/...`)."""
import base64
import hashlib
import json
import os
import pickle
import subprocess
import sys
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atgrpo_jax.data import DataError, load_records, require_prepared
from atgrpo_jax.data.paper_sets import lcb_tests
from atgrpo_jax.data.prepare import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = [{"question": "1+1?", "solution": "2", "level": 1}, {"question": "2+3?", "solution": "5", "level": 2}]
MAPPING = {"problem": "question", "answer": "solution"}


def parquet_bytes(rows):
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


def jsonl_bytes(rows):
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def save_to_disk(path, rows):
    """The layout of datasets' Dataset.save_to_disk: an arrow IPC stream, state.json, dataset_info.json."""
    os.makedirs(path)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(os.path.join(path, "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    json.dump({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"},
              open(os.path.join(path, "state.json"), "w"))
    json.dump({"features": {}}, open(os.path.join(path, "dataset_info.json"), "w"))


def hub_repo(cache, repo, files, revision="3f5a" * 10):
    """A data set in the hub cache as huggingface_hub leaves it: blobs named by hash, a snapshot of
    symlinks to them, refs/main naming the snapshot."""
    base = os.path.join(cache, "datasets--" + repo.replace("/", "--"))
    for rel, data in files.items():
        blob = os.path.join(base, "blobs", hashlib.sha256(data).hexdigest())
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        open(blob, "wb").write(data)
        link = os.path.join(base, "snapshots", revision, rel)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    os.makedirs(os.path.join(base, "refs"), exist_ok=True)
    open(os.path.join(base, "refs", "main"), "w").write(revision)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    cache = str(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_local_formats_read_alike_with_a_field_mapping(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes(ROWS))
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    (tmp_path / "a.parquet").write_bytes(parquet_bytes(ROWS))
    (tmp_path / "a.csv").write_text('question,solution,level\n1+1?,2,1\n"2+3?",5,2\n')
    save_to_disk(str(tmp_path / "saved"), ROWS)
    for name in ("a.jsonl", "a.json", "a.parquet", "saved", "a.csv"):
        records = load_records(str(tmp_path / name), ("problem", "answer"), MAPPING)
        level = str if name.endswith(".csv") else int  # a CSV's columns are text
        assert [(r["problem"], r["answer"], r["level"]) for r in records] == [("1+1?", "2", level(1)),
                                                                              ("2+3?", "5", level(2))], name
    with pytest.raises(DataError, match=r"a.parquet: record 1 has no field 'problem'; map it with "
                                         r"env.kwargs.fields=.*its fields: question, solution, level$"):
        load_records(str(tmp_path / "a.parquet"), ("problem",))
    with pytest.raises(DataError, match="'nope' for 'answer'|no field 'nope'"):
        load_records(str(tmp_path / "a.jsonl"), ("answer",), {"answer": "nope"})
    with pytest.raises(DataError, match="does not exist"):
        load_records(str(tmp_path / "missing.parquet"), ("problem",))
    from atgrpo_jax.envs.code_workflow import CodeWorkflow

    code = [{"prompt": f"Print {n}.", "cases": json.dumps({"inputs": [""], "outputs": [f"{n}\n"]})} for n in range(3)]
    (tmp_path / "mine.parquet").write_bytes(parquet_bytes(code))
    mine = str(tmp_path / "mine.parquet")
    wf = CodeWorkflow(train_sets=(mine,), test_sets=("humaneval", mine), fields={"question": "prompt", "tests": "cases"})
    assert wf.test_splits == ("humaneval", "mine") and wf.splits == {"valid": 1, "humaneval": 164, "mine": 3}
    assert [(p.kind, p.statement, p.tests) for p in wf._pool("mine")][2] == ("io", "Print 2.", (("", "2\n"),))
    os.makedirs(tmp_path / "dd")
    json.dump({"splits": ["train", "test"]}, open(tmp_path / "dd" / "dataset_dict.json", "w"))
    with pytest.raises(DataError, match=r"holds the splits train, test .*name one, e.g. .*dd/train"):
        load_records(str(tmp_path / "dd"), ("problem",))


def test_hf_names_come_from_the_hub_cache_and_feed_a_workflow(hub, monkeypatch):
    from atgrpo_jax.envs.math_workflow import MathWorkflow

    card = ("---\nconfigs:\n- config_name: easy\n  data_files:\n  - split: train\n    path: easy/train-*\n"
            "  - split: test\n    path: easy/test.jsonl\n- config_name: hard\n  data_files: hard/*.parquet\n"
            "- config_name: deep\n  data_dir: deep/v1\n---\n# toy\n")
    hub_repo(hub, "org/toy", {"README.md": card.encode(), "easy/train-00000-of-00001.parquet": parquet_bytes(ROWS),
                              "easy/test.jsonl": jsonl_bytes(ROWS[:1]), "hard/x.parquet": parquet_bytes(ROWS[1:]),
                              "deep/v1/test.jsonl": jsonl_bytes(ROWS[1:]), "deep/v1/train.jsonl": jsonl_bytes(ROWS)})
    hub_repo(hub, "org/plain", {"data/train-00000-of-00002.parquet": parquet_bytes(ROWS[:1]),
                                "data/train-00001-of-00002.parquet": parquet_bytes(ROWS[1:]),
                                "data/test-00000-of-00001.parquet": parquet_bytes(ROWS[:1])})
    first = lambda src: [r["problem"] for r in load_records(src, ("problem",), MAPPING)]  # noqa: E731
    assert first("hf:org/toy") == ["1+1?", "2+3?"]  # the first config, its train split
    assert first("hf:org/toy:easy:test") == ["1+1?"] and first("hf:org/toy:hard") == ["2+3?"]
    assert first("hf:org/toy:deep:test") == ["2+3?"]  # a config that names a data_dir
    assert first("hf:org/plain") == ["1+1?", "2+3?"] and first("hf:org/plain::test") == ["1+1?"]  # shards in order
    assert first(f"hf:org/plain@{'3f5a' * 10}::test") == ["1+1?"]
    with pytest.raises(DataError, match="no config 'medium'; the data card has easy, hard, deep"):
        first("hf:org/toy:medium")
    with pytest.raises(DataError, match="no split 'dev'; it has test, train"):
        first("hf:org/plain::dev")
    with pytest.raises(DataError, match=r"^org/absent: not in the Hugging Face cache .* HF_HUB_OFFLINE=1: "
                                         r"run `hf download --repo-type dataset org/absent`"):
        first("hf:org/absent")
    hub_repo(hub, "org/scripted", {"scripted.py": b"import datasets\n", "README.md": b"# no configs\n"})
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(DataError, match=r'no parquet, JSON, CSV or arrow files; reading it needs the `datasets` '
                                         r'library: pip install -e "\.\[data\]"$'):
        first("hf:org/scripted")
    wf = MathWorkflow(train_path="hf:org/plain", test_sets=(), test_path="hf:org/toy:easy:test", fields=MAPPING)
    assert wf.test_splits == ("toy_easy_test",) and wf.splits == {"valid": 1, "toy_easy_test": 1}
    assert wf.reset([0], "train")["reference"][0] == "5"


# ---------------------------------------------------------------- the paper's sets, as the hub has them

def _cc_row(name, public, private, solutions, incorrect):
    tests = lambda pairs: {"input": [i for i, _ in pairs], "output": [o for _, o in pairs]}  # noqa: E731
    programs = lambda ps: {"language": [lang for lang, _ in ps], "solution": [c for _, c in ps]}  # noqa: E731
    return {"name": name, "description": f"{name}: read a and b, print a+b.", "public_tests": tests(public),
            "private_tests": tests(private), "generated_tests": tests([("0 0\n", "0\n")]), "source": 2,
            "difficulty": 7, "solutions": programs(solutions), "incorrect_solutions": programs(incorrect),
            "cf_contest_id": 1, "cf_index": "A", "cf_points": 500.0, "cf_rating": 800, "cf_tags": ["math"],
            "is_description_translated": False, "untranslated_description": "",
            "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256000000, "input_file": "",
            "output_file": ""}


SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
CODE_CONTESTS = [  # CodeContests' columns; languages: 1 Python 2, 2 C++, 3 Python 3
    _cc_row("1_A. Sum", [("1 2\n", "3\n")], [("2 2\n", "4\n"), ("5 6\n", "11\n")],
            [(1, "print 3"), (2, "int main(){}"), (3, SUM)], [(3, "print(0)\n")]),
    _cc_row("2_B. No tests", [], [], [(3, SUM)], []),
    _cc_row("3_C. Sum again", [("3 4\n", "7\n")], [("1 1\n", "2\n")], [(3, SUM)], [(3, "print(7)\n")]),
]
LCB_PRIVATE = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(
    [{"input": "5\n", "output": "25\n", "testtype": "stdin"}])))).decode()
LIVECODEBENCH = [  # code_generation_lite's fields; test cases are JSON strings, private ones may be compressed
    {"question_title": "Square", "question_content": "Print N squared.", "platform": "atcoder", "question_id": "abc1_a",
     "contest_id": "abc1", "contest_date": "2025-02-01T00:00:00", "starter_code": "", "difficulty": "easy",
     "public_test_cases": json.dumps([{"input": "3\n", "output": "9\n", "testtype": "stdin"}]),
     "private_test_cases": LCB_PRIVATE, "metadata": "{}"},
    {"question_title": "Sum list", "question_content": "Return the sum of nums.", "platform": "leetcode",
     "question_id": "3000", "contest_id": "weekly-1", "contest_date": "2025-03-01T00:00:00",
     "starter_code": "class Solution:\n    def total(self, nums: List[int]) -> int:\n        ", "difficulty": "easy",
     "public_test_cases": json.dumps([{"input": "[1, 2, 3]", "output": "6", "testtype": "functional"}]),
     "private_test_cases": "", "metadata": json.dumps({"func_name": "total"})},
    {"question_title": "Hidden", "question_content": "Print N squared.", "platform": "codeforces", "question_id": "1A",
     "contest_id": "1", "contest_date": "2025-04-01T00:00:00", "starter_code": "", "difficulty": "medium",
     "public_test_cases": "[]", "private_test_cases": LCB_PRIVATE, "metadata": "{}"},
]
APPS = [  # codeparrot/apps test.jsonl: solutions and input_output are JSON strings
    {"problem_id": 0, "question": "Print n+1.", "solutions": json.dumps(["print(int(input())+1)"]),
     "input_output": json.dumps({"inputs": ["1\n", "41\n"], "outputs": ["2\n", "42\n"]}),
     "difficulty": "interview", "url": "https://codeforces.com/problemset/problem/1/A", "starter_code": ""},
    {"problem_id": 1, "question": "Double x.", "solutions": json.dumps(["def double(x):\n    return 2*x"]),
     "input_output": json.dumps({"fn_name": "double", "inputs": [[3], [5]], "outputs": [[6], 10]}),
     "difficulty": "introductory", "url": "https://www.codewars.com/kata/1", "starter_code": "def double(x):"},
]
OLYMPIAD = [{"id": 2231, "question": "Find x if 2x = 6.", "solution": ["x = 3"], "final_answer": ["$3$"],
             "context": None, "image_1": None, "modality": "Text-only", "difficulty": "Competition",
             "is_multiple_answer": False, "unit": None, "answer_type": "Numerical", "error": None,
             "question_type": "Open-ended", "subfield": "Algebra", "subject": "Math", "language": "English"},
            {"id": 2232, "question": "Roots of x^2 = 1?", "solution": ["..."], "final_answer": ["$1$", "$-1$"],
             "context": None, "image_1": None, "modality": "Text-only", "difficulty": "Competition",
             "is_multiple_answer": True, "unit": None, "answer_type": "Numerical", "error": None,
             "question_type": "Open-ended", "subfield": "Algebra", "subject": "Math", "language": "English"}]


@pytest.fixture
def paper_hub(hub):
    hub_repo(hub, "deepmind/code_contests", {
        "README.md": b"---\nlicense: cc-by-4.0\n---\n",
        "data/test-00000-of-00001-9c49eeff30aacaa8.parquet": parquet_bytes(CODE_CONTESTS),
        "data/train-00000-of-00039-e991a271dbfa9925.parquet": parquet_bytes(CODE_CONTESTS[:1]),
        "data/train-00001-of-00039-e092fe56fda18715.parquet": parquet_bytes(CODE_CONTESTS[2:])})
    hub_repo(hub, "livecodebench/code_generation_lite", {"test6.jsonl": jsonl_bytes(LIVECODEBENCH),
                                                         "test.jsonl": jsonl_bytes(LIVECODEBENCH[:1])})
    hub_repo(hub, "codeparrot/apps", {"test.jsonl": jsonl_bytes(APPS), "train.jsonl": jsonl_bytes(APPS[:1])})
    hub_repo(hub, "POLARIS-Project/Polaris-Dataset-53K", {"polaris-data-53K.jsonl": jsonl_bytes(
        [{"problem": "What is 6*7?", "answer": "42", "difficulty": "3/8"}, {"problem": "1+1?", "answer": "2",
                                                                            "difficulty": "8/8"}])})
    hub_repo(hub, "Maxwell-Jia/AIME_2024", {"aime_2024_problems.parquet": parquet_bytes(
        [{"ID": "2024-I-1", "Problem": "Find 204.", "Solution": "...", "Answer": 204}])})
    hub_repo(hub, "yentinglin/aime_2025", {"data/train-00000-of-00001.parquet": parquet_bytes(
        [{"problem": "Find 70.", "answer": "70", "id": "I-1"}]), "part1/train-00000-of-00001.parquet": b"ignored"})
    hub_repo(hub, "Hothan/OlympiadBench", {  # JSON as released, and the hub's parquet copy of it: read once
        "OlympiadBench/OE_TO_maths_en_COMP/OE_TO_maths_en_COMP.json": json.dumps(OLYMPIAD).encode(),
        "OE_TO_maths_en_COMP/train/0000.parquet": parquet_bytes(OLYMPIAD),
        "OlympiadBench/OE_TO_physics_en_COMP/OE_TO_physics_en_COMP.json": b"[]"})
    return hub


def test_prepare_converts_each_paper_set_from_the_hubs_layout(paper_hub, tmp_path):
    from atgrpo_jax.envs.code_problems import load_problems, run_tests

    out = str(tmp_path / "data")
    read = lambda name: [json.loads(line) for line in open(prepare(name, out)[0])]  # noqa: E731
    assert read("polaris") == [{"id": "polaris-0", "problem": "What is 6*7?", "answer": "42"},
                               {"id": "polaris-1", "problem": "1+1?", "answer": "2"}]
    assert read("aime24") == [{"id": "aime24-2024-I-1", "problem": "Find 204.", "answer": "204"}]
    assert [r["answer"] for r in read("aime25")] == ["70"]
    assert [r["answer"] for r in read("olympiadbench")] == ["$3$", "$1$, $-1$"]
    test = read("codecontests_test")  # graded on public tests; a problem without tests is dropped
    assert [(r["id"], r["tests"]) for r in test] == [("1_A. Sum", [{"input": "1 2\n", "output": "3\n"}]),
                                                     ("3_C. Sum again", [{"input": "3 4\n", "output": "7\n"}])]
    assert test[0]["solutions"] == [SUM] and test[0]["incorrect_solutions"] == ["print(0)\n"]  # Python 3 only
    train = read("codecontests_train")  # every shard, in order, graded on private tests
    assert [len(r["tests"]) for r in train] == [2, 1]
    lcb = read("livecodebench")  # test6.jsonl only
    assert [(r["kind"], r["id"]) for r in lcb] == [("io", "abc1_a"), ("function", "3000"), ("io", "1A")]
    assert lcb[1]["tests"] == ["assert Solution().total([1, 2, 3]) == 6"]
    assert lcb[2]["tests"] == [{"input": "5\n", "output": "25\n"}]  # decoded from the compressed private tests
    class Payload:  # a pickle that would run code when loaded
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    evil = base64.b64encode(zlib.compress(pickle.dumps(Payload()))).decode()
    with pytest.raises(DataError, match="livecodebench question 9: test cases are neither JSON nor a pickled JSON "
                                        "string .*refusing to load (posix|os|nt).system"):
        lcb_tests(evil, "livecodebench question 9")
    apps = read("apps_test500")
    assert [r["kind"] for r in apps] == ["io", "function"]
    assert apps[0]["tests"][1] == {"input": "41\n", "output": "42\n"}
    source = json.load(open(os.path.join(out, "codecontests_test.source.json")))
    assert source["repo"] == "deepmind/code_contests" and source["revision"] == "3f5a" * 10 and source["records"] == 2

    # the workflows read them as problems, and the known solutions pass while the wrong ones fail
    jobs = []
    for name in ("codecontests_test", "livecodebench", "apps_test500"):
        for p in load_problems(name, (), out):
            jobs.append((p, p.solutions[0] if p.solutions else None))
    lcb_ok = "class Solution:\n    def total(self, nums: List[int]) -> int:\n        return sum(nums)\n"
    programs = [program or (lcb_ok if p.kind == "function" else "print(int(input()) ** 2)") for p, program in jobs]
    verdicts = run_tests([(p, prog, p.tests) for (p, _), prog in zip(jobs, programs)])
    assert all(v.passed for row in verdicts for v in row), verdicts
    wrong = run_tests([(p, "print(0)\n", p.tests) for p, _ in jobs if p.kind == "io"])
    assert not any(v.passed for row in wrong for v in row)


def test_missing_sets_refuse_in_one_line_naming_the_command(tmp_path, paper_hub):
    from atgrpo_jax.envs.code_workflow import CodeWorkflow

    out = str(tmp_path / "none")
    with pytest.raises(DataError, match=rf"^data sets codecontests_train, livecodebench missing from {out}/: run "
                                         rf"`python -m atgrpo_jax.data prepare codecontests_train livecodebench "
                                         rf"--out={out}`"):
        CodeWorkflow(train_sets=("codecontests_train",), test_sets=("livecodebench", "humaneval"), data_dir=out)
    require_prepared(["humaneval", "my.jsonl"], out)  # shipped sets and own files are not prepared ones
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    def run(*args):
        return subprocess.run([sys.executable, "-m", "atgrpo_jax.data", *args], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    ok = run("prepare", "polaris", "codecontests_test", f"--out={out}")
    assert ok.returncode == 0 and ok.stdout.splitlines() == [
        f"polaris: 2 records -> {out}/polaris.jsonl", f"codecontests_test: 2 records -> {out}/codecontests_test.jsonl"]
    env["HF_HUB_CACHE"] = str(tmp_path / "empty")
    failed = run("prepare", "livecodebench", f"--out={out}")
    assert failed.returncode == 2 and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert f"run `python -m atgrpo_jax.data prepare livecodebench --out={out}` where the machine is online" \
        in failed.stderr


def test_the_stand_ins_for_prepared_sets_are_sound():
    """tests/fixtures/data (what $ATGRPO_DATA points at in the tests): each solution passes all its tests and
    each incorrect solution fails one, so runs on the paper configs grade real programs."""
    from atgrpo_jax.envs.code_problems import CodeProblem, load_problems, run_tests
    from atgrpo_jax.envs.code_sources import problem_fields

    directory = os.environ["ATGRPO_DATA"]
    assert directory == os.path.join(ROOT, "tests", "fixtures", "data")
    jobs = []
    for name in ("codecontests_train", "codecontests_test", "livecodebench", "apps_test500"):
        records = [json.loads(line) for line in open(os.path.join(directory, f"{name}.jsonl"))]
        for record, problem in zip(records, load_problems(name)):
            assert problem == CodeProblem(**problem_fields(record, name))
            jobs += [(problem, record["solutions"][0], True), (problem, record["incorrect_solutions"][0], False)]
    verdicts = run_tests([(p, program, p.tests) for p, program, _ in jobs])
    assert [all(v.passed for v in row) for row in verdicts] == [good for _, _, good in jobs]
