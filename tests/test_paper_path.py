"""The paper's path as a user walks it: a paper config, a Hugging Face Qwen3 checkpoint with the real
Qwen3 tokenizer (tiny and random here: weights cannot be downloaded), train 2 steps, read what the
agents said, evaluate on a test split, export a policy and load it in transformers.

Code (lora) runs in the default suite; ATGRPO_FULL_SUITE=1 adds Plan-Path through the command line
(shared, in bf16), math (per_role), Sokoban and Sudoku (tiers.py).
ATGRPO_PAPER_MATRIX=1 runs every workflow with every layout instead (15 cases, ~25 minutes on two
cores: too long for the suite's budget, run before a release)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import transformers

from hf_fixtures import make_hf_checkpoint
from tiers import full_case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN3_VOCAB = 151_669
CASES = [("plan_path", "shared"), ("code", "lora")]  # the suite's budget: per_role runs in test_async/test_rollout
FULL_CASES = [("math", "per_role"), ("sokoban", "lora"), ("sudoku", "per_role")]  # the full tier (tiers.py)
if os.environ.get("ATGRPO_PAPER_MATRIX") == "1":
    CASES += [(t, s) for t in ("plan_path", "sokoban", "sudoku", "math", "code")
              for s in ("shared", "per_role", "lora") if (t, s) not in CASES + FULL_CASES]
TEST_SPLITS = {"plan_path": ["test"], "sokoban": ["test"], "sudoku": ["test"], "math": ["aime24"],
               "code": ["codecontests_test"]}
EVAL_K = {"math": 2}  # AIME24: every problem exactly twice
PER_TASK = {"math": {"rollout.max_turns": 1}}  # 60 test episodes: one turn each keeps the suite in budget
PROBLEMS = {"test": 2, "aime24": 30, "aime25": 30, "codecontests_test": 3}  # games: --tasks=2; code: tests/fixtures/data
SMALL = {  # the paper's settings, with a CPU-sized rollout
    "rollout.num_tasks": 2, "rollout.k": 2, "rollout.max_turns": 2, "rollout.max_new_tokens": 16,
    "rollout.max_prompt_len": 1024, "rollout.prompt_buckets": "(1024,)",
    "train.steps": 2, "train.eval_every": 0, "train.checkpoint_every": 2, "train.log_episodes_every": 1,
    "train.log_episodes_tasks": 1, "optim.warmup_steps": 0,
}
FLOAT32 = {"model.param_dtype": "float32", "model.compute_dtype": "float32", "model.remat": False}  # CPU-fast


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random Qwen3 with Qwen3's vocabulary and tokenizer files, as a downloaded model directory is."""
    from atgrpo_jax.models.tokenizer import qwen3_tokenizer

    path = str(tmp_path_factory.mktemp("Qwen3-tiny"))
    make_hf_checkpoint(path, vocab=QWEN3_VOCAB, hidden=32, inter=64, layers=1, heads=2, kv_heads=1, head_dim=16,
                       scale=1.0)
    qwen3_tokenizer().save_pretrained(path)
    return path


def overrides(checkpoint, sharing, task, paper_dtype=False):
    # bfloat16 (the paper's) only for the command-line case: XLA:CPU emulates it, slowly
    return {**SMALL, **({} if paper_dtype else FLOAT32), **PER_TASK.get(task, {}), "model.hf_path": checkpoint,
            "model.preset": "", "policy.sharing": sharing}


def config(task, checkpoint, sharing):
    from atgrpo_jax import cli

    return cli.config_from_args(os.path.join(ROOT, "configs", f"{task}_qwen3_1p7b.py"),
                                [(k, str(v)) for k, v in overrides(checkpoint, sharing, task).items()])


def check_run(workdir, task):
    """What a user looks at after training: metrics, the agents' words, the checkpoint."""
    from atgrpo_jax.train.metrics_files import read_metrics

    rows = read_metrics(workdir)
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["reward_mean"]) for r in rows)
    assert all(v == 0 for r in rows for k, v in r.items() if k.endswith("skipped")), rows  # every update applied
    with open(os.path.join(workdir, "episodes.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]  # log_episodes_every=1, one task each
    first = records[0]["log"][0]
    assert first["prompt"].startswith("<|im_start|>")  # the Qwen3 chat template rendered the prompt
    assert len(first["branches"]) == 2 and all(b["parsed_as"] for b in first["branches"])
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "2"))
    return [turn["agent"] for turn in records[0]["log"]]


def check_export(out, checkpoint):
    """transformers loads the export, with Qwen3's tokenizer and the run's stop ids."""
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == QWEN3_VOCAB
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<think>") == 151667 and len(tok) == QWEN3_VOCAB
    gen = json.loads(open(os.path.join(out, "generation_config.json")).read())
    assert set(gen["eos_token_id"]) == {151645, 151643}  # <|im_end|>, <|endoftext|>


def paper_config_from_the_command_line(checkpoint, tmp_path):
    task, sharing = CASES[0]
    work, out = str(tmp_path / "run"), str(tmp_path / "exported")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    sets = [f"--config.{k}={v}" for k, v in overrides(checkpoint, sharing, task, paper_dtype=True).items()]

    def run(module, *args):
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    run("atgrpo_jax.train", f"--config=configs/{task}_qwen3_1p7b.py", f"--workdir={work}", *sets)
    check_run(work, task)
    (split,) = TEST_SPLITS[task]
    run("atgrpo_jax.evaluate", f"--checkpoint={work}", f"--splits={split}", "--tasks=2", "--k=1")
    result = json.loads(open(os.path.join(work, "eval.json")).read())
    assert result["step"] == 2 and f"eval/{split}/avg@1" in result
    run("atgrpo_jax.export", f"--checkpoint={work}", f"--out={out}")
    check_export(out, checkpoint)
    # the exported model, evaluated with no run at all, plays exactly as the checkpoint did (greedy)
    run("atgrpo_jax.evaluate", f"--config=configs/{task}_qwen3_1p7b.py", f"--hf_path={out}", f"--splits={split}",
        "--tasks=2", "--k=1", f"--out={tmp_path / 'eval_hf'}", *[a for a in sets if "hf_path" not in a])
    again = json.loads((tmp_path / "eval_hf" / "eval.json").read_text())
    assert again[f"eval/{split}/avg@1"] == result[f"eval/{split}/avg@1"]
    responses = lambda path: [[t["response"] for t in json.loads(line)["log"]] for line in open(path)]  # noqa: E731
    assert responses(tmp_path / "eval_hf" / "eval_episodes.jsonl") == responses(os.path.join(work, "eval_episodes.jsonl"))


# tiers.py: ~2 min of bf16 emulated on a CPU; the in-process cases below cover the paper's path
test_paper_config_from_the_command_line = pytest.mark.full(paper_config_from_the_command_line)


@pytest.mark.parametrize("task,sharing", [pytest.param(t, s, id=f"{t}-{s}") for t, s in CASES[1:]]
                         + [full_case(t, s, id=f"{t}-{s}") for t, s in FULL_CASES])
def test_paper_config(checkpoint, tmp_path, task, sharing):
    from atgrpo_jax.evaluate import config_for, run_evaluation
    from atgrpo_jax.export import export_policy
    from atgrpo_jax.train.loop import run_training

    work, splits, k = str(tmp_path / "run"), TEST_SPLITS[task], EVAL_K.get(task, 1)
    run_training(config(task, checkpoint, sharing), work)
    agents = check_run(work, task)
    result = run_evaluation(config_for(work, None, ()), work, splits=splits, tasks=2, k=k)
    assert all(0.0 <= result[f"eval/{split}/avg@{k}"] <= 1.0 for split in splits)
    with open(os.path.join(work, "eval_episodes.jsonl")) as f:
        played = [(r["split"], r["task"]) for r in map(json.loads, f)]
    for split in splits:  # every problem of a finite split exactly k times, no other
        counts = np.bincount([t for s, t in played if s == split], minlength=PROBLEMS[split])
        assert len(counts) == PROBLEMS[split] and (counts == k).all(), split
    policy = "policy" if sharing == "shared" else f"{'lora' if sharing == 'lora' else 'policy'}_{agents[0]}"
    export_policy(work, str(tmp_path / "exported"), policy=policy)
    check_export(str(tmp_path / "exported"), checkpoint)


@pytest.mark.full  # tiers.py: a real 135M model, 3 steps per workflow (~1-3 minutes each)
@pytest.mark.parametrize("task", ["plan_path", "sokoban", "sudoku", "math", "code", "search"])
def test_each_paper_workflow_trains_on_real_text(tmp_path, task):
    """SmolLM2-135M-Instruct, a real model with its own tokenizer and chat template, in each paper
    workflow: three steps with no error, no NaN and no skipped update (real text meets the parsers,
    stop tokens, templates and context lengths that random weights never exercise). It trains as a CPU
    user's run does, on one device: on the suite's 8 simulated devices XLA:CPU may run two collectives of
    one program at once, each holding a thread of its pool (one thread per device) while it waits, and
    the run can deadlock (docs/design/developers.md)."""
    from atgrpo_jax.models.hub_ids import local_model_dir
    from atgrpo_jax.train.metrics_files import read_metrics

    path = local_model_dir("smollm2-135m-instruct")
    sets = {**SMALL, **FLOAT32, **PER_TASK.get(task, {}), "model.hf_path": path, "model.preset": "", "tokenizer": path,
            "policy.sharing": "shared", "train.steps": 3, "train.checkpoint_every": 3,
            # every group updates, even one whose answers all scored alike (a 135M model seldom writes the
            # paper's formats at temperature 1): the update meets the real text whatever the rewards are
            "algo.drop_zero_variance": False, "algo.drop_low_mean_frac": 0.0}
    work = str(tmp_path / "run")
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "").replace(
        "--xla_force_host_platform_device_count=8", "--xla_force_host_platform_device_count=1"))
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.train", f"--config=configs/{task}_qwen3_1p7b.py",
                           f"--workdir={work}", *[f"--config.{k}={v}" for k, v in sets.items()]],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on 1 cpu device" in proc.stderr + proc.stdout
    rows = [r for r in read_metrics(work) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["reward_mean"]) for r in rows), rows
    assert all(v == 0 for r in rows for k, v in r.items() if k.endswith("skipped")), rows
    with open(os.path.join(work, "episodes.jsonl")) as f:
        first = json.loads(f.readline())["log"][0]
    assert first["prompt"].startswith("<|im_start|>")  # SmolLM2's own chat template (ChatML, its system line)
    assert all(b["parsed_as"] for b in first["branches"])  # each answer was read as something, or said why not
