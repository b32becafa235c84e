"""Qwen3's tokenizer cut down to the tokens a corpus uses: a small model's LM head without 151k rows.

`trim_qwen3(texts)` keeps Qwen3's byte-level BPE, its pre-tokenizer, its chat template and its 26
added tokens, and of its 151,643 ordinary tokens only

- the 256 single-byte tokens, so every string stays encodable;
- every token Qwen3 makes of the corpus, and every token its merges pass through on the way.

The kept tokens are numbered from 0 in Qwen3's order, the added tokens after them. On the corpus the
trimmed tokenizer cuts every text into exactly Qwen3's pieces (checked when it is built: BPE applies the
lowest-ranked available merge, and every merge Qwen3 applies there is kept). Text outside the corpus (a
sampled reply, a program's output) is cut into smaller pieces than Qwen3 would make, down to single
bytes, and a model over it can only emit the kept tokens. The ids are not Qwen3's, so such a model
cannot load Qwen3 weights: it is for models trained from scratch.

Saved as a Hugging Face tokenizer directory plus `trimmed.json`, the Qwen3 id of every kept token;
`load_trimmed(DIR)` (what `config.tokenizer=DIR` calls for such a directory) loads it and checks
those tokens against Qwen3's.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable

from tokenizers import Tokenizer, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

from atgrpo_jax.models.tokenizer import (QWEN3_CHAT_TEMPLATE, QWEN3_FIRST_ADDED_ID, QWEN3_MODEL_MAX_LENGTH,
                                         load_tokenizer_dir, qwen3_tokenizer)

TRIMMED_FILE = "trimmed.json"


def trim_qwen3(texts: Iterable[str]) -> tuple[PreTrainedTokenizerFast, list[int]]:
    """(the trimmed tokenizer, the Qwen3 id of each of its ids) for the corpus `texts` (see the module doc)."""
    full = qwen3_tokenizer()
    spec = json.loads(full.backend_tokenizer.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    texts = list(texts)
    used = {i for text in texts for i in full.encode(text, add_special_tokens=False) if i < QWEN3_FIRST_ADDED_ID}
    keep = {vocab[ch] for ch in pre_tokenizers.ByteLevel.alphabet()} | used
    kept_tokens = {token for token, i in vocab.items() if i in keep}
    for left, right in reversed(merges):  # a merge's parts are made by earlier merges: one backward pass
        if left + right in kept_tokens:
            kept_tokens |= {left, right}
    old_ids = sorted(vocab[t] for t in kept_tokens)
    new_vocab = {token: n for n, token in enumerate(sorted(kept_tokens, key=vocab.__getitem__))}
    spec["model"]["vocab"] = new_vocab
    spec["model"]["merges"] = [m for m in merges if m[0] in kept_tokens and m[1] in kept_tokens
                               and m[0] + m[1] in kept_tokens]
    for n, added in enumerate(spec["added_tokens"]):
        old_ids.append(added["id"])
        added["id"] = len(new_vocab) + n
    raw = Tokenizer.from_str(json.dumps(spec))
    tokenizer = _wrap(raw, full.chat_template, QWEN3_MODEL_MAX_LENGTH, full)
    for text in texts:  # the promise above, checked rather than assumed
        want = full.convert_ids_to_tokens(full.encode(text, add_special_tokens=False))
        got = tokenizer.convert_ids_to_tokens(tokenizer.encode(text, add_special_tokens=False))
        if got != want:
            raise AssertionError(f"trimmed Qwen3 tokenizer cuts {text[:60]!r} differently: {got[:8]} vs {want[:8]}")
    return tokenizer, old_ids


def _wrap(raw: Tokenizer, chat_template: str, max_length: int, like: PreTrainedTokenizerFast):
    tokenizer = Qwen2Tokenizer(tokenizer_object=raw, eos_token=like.eos_token, pad_token=like.pad_token,
                               unk_token=None, bos_token=None,
                               extra_special_tokens=[t for t in like.all_special_tokens
                                                     if t not in (like.eos_token, like.pad_token)],
                               model_max_length=max_length, clean_up_tokenization_spaces=False)
    tokenizer.chat_template = chat_template
    return tokenizer


def save_trimmed(tokenizer: PreTrainedTokenizerFast, qwen3_ids: list[int], directory: str) -> None:
    tokenizer.save_pretrained(directory)
    with open(os.path.join(directory, TRIMMED_FILE), "w") as f:
        json.dump({"source": "qwen3", "qwen3_ids": qwen3_ids}, f)


def is_trimmed(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, TRIMMED_FILE))


def load_trimmed(directory: str) -> PreTrainedTokenizerFast:
    """The trimmed tokenizer saved in `directory`; a ValueError unless each of its tokens is Qwen3's at
    the id `trimmed.json` gives (another tokenizer's files, or a damaged directory)."""
    path = os.path.join(directory, TRIMMED_FILE)
    try:
        with open(path) as f:
            qwen3_ids = json.load(f)["qwen3_ids"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a trimmed tokenizer's id list ({e})") from e
    tokenizer = load_tokenizer_dir(directory)
    full = qwen3_tokenizer()
    if len(tokenizer) != len(qwen3_ids) or (tokenizer.convert_ids_to_tokens(list(range(len(qwen3_ids))))
                                            != full.convert_ids_to_tokens(qwen3_ids)):
        raise ValueError(f"{directory}: its tokens are not Qwen3's at the ids in {TRIMMED_FILE}")
    if not tokenizer.chat_template:
        tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer
