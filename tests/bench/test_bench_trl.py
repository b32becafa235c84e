"""`bench trl`: TRL's GRPOTrainer is configured to do this project's plain GRPO step, and the command runs
both sides on one model and reports what it says (full tier: TRL's import alone is ~10 s of CPU)."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from hf_fixtures import make_hf_checkpoint

pytestmark = pytest.mark.full  # tiers.py

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_trl_is_given_every_setting_of_the_same_work():
    from atgrpo_jax.bench.trl_side import trl_config

    spec = {"out": "/tmp/unused", "seed": 3, "steps": 7, "prompts_per_step": 8, "k": 4, "max_new_tokens": 16,
            "temperature": 0.9, "lr": 2e-5, "save_steps": 7}
    c = trl_config(spec)
    assert (c.per_device_train_batch_size, c.num_generations, c.steps_per_generation, c.num_iterations) == (32, 4, 1, 1)
    assert (c.max_completion_length, c.temperature, c.top_k, c.top_p) == (16, 0.9, 0, 1.0)
    assert (c.loss_type, c.beta, c.epsilon, c.scale_rewards) == ("dapo", 0.0, 0.2, "group")
    assert (c.learning_rate, str(c.lr_scheduler_type), c.weight_decay, c.max_grad_norm) == \
        (2e-5, "SchedulerType.CONSTANT", 0.0, 1.0)
    assert (c.max_steps, c.seed, c.bf16, c.gradient_checkpointing) == (7, 3, False, False)
    assert trl_config({**spec, "dtype": "bfloat16"}).bf16  # --dtype=bfloat16: autocast over the float32 model


def test_the_command_runs_both_sides_and_reports_ratios_and_accuracies(tmp_path):
    """A tiny random Llama with SmolLM2's tokenizer and chat template stands in for the real model."""
    from atgrpo_jax.models.hub_ids import local_model_dir

    model = tmp_path / "tiny-llama"
    make_hf_checkpoint(str(model), vocab=49_152, hidden=32, inter=64, layers=1, heads=2, kv_heads=1, head_dim=16,
                       family="llama", tied=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(local_model_dir("smollm2-135m-instruct"), name), model / name)
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.bench", "trl", f"--model={model}", "--steps=2",
                           "--prompts=2", "--k=2", "--max_new_tokens=4", f"--workdir={tmp_path / 'bench'}", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "trl" and out["step_time_ratio"] > 0 and out["evals"] == [0, 1, 2]
    assert 0.0 <= out["start_accuracy"] <= 1.0
    (seed,) = out["seeds"]
    for side in ("ours", "trl"):
        assert [s["step"] for s in seed[side]["steps"]] == [1, 2]
        assert all(0 < s["sampled_tokens"] <= 2 * 2 * 4 for s in seed[side]["steps"])
        assert set(seed[side]["accuracy"]) == {"1", "2"} and seed[side]["peak_rss_gb"] > 0
    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "bench" / "seed0" / "trl" / "checkpoint-*"))) \
        == ["checkpoint-1", "checkpoint-2"]
    assert "step_time_ratio (TRL / ours" in proc.stdout
    assert (tmp_path / "bench" / "curves.png").stat().st_size > 0
    assert json.loads((tmp_path / "bench" / "bench_trl.json").read_text())["step_time_ratio"] == out["step_time_ratio"]
