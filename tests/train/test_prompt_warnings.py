"""What would silently change a prompt is said once: characters the char tokenizer has no id for,
and prompts cut to rollout.max_prompt_len."""
from atgrpo_jax.models.tokenizer import char_tokenizer
from atgrpo_jax.train.setup import prompt_warnings


def test_unknown_characters_are_named():
    tok = char_tokenizer("0123456789+")
    warnings = prompt_warnings(tok, [{"role": "user", "content": "3+4="}], 10, 100, "agent 0")
    assert warnings == [("unk", "agent 0's prompt has characters the tokenizer has no id for: '='; they become "
                                "<unk> (add them to char_alphabet)")]
    assert prompt_warnings(tok, [{"role": "user", "content": "3+4"}], 10, 100, "agent 0") == []


def test_a_cut_prompt_is_said():
    tok = char_tokenizer("ab")
    (kind, text), = prompt_warnings(tok, [{"role": "user", "content": "ab"}], 120, 100, "agent 1")
    assert kind == "cut" and text.startswith("agent 1's prompt has 120 tokens, cut from the left to "
                                             "rollout.max_prompt_len=100")


def test_a_byte_level_tokenizer_s_spaces_are_not_unknown():
    """A byte-level BPE (SmolLM2's, with an unk token) has no token " " (it writes "Ġ") yet encodes
    every character: nothing is said."""
    from atgrpo_jax.models.hub_ids import local_model_dir
    from atgrpo_jax.models.tokenizer import checkpoint_tokenizer

    tok = checkpoint_tokenizer(local_model_dir("smollm2-135m-instruct"))
    assert tok.unk_token_id is not None and tok.convert_tokens_to_ids(" ") == tok.unk_token_id
    assert prompt_warnings(tok, [{"role": "user", "content": "What is 3 + 4?\n Ünïcode ✓"}], 10, 100, "agent 0") == []
