"""Write the search workflow's offline fixture: a small invented world (towns, the people who founded
them, rivers, regions) as Wikipedia-like passages, and two-hop questions about it, so the demo-sized
model and the tests run search QA without a network. Everything here is made up by this script
(deterministic: seed 0); nothing is taken from any data set. Usage: python tools/make_search_fixture.py
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "envs", "data", "search")
ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
CODAS = ["", "n", "r", "l", "s", "th", "m"]
REGIONS = ["Northmark", "Eastvale", "Southmere", "Westreach", "the Highlands", "the Lowlands"]
JOBS = ["miller", "merchant", "surveyor", "bridge builder", "weaver", "ship captain", "scholar", "brewer"]


def word(rng, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)).title()


def unique(rng, n: int, make) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = make()
        if w not in out:
            out.append(w)
    return out


def main(out: str = OUT):
    rng = np.random.default_rng(0)
    n = 60
    towns = unique(rng, n, lambda: word(rng, 2) + rng.choice(["ford", "holm", "wick", "by", "ton", "stead"]))
    rivers = unique(rng, n, lambda: word(rng, 2))
    people = unique(rng, n, lambda: f"{word(rng, 2)} {word(rng, 2)}")
    years = rng.choice(np.arange(1100, 1900), n, replace=False)
    region = [REGIONS[i] for i in rng.integers(0, len(REGIONS), n)]
    born = rng.permutation(n)  # person i was born in town born[i] (and founded town i)
    passages = []
    for i in range(n):
        passages.append({"id": f"town-{i}", "title": towns[i],
                         "text": f"{towns[i]} is a market town in {region[i]}, on the banks of the {rivers[i]} "
                                 f"River. The town charter is dated {years[i]}, the year the settlement was "
                                 f"established."})
        passages.append({"id": f"person-{i}", "title": people[i],
                         "text": f"{people[i]} was a {JOBS[i % len(JOBS)]} born in {towns[born[i]]}. "
                                 f"{people[i].split()[0]} is remembered as the founder of {towns[i]}."})
    for i in range(0, n, 2):  # distractors: passages that name towns and rivers without the facts asked
        j = (i + 7) % n
        passages.append({"id": f"fair-{i}", "title": f"{towns[i]} fair",
                         "text": f"Every summer traders from {towns[j]} travel down the {rivers[j]} River to the "
                                 f"fair of {towns[i]}, which is known for its wool."})
    questions = []
    for i in range(n):
        questions.append({"question": f"In what year was the town founded by {people[i]} established?",
                          "answers": [str(years[i])]})
        questions.append({"question": f"Which river flows through the birthplace of {people[i]}?",
                          "answers": [f"{rivers[born[i]]}", f"{rivers[born[i]]} River"]})
        questions.append({"question": f"In which region lies the town that {people[i]} founded?",
                          "answers": [region[i]]})
    test_people = set(range(n - 12, n))  # questions about the last 12 people are held out
    split = {"train": [], "test": []}
    for q_id, q in enumerate(questions):
        person = q_id // 3
        split["test" if person in test_people else "train"].append({"id": f"q{q_id}", **q})
    os.makedirs(out, exist_ok=True)
    for name, rows in [("corpus", passages), ("train", split["train"]), ("test", split["test"])]:
        with open(os.path.join(out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print({k: len(v) for k, v in [("corpus", passages), *split.items()]})


if __name__ == "__main__":
    main()
