"""A trimmed Qwen3 tokenizer: Qwen3's pieces on its corpus, any text encodable, checked when loaded."""
import json

import pytest

from atgrpo_jax.models.tokenizer import qwen3_tokenizer, render_chat
from atgrpo_jax.models.trimmed import load_trimmed, save_trimmed, trim_qwen3
from atgrpo_jax.train.setup import make_tokenizer

CORPUS = [render_chat(qwen3_tokenizer(), [{"role": "user", "content": "Grid:\n.#..\n..#G\nYou are at (row 1, col 0)."},
                                          {"role": "assistant", "content": '#### ["U", "R"]'}], False)]


def test_cuts_its_corpus_as_qwen3_does_and_any_text_still_round_trips(tmp_path):
    full = qwen3_tokenizer()
    tok, qwen3_ids = trim_qwen3(CORPUS)
    assert 256 + 26 <= len(tok) < 600  # the byte tokens, the added tokens and what the corpus uses
    ids = tok.encode(CORPUS[0], add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == full.convert_ids_to_tokens(full.encode(CORPUS[0]))
    assert [qwen3_ids[i] for i in ids] == full.encode(CORPUS[0])  # the id map leads back to Qwen3's ids
    for text in ("Zebra crossing 漢字 ✓ \t\n", "def f(x):\n    return x ** 2"):  # outside the corpus
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id == len(tok) - 26 + 2
    save_trimmed(tok, qwen3_ids, str(tmp_path))
    loaded = make_tokenizer(str(tmp_path))  # config.tokenizer=DIR
    assert loaded.encode(CORPUS[0], add_special_tokens=False) == ids
    assert render_chat(loaded, [{"role": "user", "content": "hi"}]) == render_chat(full, [{"role": "user", "content": "hi"}])


def test_a_trimmed_directory_whose_ids_do_not_match_qwen3_is_refused(tmp_path):
    tok, qwen3_ids = trim_qwen3(CORPUS)
    save_trimmed(tok, [qwen3_ids[1], qwen3_ids[0]] + qwen3_ids[2:], str(tmp_path))
    with pytest.raises(ValueError, match="not Qwen3's"):
        load_trimmed(str(tmp_path))
    (tmp_path / "trimmed.json").write_text(json.dumps({"source": "qwen3"}))
    with pytest.raises(ValueError, match="trimmed.json"):
        make_tokenizer(str(tmp_path))
