"""The long-tail sampler benchmark forces the same per-row lengths on both sides (each side's run
asserts it), and counts the decode work spent on finished rows; timings are not asserted."""
import json

import numpy as np
import pytest

from atgrpo_jax.bench import sampler as bench
from atgrpo_jax.bench.longtail import longtail_lengths, wasted_fraction


def test_lengths_have_a_long_tail_within_the_budget():
    lengths = longtail_lengths(256, 512)
    assert lengths.min() >= 1 and lengths.max() == 512
    assert 100 <= np.median(lengths) <= 156  # median ~ budget / 4
    assert np.mean(lengths) > 1.2 * np.median(lengths) and np.mean(lengths > 256) < 0.35  # a tail, not the bulk
    assert wasted_fraction(useful=300, row_steps=400) == 0.25


@pytest.mark.full  # tiers.py: ~11 s; the sampler's own row-dropping tests (tests/sampling/test_segments.py) stay
def test_longtail_bench_forces_equal_lengths_and_dropping_rows_saves_work(capsys):
    assert bench.main(["--configs", "test-tiny", "--lengths", "longtail", "--batch", "8", "--prompt", "8",
                       "--new", "24", "--segment", "4", "--repeats", "1", "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out.splitlines()[-1])["results"]
    assert r["useful_tokens"] == longtail_lengths(8, 24).sum()
    assert set(r) >= {"ours", "ours_full_own", "ours_no_drop", "ours_continuous", "ours_fixed_lengths", "transformers",
                      "speedup", "speedup_over_full_own", "vs_fixed_lengths", "continuous_vs_fixed_lengths"}
    assert r["ours_full_own"]["wasted_fraction"] == r["ours"]["wasted_fraction"]  # the same rows and steps
    # without drops every row runs to the longest; with them, less of the work is wasted
    assert r["ours"]["wasted_fraction"] < r["ours_no_drop"]["wasted_fraction"]
    assert abs(r["ours_no_drop"]["wasted_fraction"] - r["transformers"]["wasted_fraction"]) < 0.1
    # 4 slots refilled as rows end: fewer rows idle than in a batch that only shrinks
    assert r["slots"] == 4 and r["ours_continuous"]["wasted_fraction"] < r["ours"]["wasted_fraction"]


@pytest.mark.parametrize("family,cls", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_the_sampler_bench_runs_transformers_on_the_model_s_own_family(tmp_path, family, cls):
    """The baseline is the same architecture as ours (a Llama preset once ran as a Qwen3 with extra q/k norms)."""
    import dataclasses

    from atgrpo_jax.models import get_preset
    cfg = dataclasses.replace(get_preset("test-tiny"), family=family)
    _, theirs = bench.make_models(cfg, 0, str(tmp_path))
    assert type(theirs).__name__ == cls
