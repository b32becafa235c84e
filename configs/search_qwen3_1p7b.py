"""Search QA with Qwen3-1.7B (docs/guides/search.md): a reasoner and a search agent sharing one model, the
reference's search settings (5 turns, training temperature 1, greedy evaluation, the low-mean filter),
trained on Natural Questions + HotpotQA and tested on Bamboogle, 2WikiMultihopQA, HotpotQA and MuSiQue,
BM25 over the Wikipedia passages (`python -m atgrpo_jax.data prepare` writes them all); point
env.kwargs.retriever at a retrieval service instead for the full corpus."""
from atgrpo_jax.train.paper import paper_config


def get_config():
    return paper_config("search", "qwen3-1.7b")
