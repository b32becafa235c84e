"""Tiny random checkpoints (Qwen3, Llama, Qwen2) made with `transformers` and saved to disk."""
import numpy as np
import torch
import transformers


# family -> (transformers' config class, model class)
FAMILIES = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # short: the test's positions reach every band


def make_hf_checkpoint(path, *, vocab=256, hidden=64, inter=96, layers=2, heads=4, kv_heads=2,
                       head_dim=24, tied=False, theta=10_000.0, seed=0, scale=4.0, family="qwen3", rope=None):
    """Save a random model of `family` (FAMILIES) to `path`; return the (eval-mode) torch model. `rope`:
    extra rope_parameters (e.g. LLAMA3_ROPE)."""
    torch.manual_seed(seed)
    config_cls, model_cls = (getattr(transformers, name) for name in FAMILIES[family])
    cfg = config_cls(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": theta, **(rope or {})},
        max_position_embeddings=512)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # larger, non-trivial norms (and biases) so a layout bug cannot hide
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
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
