"""Math grading (table over the shipped answers) and the math workflow with scripted agents."""
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from atgrpo_jax.envs import math_grading
from atgrpo_jax.envs.math_grading import fallback_equal, grade, normalize
from atgrpo_jax.envs.math_workflow import MathWorkflow, load_problems, make_math_workflow, tool_answer_from_output
from atgrpo_jax.envs.sandbox import Limits
from atgrpo_jax.envs.text_state import DATA_DIR
from atgrpo_jax.envs.workflow import StepOut, take_branch


# ---------------------------------------------------------------- grading table
def _core(answer):
    return answer.replace("$", "").strip()


def answer_variants(reference):
    """LaTeX spellings of the same answer."""
    core = _core(reference)
    out = {"self": reference, "dollars": f"${core}$", "boxed": f"\\boxed{{{core}}}",
           "spaces": " " + re.sub(r"([,=+])", r" \1 ", core) + " "}
    if "\\frac" in core:
        out["dfrac"] = core.replace("\\frac", "\\dfrac")
    if "(" in core:
        out["left_right"] = re.sub(r"(?<!\\right)\)", r"\\right)", re.sub(r"(?<!\\left)\(", r"\\left(", core))
    return out


def wrong_answers(reference, others):
    core, out = _core(reference), {}
    if re.fullmatch(r"-?\d+", core):
        out["plus_one"] = str(int(core) + 1)
    out["other_problem"] = next(o for o in others if normalize(o) != normalize(reference))
    return out


def grading_table(name, cross_check_every):
    """Counts [hits, total] per variant kind; math_verify and the fallback alone are cross-checked
    on every `cross_check_every`-th problem."""
    answers = [json.loads(line)["answer"] for line in open(DATA_DIR / "math" / f"{name}.jsonl")]
    accepted, rejected, alone, failures = {}, {}, {"math_verify": [0, 0], "fallback": [0, 0]}, []

    def count(table, kind, hit):
        table.setdefault(kind, [0, 0])
        table[kind][0] += bool(hit)
        table[kind][1] += 1

    for i, reference in enumerate(answers):
        for kind, variant in answer_variants(reference).items():
            ok = grade(variant, reference)
            count(accepted, kind, ok)
            if not ok:
                failures.append((kind, reference, variant))
            if i % cross_check_every == 0:
                count(alone, "math_verify", math_grading._WORKER.verify(variant, reference, 10.0) is True)
                count(alone, "fallback", fallback_equal(variant, reference))
        for kind, wrong in wrong_answers(reference, answers[i + 1:] + answers[:i]).items():
            ok = grade(wrong, reference)
            count(rejected, kind, not ok)
            if ok:
                failures.append(("accepted wrong " + kind, reference, wrong))
    return accepted, rejected, alone, failures


@pytest.mark.parametrize("name,count,cross_check_every", [
    ("aime24", 30, 1), ("aime25", 30, 1), ("olympiadbench", 674, 4)])
def test_grading_table(name, count, cross_check_every):
    started = time.perf_counter()
    accepted, rejected, alone, failures = grading_table(name, cross_check_every)
    print(f"\n{name}: accepted {accepted} rejected {rejected} each grader alone {alone} "
          f"in {time.perf_counter() - started:.1f}s")
    assert failures == []
    assert accepted["self"] == [count, count] and rejected["other_problem"] == [count, count]
    for hits, total in alone.values():  # the two graders largely agree on their own
        assert hits >= 0.97 * total


@pytest.mark.parametrize("pred,reference,expected", [
    ("\\boxed{\\dfrac{1}{2}}", "$\\frac{1}{2}$", True),
    ("0.5", "\\frac12", True),
    ("84, 69", "$69$,$84$", True),  # multiple answers as a set
    ("69", "$69$,$84$", False),
    ("(5,6)", "(6,5)", False),  # tuples are ordered
    ("[1,2)", "(1,2)", False),  # interval ends differ
    ("x = 3", "3", True),
    ("44", "$44^{\\circ}$", True),
    ("\\frac{41}{12}\\text{ km}", "$\\frac{41}{12}$", True),
    ("n^2", "$f(n)=n^{2}$", True),  # needs math_verify
    ("3986730", "3986729", False),  # big integers are compared exactly
    ("", "1", False), (None, "1", False), (5, "5", False), ("5", None, False),
])
def test_grade_cases(pred, reference, expected):
    assert grade(pred, reference) is expected


def test_fallback_alone():
    assert fallback_equal("$\\left( 1, \\dfrac{1}{2} \\right)$", "(1,\\frac{1}{2})")
    assert fallback_equal("\\boxed{1, 2, 3}.", "3,1,2")
    assert not fallback_equal("1,2", "1,2,3")
    assert not fallback_equal("\\frac{1}{0}", "1")
    assert normalize("$\\text{ 12 } \\, ^\\circ$") == "12"


def test_hostile_answers_do_not_hang_or_break_the_grader():
    for hostile in ["9^{9^{9^{9}}}", "\\binom{100000000}{50000000}"]:
        started = time.perf_counter()
        assert grade(hostile, "5", timeout_s=1.0) is False
        assert time.perf_counter() - started < 3.0
    assert grade("x" * 100_000, "5") is False
    assert grade("n^{2}", "$f(n)=n^{2}$")  # the worker came back


def test_grade_is_thread_safe():
    pairs = [(f"\\frac{{{i}}}{{{i + 1}}}", f"{i}/{i + 1}") for i in range(1, 25)] + [("a+b", "b+a"), ("a-b", "b-a")]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: grade(*p), pairs))
    assert results == [True] * 25 + [False]


# ---------------------------------------------------------------- workflow
FAST = Limits(wall_s=2.0, cpu_s=2.0, memory_mb=512)


def _workflow(**kw):
    return MathWorkflow(test_sets=("aime24",), limits=FAST, max_workers=4, **kw)


def _parsed(out: StepOut) -> np.ndarray:
    return ~np.char.startswith(out.parsed_as.astype(str), "unparsed")


def _check_shapes(out: StepOut, b, k):
    for array in (out.local_reward, out.team_reward):
        assert array.shape == (b, k) and array.dtype == np.float32
    assert out.parsed_as.shape == (b, k)
    for name, leaf in out.state.items():
        assert leaf.shape[:2] == (b, k), name


@pytest.mark.parametrize("name,count", [("gsm8k_train", 7473), ("gsm8k_test", 1319), ("aime24", 30), ("aime25", 30),
                                        ("olympiadbench", 674)])
def test_shipped_math_sets(name, count):
    """Every shipped set: its size, unique ids, a problem and an answer per record."""
    problems = load_problems(name)
    assert len(problems) == count
    assert len({p["id"] for p in problems}) == count
    assert all(p["problem"].strip() and str(p["answer"]).strip() for p in problems)


def test_training_is_on_the_train_split_by_default():
    train, test = load_problems("gsm8k_train"), load_problems("gsm8k_test")
    assert MathWorkflow().train_set == "gsm8k_train"
    assert not {p["problem"] for p in train} & {p["problem"] for p in test}  # no test problem is trained on
    assert all(re.fullmatch(r"-?[0-9][0-9,]*(\.[0-9]+)?", p["answer"]) for p in train)  # GSM8K answers are numbers


def test_datasets_by_name_and_split(tmp_path):
    wf = MathWorkflow(train_set="gsm8k_test", test_sets=("olympiadbench", "aime25"))
    pool = load_problems("gsm8k_test")
    assert wf.reset([0], "valid")["reference"][0] == pool[0]["answer"]  # every 20th problem: valid
    assert wf.reset([0, 19], "train")["reference"].tolist() == [pool[1]["answer"], pool[21]["answer"]]
    assert wf.reset([1], "olympiadbench")["problem"][0] == load_problems("olympiadbench")[1]["problem"]
    assert wf.splits == {"valid": 66, "olympiadbench": 674, "aime25": 30}
    assert wf.test_splits == ("olympiadbench", "aime25")
    with pytest.raises(ValueError, match="has 30 problems"):
        wf.reset([30], "aime25")  # every problem once: no wrap-around
    with pytest.raises(ValueError):
        MathWorkflow(test_sets=("aime2030",))
    with pytest.raises(ValueError):
        wf.reset([0], "validation")
    own = tmp_path / "my_test.jsonl"
    own.write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n{"id": "b", "problem": "2+2?", "answer": "4"}\n')
    mine = MathWorkflow(test_sets=(), test_path=str(own), train_path=str(own))
    assert mine.test_splits == ("my_test",) and mine.reset([1], "my_test")["reference"][0] == "4"
    with_builtins = MathWorkflow(test_path=str(own))  # evaluated by default: only the user's own test set
    assert with_builtins.test_splits == ("my_test",) and "aime24" in with_builtins.splits  # (--splits=aime24 works)
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "question": "?"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: record 1 has no field 'problem'.*its fields: id, question"):
        MathWorkflow(test_path=str(tmp_path / "bad.jsonl"))


def test_reasoner_rewards_and_parsing():
    wf = _workflow()
    state = wf.reset([0, 1], "aime24")
    refs = list(state["reference"])
    out = wf.step(state, 0, 0, [[f"so \\boxed{{{refs[0]}}}", f"\\boxed{{{int(refs[0]) + 1}}}", "no box"],
                                [f"$\\boxed{{\\dfrac{{{refs[1]}}}{{1}}}}$", "\\boxed{", 17]])
    _check_shapes(out, 2, 3)
    total = out.local_reward + out.team_reward
    np.testing.assert_array_equal(total, [[2, 0, 0], [2, 0, 0]])
    np.testing.assert_array_equal(_parsed(out), [[True, True, False], [True, False, False]])
    assert not wf.done(out.state).any()  # the tool agent has not answered yet
    np.testing.assert_array_equal(wf.success(out.state), [[True, False, False], [True, False, False]])


def test_tool_rewards_termination_and_branch_selection():
    wf = _workflow()
    state = wf.reset([0], "aime24")
    ref = state["reference"][0]
    out = wf.step(state, 0, 0, [[f"\\boxed{{{ref}}}", "\\boxed{1}"]])
    state = take_branch(out.state, np.array([0]))  # the correct reasoner branch
    responses = [[f"```python\nprint({ref})\n```",  # correct: agrees with the reasoner -> done
                  f"```python\nprint('Answer:', {ref} + 1)\n```",  # wrong
                  "I would compute it by hand.",  # no code
                  "```python\nraise ValueError('x')\n```",  # crash
                  "```python\nimport os\nwhile True: os.fork()\n```",  # hostile
                  "```python\nwhile True: pass\n```"]]  # runs out of time
    started = time.perf_counter()
    out = wf.step(state, 1, 0, responses)
    assert time.perf_counter() - started < FAST.wall_s + 3
    _check_shapes(out, 1, 6)
    np.testing.assert_array_equal(out.local_reward, [[1, 0, -1, -1, -1, -1]])
    np.testing.assert_array_equal(out.team_reward, [[1] * 6])  # the reasoner is right on every branch
    np.testing.assert_array_equal(wf.done(out.state), [[True, False, False, False, False, False]])
    assert out.state["tool_answer"][0, 1] == str(int(ref) + 1)

    # Select the wrong tool branch: the reasoner's next prompt shows that branch, and nothing else.
    chosen = take_branch(out.state, np.array([1]))
    assert not wf.done(chosen)[0] and wf.success(chosen)[0]
    text = wf.prompts(chosen, 0, 1)[0][1]["content"]
    assert f"print('Answer:', {ref} + 1)" in text and f"tool agent: {int(ref) + 1}" in text
    assert "while True" not in text and "ValueError" not in text
    # The reasoner switches to the tool's (wrong) answer: they agree, the episode ends, unsuccessfully.
    out = wf.step(chosen, 0, 1, [[f"\\boxed{{{int(ref) + 1}}}", f"\\boxed{{{ref}}}"]])
    np.testing.assert_array_equal(wf.done(out.state), [[True, False]])
    np.testing.assert_array_equal(wf.success(out.state), [[False, True]])
    np.testing.assert_array_equal(out.local_reward + out.team_reward, [[0, 2]])


def test_finished_tasks_are_frozen():
    wf = _workflow(single_agent=True)
    state = wf.reset([0, 1], "aime24")
    out = wf.step(state, 0, 0, [["\\boxed{3}", "\\boxed{4}"], ["no answer", "still none"]])
    np.testing.assert_array_equal(wf.done(out.state), [[True, True], [False, False]])
    state = take_branch(out.state, np.array([1, 0]))
    assert wf.prompts(state, 0, 1)[1][1]["content"].count("no \\boxed{} answer") == 1
    out = wf.step(state, 0, 1, [["\\boxed{99}", "\\boxed{98}"], ["\\boxed{5}", "x"]])
    assert (out.state["reasoner_answer"][0] == "4").all()  # task 0 ended before this step
    np.testing.assert_array_equal(out.local_reward[0], [0, 0])
    np.testing.assert_array_equal(wf.done(out.state), [[True, True], [True, False]])


def test_single_agent_variant_and_factory():
    wf = make_math_workflow(single_agent=True, test_sets="aime25", limits={"wall_s": 1.0})
    assert [a.name for a in wf.agents] == ["reasoner"] and wf.name == "math_single"
    assert wf.limits.wall_s == 1.0 and wf.test_splits == ("aime25",)
    state = wf.reset([2], "aime25")
    ref = state["reference"][0]
    out = wf.step(state, 0, 0, [[f"\\boxed{{{ref}}}"]])
    assert wf.done(out.state)[0, 0] and wf.success(out.state)[0, 0] and out.local_reward[0, 0] + out.team_reward[0, 0] == 2
    messages = wf.prompts(state, 0, 0)[0]
    assert [m["role"] for m in messages] == ["system", "user"] and "\\boxed{}" in messages[1]["content"]


def test_tool_answer_from_output():
    assert tool_answer_from_output("working...\n42\n") == "42"
    assert tool_answer_from_output("Final answer: 7/2\n\n") == "7/2"
    assert tool_answer_from_output("\\boxed{12}\nbye") == "12"
    assert tool_answer_from_output("") == ""


def test_tool_first_and_simultaneous_turns():
    """The reference's order (tool agent, then reasoner) and parallel turns: at turn 1 the reasoner is
    shown the tool's program of turn 0, not the one the tool wrote beside it in turn 1."""
    wf = _workflow(tool_first=True, simultaneous=True)
    assert [a.name for a in wf.agents] == ["tool", "reasoner"]
    state = wf.reset([0], "aime24")
    ref = state["reference"][0]
    state = take_branch(wf.step(state, 0, 0, [["```python\nprint(11)\n```"]]).state, np.array([0]))
    assert "print(11)" not in wf.prompts(state, 1, 0)[0][1]["content"]  # turn 0: from the problem alone
    state = take_branch(wf.step(state, 1, 0, [["\\boxed{12}"]]).state, np.array([0]))
    state = take_branch(wf.step(state, 0, 1, [[f"```python\nprint({ref})\n```"]]).state, np.array([0]))
    text = wf.prompts(state, 1, 1)[0][1]["content"]
    assert "print(11)" in text and f"print({ref})" not in text and "Your previous solution:\n\\boxed{12}" in text
    sequential = _workflow(tool_first=True)
    assert f"print({ref})" in sequential.prompts(state, 1, 1)[0][1]["content"]
