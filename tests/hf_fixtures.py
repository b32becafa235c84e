"""Tiny random Qwen3 checkpoints made with `transformers` and saved to disk."""
import numpy as np
import torch
import transformers


def make_hf_checkpoint(path, *, vocab=256, hidden=64, inter=96, layers=2, heads=4, kv_heads=2,
                       head_dim=24, tied=False, theta=10_000.0, seed=0, scale=4.0):
    """Save a random Qwen3ForCausalLM to `path`; return the (eval-mode) torch model."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": theta},
        max_position_embeddings=512)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # larger, non-trivial norms so a layout bug cannot hide
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "embed" in name or "lm_head" in name:
                p.mul_(scale)
    model.save_pretrained(str(path))
    return model


def left_padded_batch(rng: np.random.RandomState, vocab: int, lengths, pad_id=0):
    """tokens, mask and positions [B, T] for prompts of `lengths`, left-padded."""
    t = max(lengths)
    tokens = np.full((len(lengths), t), pad_id, np.int32)
    mask = np.zeros((len(lengths), t), bool)
    for i, n in enumerate(lengths):
        tokens[i, t - n:] = rng.randint(1, vocab, n)
        mask[i, t - n:] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return tokens, mask, positions


def torch_logits(model, tokens, mask, positions):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    position_ids=torch.tensor(positions, dtype=torch.long))
    return out.logits.float().numpy()
