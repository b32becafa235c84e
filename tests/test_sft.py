"""The sft command: assistant-only masks, packing that keeps conversations apart, the loss against
transformers, a run that learns, resume, export, `model.init_from` and one-line errors."""
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax import cli
from atgrpo_jax.errors import ConfigError, DataError
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.tokenizer import char_tokenizer, encode_chat, qwen3_tokenizer
from atgrpo_jax.sft import data
from atgrpo_jax.sft.update import sft_loss
from atgrpo_jax.train.validate import resolve
from command_util import exit_and_stderr
from shared_builds import built_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "configs", "demo.py")
# Memorizable conversations in the demo's alphabet (configs/demo.py: its char tokenizer has no 'y', so no
# system message); the second has two assistant turns.
CHATS = [
    [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "UR"}],
    [{"role": "user", "content": "3+4"}, {"role": "assistant", "content": "DL"},
     {"role": "user", "content": "5"}, {"role": "assistant", "content": "G"}],
    [{"role": "user", "content": "6-1"}, {"role": "assistant", "content": "RRD"}],
    [{"role": "user", "content": "#P"}, {"role": "assistant", "content": "LU."}],
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def demo_config(workdir_data, **changes):
    c = cli.load_config(DEMO)
    c.sft.train_path = workdir_data
    c.sft.update(rows=2, row_tokens=48, steps=4, eval_every=0)
    c.optim.update(lr=1e-2, schedule="constant", warmup_steps=0)
    c.train.update(checkpoint_every=2, keep_last=0, loggers=("jsonl",))
    for key, value in changes.items():
        section, leaf = key.split(".")
        c[section][leaf] = value
    return c


def flat_params(params) -> dict:
    """{"layers/wq": array, ...} of a params tree (an nnx.State, or the dicts a checkpoint restores to)."""
    def name(path):
        parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        return "/".join(p for p in parts if p != "value")
    return {name(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}


def params_of(workdir, step=None):
    """flat_params of the params in a run's checkpoint (the newest, or `step`)."""
    from atgrpo_jax.train.checkpoint import Checkpointer

    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=0, best_metric=None, read_only=True)
    state, _ = ckpt.restore(step)
    ckpt.close()
    return flat_params(state["policy"]["params"])


@pytest.fixture(scope="module")
def sft_run():
    """A run of the command itself on CHATS, long enough to memorize them (built once for every worker)."""
    def build(folder):
        root = pathlib.Path(folder)
        source = write_jsonl(root / "chats.jsonl", [{"messages": m} for m in CHATS])
        valid = write_jsonl(root / "valid.jsonl", [{"messages": CHATS[0]}])
        proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.sft", f"--config={DEMO}", f"--workdir={root / 'run'}",
                               f"--config.sft.train_path={source}", f"--config.sft.valid_path={valid}",
                               "--config.sft.steps=30", "--config.sft.rows=4", "--config.sft.row_tokens=48",
                               "--config.sft.eval_every=15", "--config.optim.lr=3e-3", "--config.optim.warmup_steps=0",
                               "--config.train.checkpoint_every=10", "--config.train.loggers=('jsonl',)"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]

    root = pathlib.Path(built_once("sft_run", build))
    return {"root": root, "source": root / "chats.jsonl", "workdir": str(root / "run")}


def test_exactly_the_assistant_tokens_are_scored_with_qwen3s_template():
    tok = qwen3_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "It is 4."}, {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "6, of course."}]
    examples = data.examples_of([{"messages": messages}], "chats", tok)
    # Qwen3's template drops an earlier turn's think block once the talk goes on: one sequence per turn,
    # each as the sampler shows the conversation to the model when it answers
    assert len(examples) == 2
    for ex, j, content in zip(examples, (2, 4), ("It is 4.", "6, of course.")):
        assert tok.decode(ex.tokens[ex.scored]) == content + "<|im_end|>"
        first = int(np.argmax(ex.scored))
        assert ex.tokens[:first].tolist() == encode_chat(tok, messages[:j])
        assert ex.scored[first:].all() and len(ex.tokens) == first + int(ex.scored.sum())
    # a template that keeps earlier turns as rendered (the char one): both turns in one sequence
    [one] = data.examples_of([{"messages": CHATS[1]}], "chats", char_tokenizer())
    ctok = char_tokenizer()
    assert ctok.decode(one.tokens[one.scored]) == "DL<|im_end|>G<|im_end|>"
    assert "3+4" in ctok.decode(one.tokens[~one.scored]) and "5" in ctok.decode(one.tokens[~one.scored])


def tiny_model():
    return Qwen3(get_preset("test-tiny", num_layers=1), rngs=nnx.Rngs(0))


def packed_loss(model, examples, placed, rows=1, row_tokens=64):
    batch, counts = data.pack_rows(examples, placed, rows, row_tokens)
    return float(jax.jit(lambda m, r: sft_loss(m, r, 16))(model, data.Rows(*map(jnp.asarray, batch)))), counts


def test_packed_conversations_do_not_see_each_other():
    tok = char_tokenizer()
    a, b = data.examples_of([{"messages": CHATS[0]}, {"messages": CHATS[2]}], "chats", tok)
    model = tiny_model()
    both, counts = packed_loss(model, [a, b], [(0, 0, 0), (1, 0, len(a.tokens))])
    alone_a, na = packed_loss(model, [a], [(0, 0, 0)])
    alone_b, nb = packed_loss(model, [b], [(0, 0, 0)])
    assert counts["tokens"] == na["tokens"] + nb["tokens"] and counts["sequences"] == 2
    expected = (alone_a * na["tokens"] + alone_b * nb["tokens"]) / counts["tokens"]
    assert abs(both - expected) < 1e-5
    # b placed in a second row (the other packing): the same loss again, and a padded row changes nothing
    apart, _ = packed_loss(model, [a, b], [(0, 0, 0), (1, 1, 0)], rows=3)
    assert abs(apart - expected) < 1e-5


def test_the_loss_is_transformers_cross_entropy_on_the_assistant_tokens(tmp_path):
    import torch
    from hf_fixtures import make_hf_checkpoint

    from atgrpo_jax.models.hf_io import load_pretrained

    torch_model = make_hf_checkpoint(tmp_path / "hf", vocab=128, hidden=48, inter=64, layers=2, heads=4,
                                     kv_heads=2, head_dim=16)
    model = load_pretrained(str(tmp_path / "hf"))
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, 128, 24).astype(np.int32)
    scored = np.zeros(24, bool)
    scored[[5, 6, 7, 15, 16, 23]] = True
    ours, _ = packed_loss(model, [data.Example(tokens, scored)], [(0, 0, 0)], row_tokens=32)
    with torch.no_grad():
        logits = torch_model(input_ids=torch.tensor(tokens[None], dtype=torch.long)).logits[0].float()
    j = np.flatnonzero(scored)
    ce = torch.nn.functional.cross_entropy(logits[j - 1], torch.tensor(tokens[j], dtype=torch.long))
    assert abs(ours - float(ce)) < 1e-4


def test_the_command_learns_the_conversations(sft_run):
    from atgrpo_jax.train.metrics_files import read_metrics

    rows = read_metrics(sft_run["workdir"])
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 31))
    assert {"loss", "tokens", "lr", "grad_norm", "truncated"} <= set(steps[0])
    assert steps[-1]["loss"] < 0.1 * steps[0]["loss"], [round(r["loss"], 3) for r in steps]
    assert all(r["truncated"] == 0 and r["tokens"] > 0 for r in steps)
    valid = [r["valid_loss"] for r in rows if "valid_loss" in r]
    assert len(valid) == 3 and valid[-1] < 0.1 * valid[0]  # steps 0, 15 and 30
    config = json.load(open(os.path.join(sft_run["workdir"], "config.json")))
    assert config["sft"]["steps"] == 30 and config["policy"]["sharing"] == "shared"
    assert sorted(os.listdir(os.path.join(sft_run["workdir"], "checkpoints")))[-1] == "30"


def test_resume_continues_as_one_uninterrupted_run(tmp_path):
    from atgrpo_jax.sft.loop import run_sft

    source = write_jsonl(tmp_path / "chats.jsonl", [{"messages": m} for m in CHATS])
    run_sft(demo_config(source), str(tmp_path / "whole"))
    run_sft(demo_config(source, **{"sft.steps": 2}), str(tmp_path / "parts"))
    run_sft(demo_config(source), str(tmp_path / "parts"))  # sft.steps may grow on a resume
    whole, parts = params_of(str(tmp_path / "whole"), 4), params_of(str(tmp_path / "parts"), 4)
    assert whole.keys() == parts.keys()
    assert all(np.allclose(whole[k], parts[k], rtol=0, atol=1e-6) for k in whole)
    assert not np.allclose(params_of(str(tmp_path / "whole"), 2)["embed"], whole["embed"])
    with pytest.raises(ConfigError, match=r"config\.sft\.row_tokens: 48 in the run, 64 now"):
        run_sft(demo_config(source, **{"sft.steps": 6, "sft.row_tokens": 64}), str(tmp_path / "parts"))


def test_export_writes_the_sft_weights_as_a_hugging_face_model(sft_run, tmp_path):
    import transformers

    from atgrpo_jax.export import export_policy

    out = tmp_path / "hf"
    summary = export_policy(sft_run["workdir"], str(out))
    assert summary["step"] == 30 and summary["policy"] == "policy"
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(os.listdir(out))
    card = (out / "README.md").read_text()
    assert "# Supervised warm start" in card and "| steps | 30 of 30 (4 packed rows of 48 tokens per step) |" in card
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    embed = params_of(sft_run["workdir"])["embed"]
    assert np.allclose(model.get_input_embeddings().weight.detach().numpy(), embed, atol=1e-6)


@pytest.mark.parametrize("sharing", ["shared", "per_role", "lora"])
def test_a_train_run_starts_from_the_sft_weights(sft_run, sharing):
    from atgrpo_jax.train.setup import build_run

    c = cli.load_config(DEMO)
    c.model.init_from = sft_run["workdir"]
    c.policy.sharing = sharing
    sft = params_of(sft_run["workdir"])
    run = build_run(resolve(c), init_from=True)
    for p in run.policies:
        weights = flat_params(p.frozen if p.is_lora else p.state.params)
        assert set(sft) <= set(weights) and all(np.array_equal(sft[k], weights[k]) for k in sft), p.name
    # a run that restores its own checkpoints (export, evaluate) does not read model.init_from
    p = build_run(resolve(c)).policies[0]
    assert not np.array_equal(flat_params(p.frozen if p.is_lora else p.state.params)["embed"], sft["embed"])


def test_a_model_that_does_not_fit_the_sft_weights_is_one_line(sft_run):
    from atgrpo_jax.train.setup import build_run

    c = cli.load_config(DEMO)
    c.model.update(init_from=sft_run["workdir"], vocab_size=64)
    with pytest.raises(ConfigError, match=r"config\.model\.init_from: checkpoint 30 of .* does not fit this model"):
        build_run(resolve(c), init_from=True)


def test_the_train_command_starts_from_model_init_from(sft_run, tmp_path, monkeypatch):
    from atgrpo_jax.train import loop

    seen = {}

    class Stop(Exception):
        pass

    def first_step(run, step, **kw):  # the loop's first update would start from these weights
        seen["params"] = flat_params(run.policies[0].state.params)
        raise Stop

    monkeypatch.setattr(loop, "train_step", first_step)
    c = cli.load_config(DEMO)
    c.model.init_from = sft_run["workdir"]
    c.train.update(eval_every=0, loggers=("jsonl",))
    with pytest.raises(Stop):
        loop.run_training(c, str(tmp_path / "train"))
    sft = params_of(sft_run["workdir"])
    assert all(np.array_equal(sft[k], seen["params"][k]) for k in sft)
    c.model.init_from = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"config\.model\.init_from: .*nowhere is not a run's workdir"):
        loop.run_training(c, str(tmp_path / "train2"))


@pytest.mark.parametrize("rows,message", [
    ([{"text": "hi"}], "chats.jsonl: row 1 has no \"messages\""),
    ([{"messages": CHATS[0]}, {"messages": [{"role": "user", "content": 3}]}],
     "chats.jsonl: row 2, message 1: content must be a string, got int"),
    ([{"messages": [{"role": "user", "content": "1"}]}], "row 1 has no assistant message"),
    ([{"messages": [{"role": "tool", "content": "1"}]}], "row 1, message 1: role must be one of"),
])
def test_a_bad_row_is_one_line_naming_it(tmp_path, capsys, rows, message):
    from atgrpo_jax.sft.loop import run_sft

    source = write_jsonl(tmp_path / "chats.jsonl", rows)
    with pytest.raises(SystemExit) as e, cli.fail():
        run_sft(demo_config(source), str(tmp_path / "run"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_the_command_refuses_bad_input_in_one_line_before_writing(tmp_path, capsys):
    """The first case through the command; the others through its main in this process (command_util)."""
    from atgrpo_jax.sft.__main__ import main

    workdir = tmp_path / "run"
    cases = [
        ([f"--config.sft.train_path={tmp_path / 'missing.jsonl'}"], "missing.jsonl' does not exist"),
        ([], "config.sft.train_path: is required"),
        ([f"--config.sft.train_path={tmp_path}", "--config.sft.rows=0"], "config.sft.rows: must be > 0, got 0"),
        ([f"--config.sft.train_path={tmp_path}", "--config.train.steps=60"],
         "--config.train.steps: `sft` does not read it; its length is sft.steps"),  # not silently ignored
    ]
    args, message = cases[0]
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.sft", f"--config={DEMO}", f"--workdir={workdir}", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("error: ") and message in lines[-1], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for args, message in cases[1:]:
        code, lines = exit_and_stderr(main, [f"--config={DEMO}", f"--workdir={workdir}", *args], capsys)
        assert code == 2 and lines[-1].startswith("error: ") and message in lines[-1], lines
    assert not workdir.exists()


def test_sft_refuses_a_config_of_several_policies():
    from atgrpo_jax.train.validate import validate_sft

    c = cli.load_config(DEMO)
    c.sft.train_path = "chats.jsonl"
    c.policy.sharing = "per_role"
    with pytest.raises(ConfigError, match=r"config\.policy\.sharing: sft trains one full model"):
        validate_sft(resolve(c))


def test_the_stream_gives_each_step_its_own_sequences_and_cuts_long_ones():
    lengths = np.array([10, 30, 5, 70, 12])
    cursor, seen = data.Cursor(), []
    for _ in range(6):
        placed, cursor = data.plan_step(lengths, cursor, rows=2, row_tokens=40, seed=3)
        seen += [i for i, _, _ in placed]
        assert all(c + min(lengths[i], 40) <= 40 for i, _, c in placed)  # each fits its row (a long one cut)
    first_epoch = seen[:5]
    assert sorted(first_epoch) == [0, 1, 2, 3, 4]  # every sequence once per epoch
    again, _ = data.plan_step(lengths, data.Cursor(), rows=2, row_tokens=40, seed=3)
    assert [i for i, _, _ in again] == seen[:len(again)]  # a pure function of the seed and the step
    examples = [data.Example(np.arange(n, dtype=np.int32), np.arange(n) > 0) for n in lengths]
    _, counts = data.pack_rows(examples, [(3, 0, 0)], 1, 40)
    assert counts["truncated"] == 1 and counts["tokens"] == 39
    with pytest.raises(DataError, match="no rows"):
        data.examples_of([], "empty.jsonl", char_tokenizer())


def test_a_parquet_source_reads_as_the_same_conversations(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet  # noqa: F401

    pa.parquet.write_table(pa.Table.from_pylist([{"messages": m} for m in CHATS]), str(tmp_path / "chats.parquet"))
    tok = char_tokenizer()
    from_parquet = data.load_examples(str(tmp_path / "chats.parquet"), tok)
    from_jsonl = data.load_examples(write_jsonl(tmp_path / "chats.jsonl", [{"messages": m} for m in CHATS]), tok)
    assert len(from_parquet) == len(CHATS)
    assert all(np.array_equal(a.tokens, b.tokens) and np.array_equal(a.scored, b.scored)
               for a, b in zip(from_parquet, from_jsonl))
