"""The sandbox benchmark runs every setting, checks each run's result and layer, and prints its
JSON line (its timings are not asserted)."""
import json

from atgrpo_jax.bench import sandbox as bench


def test_sandbox_bench_runs_each_setting(capsys):
    assert bench.main(["--programs", "2", "--rounds", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["failures"] == 0 and set(out["per_run_ms"]) == set(bench.SETTINGS)
    assert all(ms > 0 for ms in out["per_run_ms"].values())
