"""Search QA's pieces: passages, the retrievers, the replies' markers and the answer match.

Retrievers (`make_retriever`): "bm25" ranks a passage corpus in this process (the `bm25s` package; no
server), or an http(s) URL names a retrieval service speaking the reference system's protocol: POST
{"query", "topk", "return_scores"} -> {"result": [[{"document": {"contents", "title"?}, "score"}, ...]]}
(the one Search-R1's retrieval server and PettingLLMs' search environment use).
"""
from __future__ import annotations

import dataclasses
import json
import re
import string
import urllib.request
from typing import Sequence

from atgrpo_jax.data.readers import DataError, iter_jsonl


@dataclasses.dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


def load_passages(path: str) -> tuple[Passage, ...]:
    """A JSONL corpus: rows {"id", "title", "text"}, or Wikipedia dumps' {"id", "contents"} with the title
    as the first line of contents (quoted, as in the wiki-18 corpus)."""
    out = []
    for n, row in enumerate(iter_jsonl(path), 1):
        if "contents" in row and "text" not in row:
            title, _, text = str(row["contents"]).partition("\n")
            row = {"id": row.get("id", n), "title": title.strip('"'), "text": text}
        if "text" not in row:
            raise DataError(f"{path}, record {n}: a passage needs \"text\" (or \"contents\"), got {sorted(row)}")
        out.append(Passage(str(row.get("id", n)), str(row.get("title", "")), str(row["text"])))
    if not out:
        raise DataError(f"{path}: no passages")
    return tuple(out)


class BM25Retriever:
    """BM25 (bm25s) over `passages`' titles and texts, English stop words left out."""

    def __init__(self, passages: Sequence[Passage]):
        import bm25s

        self.passages = tuple(passages)
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize([f"{p.title} {p.text}" for p in self.passages], stopwords="en",
                                        show_progress=False), show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The k best passages of each query (fewer when the corpus is smaller; none for an empty query)."""
        k = min(k, len(self.passages))
        out: list[list[Passage]] = [[] for _ in queries]
        asked = [i for i, q in enumerate(queries) if q.strip()]
        if not asked:
            return out
        tokens = self._bm25s.tokenize([queries[i] for i in asked], stopwords="en", show_progress=False)
        docs, scores = self.index.retrieve(tokens, k=k, show_progress=False)
        for row, i in enumerate(asked):
            out[i] = [self.passages[d] for d, s in zip(docs[row], scores[row]) if s > 0]
        return out


class ServiceRetriever:
    """A retrieval service at `url` (the reference system's protocol, see the module docstring)."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url, self.timeout_s = url, timeout_s

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return [self._one(q, k) if q.strip() else [] for q in queries]

    def _one(self, query: str, k: int) -> list[Passage]:
        body = json.dumps({"query": query, "topk": k, "return_scores": True}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read())
        except (OSError, ValueError) as e:
            raise RuntimeError(f"env.kwargs.retriever: the retrieval service at {self.url} failed: {e}") from None
        hits = [h for group in reply.get("result", []) for h in (group if isinstance(group, list) else [group])]
        out = []
        for i, hit in enumerate(hits[:k]):
            doc = hit.get("document", hit) if isinstance(hit, dict) else {}
            title, _, text = str(doc.get("contents", "")).partition("\n")
            out.append(Passage(str(doc.get("id", i)), str(doc.get("title", title.strip('"'))), text or title))
        return out


def make_retriever(name: str, corpus: str):
    """"bm25" over the corpus file, or a service URL."""
    if name.startswith(("http://", "https://")):
        return ServiceRetriever(name)
    if name != "bm25":
        raise ValueError(f"env.kwargs.retriever: 'bm25' or a retrieval service's http(s) URL, got {name!r}")
    return BM25Retriever(load_passages(corpus))


# ---------------------------------------------------------------- replies

_QUERY = re.compile(r"^\s*\**search query:\**\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_ANSWER = re.compile(r"^\s*\**(?:final )?answer:\**\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_SUB_QUESTION = re.compile(r"^\s*###\s*(.+?)\s*$", re.MULTILINE)


def search_query(text: str, first_line: bool = False) -> str:
    """The last `**Search Query:** ...` line's query; with first_line (the reference's), else the reply's
    first line."""
    found = _QUERY.findall(text)
    if found:
        return found[-1].strip("*").strip()
    return text.strip().split("\n")[0].strip() if first_line else ""


def answer_of(text: str) -> str:
    """The last `**Final Answer:** ...` or `**Answer:** ...` line's answer ("" none)."""
    found = _ANSWER.findall(text)
    return found[-1].strip("*").strip() if found else ""


def sub_questions(text: str, most: int = 5) -> tuple[str, ...]:
    """The `### ...` lines of a decomposition, at most `most`."""
    return tuple(q for q in _SUB_QUESTION.findall(text) if q)[:most]


def normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the usual open-domain QA normalization)."""
    text = "".join(c for c in str(text).lower() if c not in set(string.punctuation))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def matches(answer: str, golds: Sequence[str], lenient: bool = False) -> bool:
    """Exact match after `normalize` against any gold answer; lenient (the reference's rule): also when
    one contains the other or half the words of the shorter are shared."""
    a = normalize(answer)
    if not a:
        return False
    for gold in golds:
        g = normalize(gold)
        if a == g:
            return True
        if lenient and g and (a in g or g in a or
                              len(set(a.split()) & set(g.split())) >= 0.5 * min(len(a.split()), len(g.split()))):
            return True
    return False
