"""`bench device --tiny` on this CPU: every part runs in its own process and reports what the
issue asks for (so the check cannot rot before a session with a GPU runs it); a part that
overruns its limit or fails is reported as such without losing the others; the floors count
what they say."""
import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from atgrpo_jax.bench import device, device_parts, device_update
from atgrpo_jax.models import get_preset

# The suite's budget (tiers.py): `bench device --tiny` runs in the full tier, every part of it.
TINY_PARTS = device.PARTS


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device")
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.bench", "device", "--tiny", f"--out={out}",
                           "--time-scale=8", f"--parts={','.join(TINY_PARTS)}"], capture_output=True, text=True, timeout=900)
    return proc, json.loads((out / "device.json").read_text()), out


def every_part_reports(tiny_run):
    proc, res, _ = tiny_run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert list(res["parts"]) == list(TINY_PARTS)
    assert all(r["status"] == "ok" for r in res["parts"].values()), res
    lines = {"parity": ["parity"], "sampler": ["sampler B=", "long tail"],
             "update": ["update_xla", "update_pytorch", "update step"], "step": ["AT-GRPO step"],
             "decode": ["layers rolled", "layers unrolled", "Pallas attention", "LM head alone"]}
    for line in (x for part in TINY_PARTS for x in lines.get(part, [])):
        assert line in proc.stdout, line


def update_figures(tiny_run):
    p = tiny_run[1]["parts"]
    losses = {k: r["loss"] for k, r in p["update"].items() if k.startswith("update_") and k not in device.UPDATE_DIAGNOSES}
    assert set(losses) == {"update_pytorch", "update_xla", "update_chunked"}  # no cuDNN/splash on a CPU
    ours = [v for k, v in losses.items() if k != "update_pytorch"]
    assert max(ours) - min(ours) < 1e-2  # same weights and batch: the backends agree
    assert p["update"]["update_xla"]["skipped"] == 0.0
    split = p["update"]["update_split"]  # the first backend's step: forward, optimizer, the rest
    assert split["forward_s"] > 0 and split["optimizer_s"] > 0
    assert split["step_s"] == pytest.approx(split["forward_s"] + split["optimizer_s"] + split["backward_and_rest_s"])
    assert "no device timeline" in p["update"]["update_profile"]["note"]  # a CPU; kernels on a GPU
    sweep = p["update"]["update_sweep"]  # the first backend at other chunks and token counts
    assert list(sweep) == [device_update.sweep_key(*v) for v in device_parts.TINY.update_sweep]
    assert all(r["step_seconds"] and r["tokens"] == r["rows"] * device_parts.TINY.update_rows[1] for r in sweep.values())
    losses = [r["loss"] for r in sweep.values()]  # same weights and rows, unrolled or not, recomputing or not
    assert max(losses) - min(losses) < 1e-3, sweep  # bf16 compute: rounding differs with XLA's fusions
    assert (tiny_run[2] / "update_hlo.txt.gz").stat().st_size > 0  # the compiled step, for reading offline


# tiers.py: every part of `bench device --tiny` (a few minutes); test_bench_train covers the update against
# PyTorch and tests/faults/test_operator.py the command's output in the default tier
test_every_part_reports, test_update_figures = pytest.mark.full(every_part_reports), pytest.mark.full(update_figures)

@pytest.mark.full  # tiers.py
def test_parity_figures(tiny_run):
    par = tiny_run[1]["parts"]["parity"]["parity"]
    assert par["ours_f32_vs_f32_ref"]["rel_l2"] < 1e-5  # the same function in float32
    for side in ("ours_bf16_vs_f32_ref", "transformers_bf16_vs_f32_ref"):
        assert 1e-4 < par[side]["rel_l2"] < 5e-2, (side, par[side])  # bf16 rounding, no more
    # ours in bf16 is as close to the float32 truth as transformers in bf16
    assert par["ours_bf16_vs_f32_ref"]["rel_l2"] < 2 * par["transformers_bf16_vs_f32_ref"]["rel_l2"]

@pytest.mark.full  # tiers.py
def test_sampler_and_step_figures(tiny_run):
    p = tiny_run[1]["parts"]
    s = p["sampler"]
    shapes = device_parts.TINY
    assert s["sampler_fixed"]["ours_tokens_per_s"] == pytest.approx(
        shapes.batch * shapes.new / s["sampler_fixed"]["ours_seconds"])
    assert s["sampler_fixed_transformers"]["tokens_per_s"] > 0
    assert s["sampler_longtail"]["useful_tokens"] < shapes.batch * shapes.new
    hlo = gzip.decompress((tiny_run[2] / "decode_hlo.txt.gz").read_bytes()).decode()
    assert "HloModule" in hlo and "while" in hlo  # the decode segment's compiled loop, for reading offline
    st = p["step"]["step"]
    assert st["sampling_seconds"] > 0 and st["environment_seconds"] >= 0 and st["update_seconds"] > 0
    assert st["first_step_seconds"] > st["step_seconds"]  # the first step compiles

@pytest.mark.full  # tiers.py
def test_decode_figures(tiny_run):
    d = tiny_run[1]["parts"]["decode"]
    rows = {str(r) for r in sorted({1, device_parts.TINY.batch})}
    forms = ("decode_step_ms_by_rows", "decode_step_ms_by_rows_unrolled", "decode_step_ms_by_rows_kernel")
    assert all(set(d[key]) == rows for key in forms)
    assert d["kernel_applies"] is False  # test-tiny's head_dim 24: that form ran the einsum (said in the table)
    assert d["lm_head_ms"] > 0 and d["select_t1_ms"] > 0
    assert d["profile_rolled"]["steps"] == d["profile_unrolled"]["steps"] == d["profile_kernel"]["steps"] > 0
    ag = d["kernel_vs_einsum"]  # the einsum against itself here: identical
    assert ag["rows_identical"] == 1.0 and ag["max_logprob_gap_before_it"] == 0.0


def test_agreement_counts_the_steps_before_the_first_different_token():
    from types import SimpleNamespace as S
    tokens = np.arange(12).reshape(3, 4)
    logprobs = np.zeros((3, 4), np.float32)
    other_tokens, other_logprobs = tokens.copy(), logprobs.copy()
    other_tokens[1, 2] = -1  # row 1 differs from step 2 on; its later steps do not count
    other_logprobs[1, 3] = 5.0
    other_logprobs[2, 1] = 0.25
    ag = device_parts.agreement(S(tokens=tokens, logprobs=logprobs), S(tokens=other_tokens, logprobs=other_logprobs))
    assert ag["rows_identical"] == 2 / 3 and ag["min_steps_before_first_difference"] == 2
    assert ag["mean_steps_before_first_difference"] == (4 + 2 + 4) / 3 and ag["max_logprob_gap_before_it"] == 0.25


def test_a_part_over_its_limit_is_reported_and_the_rest_goes_on(tmp_path):
    res = device.run_all(["facts"], tiny=True, out_dir=tmp_path, scale=0.0005)
    assert res["parts"]["facts"]["status"].startswith("timed out")
    assert "part facts: timed out" in device.table(res)
    assert json.loads((tmp_path / "device.json").read_text())["parts"]["facts"]["status"].startswith("timed out")


def test_unknown_part_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        device.main(["--parts=facts,bogus"])
    assert e.value.code == 2 and "bogus" in capsys.readouterr().err


def test_weight_read_floor_counts_every_weight_but_the_norms():
    cfg = get_preset("qwen3-1.7b").replace(param_dtype="bfloat16", compute_dtype="bfloat16")
    norms = cfg.num_layers * (2 * cfg.hidden_size + 2 * cfg.head_dim) + cfg.hidden_size
    assert device_parts.weight_read_bytes(cfg) == 2 * (cfg.num_params() - norms)  # tied: the head is the embedding
    assert device_parts.cache_read_bytes(cfg, rows=2, keys=10) == 2 * 28 * 2 * 10 * 8 * 128 * 2


def test_datasheet_peak_by_device_name():
    assert device_parts.datasheet_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert device_parts.datasheet_peak("cpu") is None


def test_tools_scripts_pass_shellcheck():
    from pathlib import Path
    import shutil
    tools = Path(__file__).resolve().parents[2] / "tools"
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    out = subprocess.run([shellcheck, *sorted(str(p) for p in tools.glob("*.sh"))], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
