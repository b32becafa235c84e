"""The attention benchmark measures each backend against the einsum at each length (its timings
are not asserted; the memory it reads from XLA is: the einsum's grows faster than the chunked one's)."""
import json

import numpy as np

from atgrpo_jax.bench import attention as bench


def test_packed_rows_hold_a_prompt_then_the_responses():
    seg = bench.packed_segments(64, responses=4)[0]
    assert (seg[:16] == 0).all() and list(np.unique(seg[16:])) == [1, 2, 3, 4] and (np.diff(seg) >= 0).all()


def test_attention_bench_reports_ratios_to_the_einsum(capsys):
    assert bench.main(["--lengths", "256,1024", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
                       "--block", "128", "--repeats", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]
    by = {(r["backend"], r["length"]): r for r in rows}
    assert set(by) == {(b, t) for b in ("xla", "chunked") for t in (256, 1024)}
    assert all(by[("xla", t)]["memory_ratio"] == 1.0 for t in (256, 1024))
    growth = lambda b: by[(b, 1024)]["temp_mib"] / by[(b, 256)]["temp_mib"]  # noqa: E731
    assert growth("chunked") < growth("xla")
