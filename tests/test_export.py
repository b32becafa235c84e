"""Export: a run's policy as a Hugging Face directory that transformers (and PEFT, for adapters) load
with the trained weights: logits equal to the trainer's model within 1e-4."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from atgrpo_jax import cli
from atgrpo_jax.export import export_policy
from hf_fixtures import left_padded_batch, make_hf_checkpoint, torch_logits
from shared_builds import built_once
from tiny_config import tiny

HF = dict(vocab=128, hidden=48, inter=64, layers=2, heads=4, kv_heads=2, head_dim=16)


def tiny_run(base: str, sharing: str):
    """The tests' tiny run, started from the Hugging Face checkpoint `base`, one step whose update moves the
    weights (and LoRA's B off zero) measurably."""
    return tiny(**{"model.preset": "", "model.hf_path": base, "policy.sharing": sharing, "optim.lr": 3e-2,
                   "optim.warmup_steps": 0, "train.steps": 1, "train.eval_every": 0, "train.checkpoint_every": 1,
                   "train.log_episodes_every": 0})


@pytest.fixture(scope="module")
def runs():
    """A one-step run in each regime, built once for every worker: per_role and lora from a Qwen3
    checkpoint, shared from a tied Llama one (so one run covers another family too; the per-role
    exports cover Qwen3's)."""
    from atgrpo_jax.train.loop import run_training

    def build(root):
        make_hf_checkpoint(os.path.join(root, "base"), **HF)
        for sharing in ("per_role", "lora"):
            run_training(tiny_run(os.path.join(root, "base"), sharing), os.path.join(root, sharing))
        make_hf_checkpoint(os.path.join(root, "llama_base"), **HF, family="llama", tied=True)
        run_training(tiny_run(os.path.join(root, "llama_base"), "shared"), os.path.join(root, "shared"))

    root = built_once("export_runs", build)
    return {name: os.path.join(root, name) for name in ("base", "shared", "per_role", "lora", "llama_base")}


def trained_policy(workdir: str, index: int):
    """The run's policy `index` as the trainer restores it."""
    from atgrpo_jax.train.checkpoint import Checkpointer
    from atgrpo_jax.train.config import from_saved
    from atgrpo_jax.train.setup import build_run
    from atgrpo_jax.train.validate import resolve
    from atgrpo_jax.train.step import policy_states, set_policy_states
    from atgrpo_jax import workdir as wd

    run = build_run(resolve(from_saved(wd.saved_config(workdir))))
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=0, read_only=True)
    states, _ = ckpt.restore(ckpt.all_steps()[-1], target=policy_states(run))
    set_policy_states(run, states)
    ckpt.close()
    return run.policies[index]


def batch():
    return left_padded_batch(np.random.RandomState(0), HF["vocab"], [9, 5, 9])


def our_logits(model):
    tokens, mask, positions = batch()
    logits, _ = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    return np.asarray(logits)[mask]


def hf_logits(model):
    tokens, mask, positions = batch()
    return torch_logits(model, tokens, mask, positions)[mask]


def assert_close(got, want):
    assert np.abs(want).max() > 1.0  # not a comparison between near-zeros
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_a_llama_policy_trains_and_exports_as_llama(runs, tmp_path):
    """A run started from a Llama checkpoint exports a LlamaForCausalLM with its trained weights."""
    export_policy(runs["shared"], str(tmp_path / "hf"))
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert type(exported).__name__ == "LlamaForCausalLM"
    assert_close(hf_logits(exported), our_logits(trained_policy(runs["shared"], 0).model()))
    base = transformers.AutoModelForCausalLM.from_pretrained(runs["llama_base"]).eval()
    assert np.abs(hf_logits(base) - hf_logits(exported)).max() > 1e-3  # the trained weights, not the base's


def test_a_shared_policy_loads_in_transformers_with_the_trained_weights(runs, tmp_path):
    out = str(tmp_path / "hf")
    summary = export_policy(runs["shared"], out)
    assert summary["step"] == 1 and summary["policy"] == "policy"
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    policy = trained_policy(runs["shared"], 0)
    assert_close(hf_logits(exported), our_logits(policy.model()))
    base = transformers.AutoModelForCausalLM.from_pretrained(runs["llama_base"]).eval()
    assert np.abs(hf_logits(base) - hf_logits(exported)).max() > 1e-3  # the trained weights, not the base's
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("go R")["input_ids"] == policy_tokenizer(runs["shared"])("go R")["input_ids"]
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) == {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    card = (tmp_path / "hf" / "README.md").read_text()  # the model card: hub front matter, this run's facts
    assert card.startswith("---\nlibrary_name: transformers\n") and "| steps | 1 of 1 " in card
    assert "| regime | `shared` |" in card and "No held-out evaluation" in card  # the run never evaluated
    assert not any(name.startswith(".") for name in os.listdir(tmp_path))  # no partial directory left
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~mask  # readable by a server running as another user
    assert all(os.stat(os.path.join(out, f)).st_mode & 0o777 == 0o666 & ~mask for f in os.listdir(out))


def policy_tokenizer(workdir):
    from atgrpo_jax.train.config import from_saved
    from atgrpo_jax.train.setup import make_tokenizer
    from atgrpo_jax import workdir as wd

    c = from_saved(wd.saved_config(workdir))
    return make_tokenizer(c.tokenizer, c.model.hf_path, c.char_alphabet)


def test_each_per_role_policy_exports_on_its_own(runs, tmp_path):
    with pytest.raises(cli.UsageError, match=r"2 policies: choose one with --policy \(policy_planner, policy_executor\)"):
        export_policy(runs["per_role"], str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()  # nothing written
    logits = []
    for i, name in enumerate(("policy_planner", "policy_executor")):
        export_policy(runs["per_role"], str(tmp_path / name), policy=name)
        exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / name)).eval()
        logits.append(hf_logits(exported))
        assert_close(logits[-1], our_logits(trained_policy(runs["per_role"], i).model()))
    assert np.abs(logits[0] - logits[1]).max() > 1e-3  # two policies, each trained on its own agent


@pytest.mark.parametrize("index,name", [(0, "lora_planner"), (1, "lora_executor")])
def test_lora_merged_and_as_a_peft_adapter(runs, tmp_path, index, name):
    from peft import PeftModel

    from atgrpo_jax.models.lora import merge_lora

    policy = trained_policy(runs["lora"], index)
    want = our_logits(policy.model())
    assert_close(our_logits(merge_lora(policy.model())), want)
    export_policy(runs["lora"], str(tmp_path / "merged"), policy=name)
    assert_close(hf_logits(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()), want)
    export_policy(runs["lora"], str(tmp_path / "adapter"), policy=name, lora="adapter")
    assert sorted(os.listdir(tmp_path / "adapter"))[:3] == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    base = transformers.AutoModelForCausalLM.from_pretrained(runs["base"])
    base_logits = hf_logits(base.eval())
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert_close(hf_logits(adapted), want)
    assert np.abs(base_logits - want).max() > 1e-3  # the adapters matter


def test_bad_requests_name_what_is_wrong_and_write_nothing(runs, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not empty: give a new directory or --overwrite"):
        export_policy(runs["shared"], str(tmp_path / "full"))
    assert os.listdir(tmp_path / "full") == ["keep.txt"]
    with pytest.raises(cli.UsageError, match=r"--step=7: no checkpoint of that step .* \(steps: \[1\]\)"):
        export_policy(runs["shared"], str(tmp_path / "a"), step=7)
    with pytest.raises(cli.UsageError, match="--lora=adapter: policy policy is a full model"):
        export_policy(runs["shared"], str(tmp_path / "b"), lora="adapter")
    with pytest.raises(cli.UsageError, match="--policy=critic: the run has no such policy"):
        export_policy(runs["shared"], str(tmp_path / "c"), policy="critic")
    with pytest.raises(FileNotFoundError, match="no config.json there"):
        export_policy(str(tmp_path / "full"), str(tmp_path / "d"))
    assert sorted(os.listdir(tmp_path)) == ["full"]


def test_generation_config_carries_the_repetition_penalty():
    """transformers' repetition penalty is vLLM's definition (prompt and response ids), so an exported
    policy samples as its agents did; at 1 the field is left out (transformers' default)."""
    from types import SimpleNamespace

    from atgrpo_jax.export import generation_config
    from atgrpo_jax.train.config import Config

    c = Config().replace_at("rollout.top_k", 20).replace_at("rollout.top_p", 0.9)
    c = c.replace_at("rollout.repetition_penalty", 1.2)
    run = SimpleNamespace(config=c, sampling=[c.rollout.agent("a"), c.rollout.agent("b")], policy_of_agent=[0, 0],
                          stop_ids=(151645,), tokenizer=SimpleNamespace(pad_token_id=0))
    gen = generation_config(run, 0)
    assert (gen.repetition_penalty, gen.top_k, gen.top_p) == (1.2, 20, 0.9)
    run.config = c = c.replace_at("rollout.repetition_penalty", 1.0)
    run.sampling = [c.rollout.agent("a")]
    run.policy_of_agent = [0]
    assert generation_config(run, 0).repetition_penalty in (None, 1.0)  # unset: transformers applies none


def test_a_run_continues_from_its_export_with_model_hf_path_alone(tmp_path):
    """The tests' tiny config (a preset sized by model.vocab_size) exported, then started again from the
    export by setting model.hf_path and nothing else: the new run's weights are the trained ones."""
    from atgrpo_jax.train.loop import run_training
    from atgrpo_jax.train.setup import build_run
    from atgrpo_jax.train.validate import resolve

    work, out = str(tmp_path / "run"), str(tmp_path / "hf")
    run_training(tiny(**{"optim.lr": 3e-2, "optim.warmup_steps": 0, "train.steps": 1, "train.eval_every": 0,
                         "train.checkpoint_every": 1, "train.log_episodes_every": 0}), work)
    export_policy(work, out)
    again = build_run(resolve(tiny(**{"model.hf_path": out})))
    trained = trained_policy(work, 0)
    got, want = jax.tree.leaves(again.policies[0].state.params), jax.tree.leaves(trained.state.params)
    assert len(got) == len(want) and all(np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
                                         for a, b in zip(got, want))
