"""The paper's table in miniature, tiny: traces, a trimmed tokenizer, SFT, then RL under both recipes."""
import json

import pytest

from atgrpo_jax import cli
from atgrpo_jax.train.metrics_files import read_metrics


@pytest.mark.full  # tiers.py: ~40 s; test_traces, test_trimmed, test_sft and test_ablate cover its stages
def test_the_whole_pipeline_makes_a_table_from_a_warm_start(tmp_path):
    from atgrpo_jax.miniature.run import run_miniature

    c = cli.load_config("configs/miniature.py:plan_path")
    c.env.kwargs.max_turns = c.rollout.max_turns = 1
    c.rollout.update(num_tasks=2, k=2, max_new_tokens=8, prompt_buckets=(640,))  # one sampler compile
    c.sft.update(steps=2, rows=2, row_tokens=512)
    c.train.update(steps=1, eval_every=1, eval_tasks=2)
    out = tmp_path / "mini"
    table = run_miniature(c, str(out), regimes=("shared",), tasks=3)
    vocab = len(json.loads((out / "tokenizer" / "trimmed.json").read_text())["qwen3_ids"])
    assert 256 + 26 < vocab < 2000
    assert [r["step"] for r in read_metrics(str(out / "sft"))] == [1, 2]
    for recipe in ("paper", "reference"):
        run = out / recipe / "shared" / "seed0"
        assert json.loads((run / "config.json").read_text())["recipe"] == recipe
        config = json.loads((run / "config.json").read_text())
        assert config["model"]["init_from"] == str(out / "sft") and config["model"]["vocab_size"] == vocab
        evals = [r["eval_success"] for r in read_metrics(str(run)) if "eval_success" in r]
        assert table[recipe]["shared"]["start"] == evals[:1] and table[recipe]["shared"]["final"] == evals[-1:]
    text = (out / "table.md").read_text()
    assert "both agents untrained" in text and "AT-GRPO, shared policy" in text and "reference: end" in text
    assert (out / "curves.png").stat().st_size > 1000
    before = (out / "paper" / "shared" / "seed0" / "metrics.jsonl").stat().st_mtime
    run_miniature(c, str(out), regimes=("shared",), tasks=3)  # complete stages are skipped
    assert (out / "paper" / "shared" / "seed0" / "metrics.jsonl").stat().st_mtime == before
