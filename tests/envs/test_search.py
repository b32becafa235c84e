"""Search QA: the retriever finds the passages a question needs, the replies' markers and the answer
match, and the workflow's turns (split, search, sub-answers, final answer) with their rewards."""
import numpy as np
import pytest

from atgrpo_jax.envs.search import BM25Retriever, answer_of, load_passages, matches, search_query, sub_questions
from atgrpo_jax.envs.search_workflow import FIXTURE_CORPUS, SearchWorkflow, load_questions
from atgrpo_jax.envs.workflow import take_branch


@pytest.fixture(scope="module")
def workflow():
    return SearchWorkflow()


def test_bm25_finds_the_passage_that_names_the_entity():
    passages = load_passages(FIXTURE_CORPUS)
    bm25 = BM25Retriever(passages)
    person = next(p for p in passages if p.id == "person-3")
    town = person.text.split("founder of ")[1].rstrip(".")
    [by_name, by_town, nothing] = bm25.search([person.title, f"{town} charter", ""], 3)
    assert by_name[0].id == "person-3"
    assert "town-3" in [p.id for p in by_town]
    assert nothing == []


@pytest.mark.parametrize("text,query,answer", [
    ("I will look it up.\n**Search Query:** founder of Wick", "founder of Wick", ""),
    ("Search Query: river Lesnou\nthen more", "river Lesnou", ""),
    ("The passages say so.\n**Answer:** 1680", "", "1680"),
    ("Reasoning...\n**Final Answer:** the Highlands", "", "the Highlands"),
    ("no markers at all", "", ""),
])
def test_reply_markers(text, query, answer):
    assert search_query(text) == query and answer_of(text) == answer


def test_the_reference_searches_a_reply_without_a_marker_by_its_first_line():
    assert search_query("founder of Wick\nmore", first_line=True) == "founder of Wick"


def test_answers_match_exactly_after_normalization_or_leniently_as_the_reference():
    assert matches("The Highlands.", ["the Highlands"]) and matches("1680", ["1680"])
    assert not matches("Highlands region of the north", ["the Highlands"])
    assert matches("Highlands region of the north", ["the Highlands"], lenient=True)
    assert not matches("", ["x"], lenient=True) and not matches("1681", ["1680"], lenient=True)
    assert sub_questions("### Who founded Wick?\ntext\n### When was #1 born?\n") == \
        ("Who founded Wick?", "When was #1 born?")


def test_a_question_is_split_searched_answered_and_judged(workflow):
    question = workflow._pool("train")[2]  # "In what year was the town founded by P established?"
    assert question in load_questions("search_train")
    person = question["question"].split("founded by ")[1].split(" established")[0]
    state = workflow.reset([2], "train")
    assert state["question"][0] == question["question"]
    pick = lambda out: take_branch(out.state, np.zeros(1, int))  # noqa: E731
    out = workflow.step(state, 0, 0, [[f"### Which town did {person} found?\n### When was #1 established?"]])
    state = pick(out)
    assert len(state["subs"][0]) == 2 and out.local_reward[0, 0] == 0
    prompt = workflow.prompts(state, 1, 0)[0][1]["content"]
    assert "Sub-question 1 of 2" in prompt and "**Search Query:**" in prompt
    out = workflow.step(state, 1, 0, [[f"**Search Query:** {person}"]])
    state = pick(out)
    assert person in state["results"][0]
    town = state["results"][0].split("founder of ")[1].split(".")[0]
    state = pick(workflow.step(state, 1, 0, [[f"**Answer:** {town}"]]))
    assert state["sub_answers"][0] == (town,) and state["results"][0] == ""
    assert f"Sub-question 2 of 2: When was {town} established?" in workflow.prompts(state, 1, 1)[0][1]["content"]
    out = workflow.step(state, 1, 1, [[f"**Search Query:** {town} charter"]])
    assert out.local_reward[0, 0] == pytest.approx(workflow.rewards.found)  # the year is in the results
    state = pick(out)
    out = workflow.step(state, 1, 1, [[f"**Answer:** {question['answers'][0]}"]])
    assert out.local_reward[0, 0] == pytest.approx(workflow.rewards.all_answered)
    state = pick(out)
    out = workflow.step(state, 0, 2, [["It was chartered then.\n**Final Answer:** 1066", "**Final Answer:** "
                                       + question["answers"][0]]])
    np.testing.assert_allclose(out.local_reward, [[0.0, 1.0]])
    np.testing.assert_allclose(out.team_reward, [[0.0, 1.0]])
    assert workflow.done(out.state).tolist() == [[False, True]]
    assert workflow.success(take_branch(out.state, np.ones(1, int))).tolist() == [True]


def test_prepare_converts_question_and_passage_rows_of_the_hub_shape():
    from atgrpo_jax.data.paper_sets import PAPER_SETS

    questions = list(PAPER_SETS["bamboogle"].convert([
        {"id": "test_0", "question": "Who was president when X?", "golden_answers": ["Grover Cleveland"]},
        {"id": "test_1", "question": "No answer here", "golden_answers": []}]))
    assert questions == [{"id": "bamboogle-test_0", "question": "Who was president when X?",
                          "answers": ["Grover Cleveland"]}]
    passages = list(PAPER_SETS["wiki18"].convert([{"id": "1", "contents": '"Aaron"\nAaron is a prophet.'}]))
    assert passages == [{"id": "1", "title": "Aaron", "text": "Aaron is a prophet."}]


def test_the_shipped_fixture_is_what_its_generator_writes(tmp_path):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "make_search_fixture.py")
    spec = importlib.util.spec_from_file_location("make_search_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(str(tmp_path))
    for name in ("corpus", "train", "test"):
        shipped = os.path.join(os.path.dirname(FIXTURE_CORPUS), f"{name}.jsonl")
        assert (tmp_path / f"{name}.jsonl").read_text() == open(shipped, encoding="utf-8").read()


@pytest.mark.full  # tiers.py: ~20 s; the turns above are the workflow's, this is the trainer around them
def test_a_tiny_model_trains_and_evaluates_on_search_with_the_real_tokenizer(tmp_path):
    from atgrpo_jax.train import loop
    from atgrpo_jax.train.config import base_config
    from atgrpo_jax.train.metrics_files import read_metrics

    c = base_config()
    c.model.update(preset="test-tiny", vocab_size=151680, init="random")
    c.mesh = dict(data=1, fsdp=1, tensor=1)
    c.env.workflow = "search"
    c.rollout.update(num_tasks=2, k=2, max_turns=2, max_prompt_len=512, prompt_buckets=(512,), max_new_tokens=8)
    c.optim.mini_batch_size = 8
    c.train.update(steps=1, eval_every=1, eval_tasks=2, checkpoint_every=0)
    loop.run_training(c, str(tmp_path / "run"))
    last = read_metrics(str(tmp_path / "run" / "metrics.jsonl"))[-1]
    assert last["samples"] == 8 and {"reward/reasoner", "reward/searcher", "eval/search_test/avg@1"} <= set(last)
