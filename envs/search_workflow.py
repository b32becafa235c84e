"""Search QA with a reasoner and a search agent (the structure of the reference system's search
environment; docs/guides/search.md).

Turn 0, the reasoner splits the question into sub-questions (`### ...` lines; `#2` in a later one
stands for sub-question 2's answer). The search agent then works through them one at a time: a
`**Search Query:** ...` line retrieves the top passages (`env.kwargs.retriever`: BM25 over a corpus,
or a retrieval service), and once it has results, an `**Answer:** ...` line answers the sub-question and
moves to the next. Every later turn the reasoner answers the whole question from the sub-answers and
the latest results (`**Final Answer:** ...`); a correct one ends the episode. Before the split the
search agent works on the whole question.

Rewards: the reasoner 1 for a correct final answer (exact match after normalization; the reference's
lenient match with `lenient_match`); the search agent 0.1 per sub-question answered and 0.5 for the last
(the reference's), plus `rewards.found` when its results hold a gold answer; the team reward is the
final answer's correctness. Data: `search_train` / `search_test` (a small invented world shipped for
offline runs: tools/make_search_fixture.py) or the prepared sets (python -m atgrpo_jax.data prepare).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Sequence

import numpy as np

from atgrpo_jax.data import is_prepared_name, load_records, prepared_path, require_prepared, source_name
from atgrpo_jax.envs.prompt_templates import Prompts
from atgrpo_jax.envs.search import answer_of, make_retriever, matches, normalize, search_query, sub_questions
from atgrpo_jax.envs.text_state import DATA_DIR, clip_tail, load_jsonl, obj_array, step_frame
from atgrpo_jax.envs.workflow import TRAIN_TASK_STRIDE, Agent, Messages, StepOut, as_reference

SEARCH_DATASETS = {"search_train": "search/train.jsonl", "search_test": "search/test.jsonl"}
FIXTURE_CORPUS = str(DATA_DIR / "search" / "corpus.jsonl")


@dataclasses.dataclass(frozen=True)
class SearchRewards:
    correct: float = 1.0  # the reasoner's correct final answer; also the team reward
    sub_answer: float = 0.1  # the search agent, per sub-question answered (the reference's)
    all_answered: float = 0.5  # ... and for the last one instead (the reference's)
    found: float = 0.2  # the search agent, when its results hold a gold answer (this project's; 0 = off)


def load_questions(name: str, data_dir: str = "") -> tuple[dict, ...]:
    """A shipped set, a prepared one (search task) or a file of {"question", "answers"} records."""
    if name in SEARCH_DATASETS:
        rows = load_jsonl(SEARCH_DATASETS[name])
    elif is_prepared_name(name, "search"):
        rows = load_records(prepared_path(name, data_dir), ("question", "answers"))
    else:
        rows = load_records(name, ("question", "answers"))
    return tuple({"question": str(r["question"]), "answers": tuple(map(str, r["answers"] if isinstance(
        r["answers"], (list, tuple)) else [r["answers"]]))} for r in rows)


@dataclasses.dataclass(frozen=True)
class SearchWorkflow:
    train_set: str = "search_train"
    test_sets: tuple[str, ...] = ("search_test",)
    corpus: str = ""  # the passages BM25 ranks: a JSONL file, a prepared corpus (wiki18), "" the shipped fixture
    retriever: str = "bm25"  # or the URL of a retrieval service (envs/search.py)
    top_k: int = 3  # passages per query
    data_dir: str = ""  # where prepared sets are ("" = $ATGRPO_DATA, else ./data)
    valid_every: int = 10  # every n-th training question is the validation split
    max_turns: int = 5  # the reference's
    max_sub_questions: int = 4
    single_agent: bool = False  # one agent that searches and answers
    rewards: SearchRewards = SearchRewards()
    prompt_dir: str = ""  # a directory of prompt templates replacing the shipped ones (envs/prompt_templates.py)
    recipe: str = "paper"  # the switches below left at None follow it (envs/workflow.py: RECIPES)
    lenient_match: bool | None = None  # True (reference): an answer also counts when it contains the gold one,
    # is contained in it or shares half its words; False: exact match after normalization
    first_line_query: bool | None = None  # True (reference): a reply without a **Search Query:** line searches its
    # first line; False: it searches nothing

    def __post_init__(self):
        if isinstance(self.test_sets, str):
            object.__setattr__(self, "test_sets", (self.test_sets,))
        if isinstance(self.rewards, dict):
            object.__setattr__(self, "rewards", SearchRewards(**self.rewards))
        for switch in ("lenient_match", "first_line_query"):
            object.__setattr__(self, switch, as_reference(getattr(self, switch), self.recipe))
        if self.top_k < 1 or self.max_sub_questions < 1 or self.valid_every < 2:
            raise ValueError("env.kwargs: top_k and max_sub_questions must be >= 1 and valid_every >= 2")
        require_prepared([self.train_set, *self.test_sets], self.data_dir, "search")
        if self.retriever == "bm25" and self.corpus:
            require_prepared([self.corpus], self.data_dir, "search_corpus")
        self.splits  # every question set loads, the templates parse, the index is built: errors now
        self.templates
        self.index

    @functools.cached_property
    def templates(self) -> Prompts:
        return Prompts("search", self.prompt_dir)

    @functools.cached_property
    def index(self):
        corpus = self.corpus or FIXTURE_CORPUS
        if is_prepared_name(corpus, "search_corpus"):  # a prepared corpus by name: wiki18
            corpus = prepared_path(corpus, self.data_dir)
        return make_retriever(self.retriever, corpus)

    @functools.cached_property
    def _sets(self) -> dict[str, tuple[dict, ...]]:
        return {name: load_questions(name, self.data_dir) for name in (self.train_set, *self.test_sets)}

    def _pool(self, split: str) -> tuple[dict, ...]:
        if split in ("train", "valid"):
            pool = self._sets[self.train_set]
            return tuple(q for i, q in enumerate(pool) if (i % self.valid_every == 0) == (split == "valid"))
        names = {source_name(n): n for n in self.test_sets}
        if split not in names:
            raise ValueError(f"split must be 'train', 'valid' or a test set ({', '.join(names)}), got {split!r}")
        return self._sets[names[split]]

    @property
    def splits(self) -> dict[str, int]:
        return {"valid": len(self._pool("valid"))} | {source_name(n): len(self._pool(source_name(n)))
                                                       for n in self.test_sets}

    @property
    def name(self) -> str:
        return "search_single" if self.single_agent else "search"

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(source_name(n) for n in self.test_sets)

    @property
    def agents(self) -> tuple[Agent, ...]:
        parsers = {"reasoner": answer_of, "searcher": search_query}
        return tuple(Agent(role, parsers[role]) for role in search_roles(self.single_agent))

    # ------------------------------------------------------------ state
    def reset(self, task_ids: Sequence[int], split: str) -> dict[str, np.ndarray]:
        pool = self._pool(split)
        if split != "train" and any(int(i) >= len(pool) for i in task_ids):
            raise ValueError(f"split {split!r} has {len(pool)} questions; task ids must be below that")
        rows = [pool[int(i) % TRAIN_TASK_STRIDE % len(pool)] for i in task_ids]
        n = len(rows)
        return {"question": obj_array([r["question"] for r in rows]), "golds": obj_array([r["answers"] for r in rows]),
                "subs": obj_array([()] * n), "sub_answers": obj_array([()] * n), "results": obj_array([""] * n),
                "final": obj_array([""] * n), "history": obj_array([""] * n),
                "correct": np.zeros(n, bool), "done": np.zeros(n, bool)}

    def done(self, state) -> np.ndarray:
        return np.asarray(state["done"], bool)

    def success(self, state) -> np.ndarray:
        return np.asarray(state["correct"], bool)

    # ------------------------------------------------------------ prompts
    def prompts(self, state, agent: int, turn: int) -> list[Messages]:
        role = self.agents[agent].name
        return [self._prompt(role, turn, {k: v[b] for k, v in state.items()}) for b in range(len(state["done"]))]

    def _prompt(self, role: str, turn: int, s: dict[str, Any]) -> Messages:
        subs, answers = s["subs"], s["sub_answers"]
        current = _current(s)
        user = self.templates.render(
            f"{role}.j2", turn=turn, single_agent=self.single_agent, question=s["question"],
            sub_questions=[_resolved(q, answers) for q in subs], sub_answers=list(answers) + [""] * (len(subs) - len(answers)),
            current=_resolved(current, answers), index=len(answers), results=clip_tail(s["results"], 3000),
            history=s["history"])
        return self.templates.chat("single" if self.single_agent else role, user)

    # ------------------------------------------------------------ step
    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        grid, out, local, team, parsed_as, active = step_frame(state, responses)
        if self.agents[agent].name == "reasoner":
            self._step_reasoner(out, grid, active, turn, local, parsed_as)
        else:
            self._step_searcher(out, grid, active, turn, local, parsed_as)
        for b, j in active:
            team[b, j] = self.rewards.correct * out["correct"][b, j]
        return StepOut(state=out, local_reward=local, team_reward=team, parsed_as=parsed_as)

    def _judge(self, out, b: int, j: int, answer: str) -> bool:
        correct = matches(answer, out["golds"][b, j], self.lenient_match)
        out["final"][b, j], out["correct"][b, j], out["done"][b, j] = answer, correct, correct
        return correct

    def _step_reasoner(self, out, grid, active, turn, local, parsed_as):
        for b, j in active:
            text = grid[b][j]
            if not out["subs"][b, j]:  # the split first
                subs = sub_questions(text, self.max_sub_questions)
                out["subs"][b, j] = subs
                parsed_as[b, j] = f"{len(subs)} sub-questions" if subs else "unparsed: no ### sub-question lines"
                out["history"][b, j] += f"turn {turn + 1}, reasoner: split into {len(subs)} sub-questions\n"
                continue
            answer = answer_of(text)
            correct = self._judge(out, b, j, answer)
            local[b, j] = self.rewards.correct * correct
            parsed_as[b, j] = f"answer {answer}" if answer else "unparsed: no **Final Answer:** line"
            out["history"][b, j] += f"turn {turn + 1}, reasoner: {answer or '(no answer)'}\n"

    def _step_searcher(self, out, grid, active, turn, local, parsed_as):
        r = self.rewards
        queries = {(b, j): search_query(grid[b][j], self.first_line_query) for b, j in active}
        asked = [key for key, q in queries.items() if q]
        found = dict(zip(asked, self.index.search([queries[key] for key in asked], self.top_k)))
        for b, j in active:
            query, text = queries[(b, j)], grid[b][j]
            if query:
                passages = found[(b, j)]
                out["results"][b, j] = self.templates.render("results.j2", query=query, passages=passages)
                hit = any(matches_in(p.text, out["golds"][b, j]) for p in passages)
                local[b, j] = r.found * hit
                parsed_as[b, j] = f"search {query!r}: {len(passages)} passages" + (", an answer among them" if hit else "")
                out["history"][b, j] += f"turn {turn + 1}, searcher: searched {query!r}\n"
                continue
            answer = answer_of(text)
            if not answer:
                parsed_as[b, j] = "unparsed: no **Search Query:** or **Answer:** line"
                continue
            subs, answers = out["subs"][b, j], out["sub_answers"][b, j]
            if self.single_agent or not subs or len(answers) >= len(subs):  # an answer to the whole question
                local[b, j] = r.correct * self._judge(out, b, j, answer)
            else:
                answers = answers + (answer,)
                out["sub_answers"][b, j], out["results"][b, j] = answers, ""
                local[b, j] = r.all_answered if len(answers) == len(subs) else r.sub_answer
            parsed_as[b, j] = f"answer {answer}"
            out["history"][b, j] += f"turn {turn + 1}, searcher: answered {answer!r}\n"


def matches_in(text: str, golds: Sequence[str]) -> bool:
    """Whether a passage holds one of the gold answers (as whole words, normalized)."""
    padded = f" {normalize(text)} "
    return any(normalize(g) and f" {normalize(g)} " in padded for g in golds)


def _current(s: dict) -> str:
    """The question the search agent works on: the next unanswered sub-question, else the question."""
    subs, answers = s["subs"], s["sub_answers"]
    return subs[len(answers)] if len(answers) < len(subs) else s["question"]


def _resolved(question: str, answers: Sequence[str]) -> str:
    """`#n` in a sub-question replaced by sub-question n's answer, where it has one."""
    return re.sub(r"#(\d+)", lambda m: answers[int(m.group(1)) - 1] if 0 < int(m.group(1)) <= len(answers)
                  else m.group(0), question)


def search_roles(single_agent: bool = False, **_) -> tuple[str, ...]:
    """The workflow's roles in turn order, known without its data (the planner counts them)."""
    return ("searcher",) if single_agent else ("reasoner", "searcher")


def make_search_workflow(single_agent: bool = False, **kwargs) -> SearchWorkflow:
    return SearchWorkflow(single_agent=single_agent, **kwargs)
