"""The PyTorch side of the benchmarks: a `transformers` Qwen3 on our weights, the eager
GRPO update (verl/TRL style) and a rollout sample function built on `generate`.

- Update: HF forward, full `log_softmax` over the vocabulary, gather, the clipped
  surrogate token-mean, backward, `clip_grad_norm_`, `torch.optim.AdamW`.
- Sampling: `Qwen3ForCausalLM.generate` with K branches as K copies of each prompt
  (as `num_return_sequences` does: each branch prefills its own copy, no prefix sharing),
  left-padded prompts, the rollout's stop tokens as `eos_token_id`, ids the tokenizer
  lacks never drawn (like our sampler's `vocab_limit`); log-probs of the chosen tokens
  under the sampled distribution, recorded by a logits processor.
Everything here works on plain NumPy in and out, like our side.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models.hf_io import config_to_hf
from atgrpo_jax.rollout.samples import SampleOut


def load_hf_model(path: str):
    """The checkpoint's own family (`Qwen3ForCausalLM`, `LlamaForCausalLM`, ...) in float32 from an HF
    checkpoint directory (ours, saved by hf_io)."""
    import torch
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


# ---------------------------------------------------------------- the update

def random_hf_model(cfg, device, seed: int = 0):
    """A transformers Qwen3 of `cfg`'s architecture (the exporter's config mapping) with random float32
    weights on `device`, in train mode."""
    import torch
    import transformers
    torch.manual_seed(seed)
    with torch.device(device):
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config_to_hf(cfg))).float().train()


def torch_optimizer(model, optim):
    import torch
    return torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=(optim.b1, optim.b2), eps=1e-8,
                             weight_decay=optim.weight_decay)


def torch_token_logprobs(logits, tokens, vocab_limit: int | None = None, temperature: float = 1.0):
    """The baseline's log-probs: a full log_softmax over the ids the sampler could draw (the first
    vocab_limit) at the sampling temperature, then gather. [B, T, V] -> [B, T] (column 0 is 0, like ours)."""
    import torch
    logp = torch.log_softmax(logits[:, :-1, :vocab_limit].float() / temperature, dim=-1)
    logp = logp.gather(-1, tokens[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)


def torch_loss(cfg: LossSettings, logp, old_logp, adv, mask):
    import torch
    ratio = torch.exp(logp - old_logp)
    adv = adv[:, None]
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high))
    return (pg * mask).sum() / mask.sum().clamp(min=1)


def torch_step(model, opt, loss_cfg: LossSettings, tb: dict, clip: float, vocab_limit: int | None = None,
               temperature: float = 1.0) -> tuple[float, float]:
    """One baseline update; returns (loss, grad norm before clipping)."""
    import torch
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=tb["tokens"], attention_mask=tb["valid"]).logits
    logp = torch_token_logprobs(logits, tb["tokens"], vocab_limit, temperature)
    loss = torch_loss(loss_cfg, logp, tb["old_logp"], tb["adv"], tb["is_resp"])
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item(), norm.item()


def torch_batch(data: dict, old_logp: np.ndarray) -> dict:
    import torch
    return {"tokens": torch.tensor(data["tokens"], dtype=torch.long),
            "valid": torch.tensor(data["valid"], dtype=torch.long),
            "is_resp": torch.tensor(data["is_resp"], dtype=torch.float32),
            "adv": torch.tensor(data["adv"]), "old_logp": torch.tensor(old_logp)}


def trim_padding(mb: dict) -> dict:
    """Drop all-padding rows and the padding columns after the longest row: eager PyTorch
    runs any shape at no cost, so the baseline does not pay for our static-shape padding."""
    rows = mb["valid"].any(axis=1)
    width = max(int(mb["valid"].sum(axis=1).max()), 2)
    return {k: (v[rows, :width] if np.ndim(v) == 2 else v[rows]) for k, v in mb.items()}


def torch_update_policy(model, opt, loss_cfg: LossSettings, minibatches: list[dict], clip: float,
                        vocab_limit: int | None = None, temperature: float = 1.0) -> dict:
    """The trainer's update of one policy (`train.step.start_update`) in PyTorch: old
    log-probs of every mini-batch under the current weights, then one clipped step per
    mini-batch. minibatches: the trainer's, one sample per row (`bench.rows.as_rows`)."""
    import torch
    fields = ("tokens", "valid", "is_resp", "adv")
    mbs = [trim_padding({k: mb[k] for k in fields}) for mb in minibatches]
    mbs = [mb for mb in mbs if len(mb["adv"])]
    with torch.no_grad():
        olds = []
        for mb in mbs:
            tokens = torch.tensor(mb["tokens"], dtype=torch.long)
            logits = model(input_ids=tokens, attention_mask=torch.tensor(mb["valid"], dtype=torch.long)).logits
            olds.append(torch_token_logprobs(logits, tokens, vocab_limit, temperature).numpy() * mb["is_resp"])
    losses, norms = [], []
    for mb, old in zip(mbs, olds):
        loss, norm = torch_step(model, opt, loss_cfg, torch_batch(mb, old), clip, vocab_limit, temperature)
        losses.append(loss)
        norms.append(norm)
    return {"loss": float(np.mean(losses)), "grad_norm": float(np.mean(norms)),
            "minibatches": float(len(mbs))}


# ---------------------------------------------------------------- sampling

def _vocab_limit_processor(limit: int):
    """A logits processor that makes ids >= limit impossible (logit -inf), greedy included."""
    from transformers import LogitsProcessor

    class VocabLimit(LogitsProcessor):
        def __call__(self, input_ids, scores):
            scores[:, limit:] = -float("inf")  # generate hands processors its own float32 copy
            return scores

    return VocabLimit()


def _chosen_logprobs_processor(temperature: float):
    """A logits processor recording log p(chosen token) under softmax(logits / T).

    generate calls it once per step with the sequences so far; the token picked at step t
    is the last column at call t + 1, so it keeps one [N, V] row set at a time (never the
    [N, steps, V] scores). Custom processors run before generate's temperature warper,
    hence the division here. `finish(sequences)` returns [N, steps].
    """
    import torch
    from transformers import LogitsProcessor

    class ChosenLogprobs(LogitsProcessor):
        def __init__(self):
            self.prev, self.picked = None, []

        def __call__(self, input_ids, scores):
            if self.prev is not None:
                self.picked.append(self.prev.gather(1, input_ids[:, -1:])[:, 0])
            self.prev = torch.log_softmax(scores.float() / temperature, dim=-1)
            return scores

        def finish(self, sequences):
            if self.prev is not None:
                self.picked.append(self.prev.gather(1, sequences[:, -1:])[:, 0])
            return torch.stack(self.picked, 1).numpy()

    return ChosenLogprobs()


def _seed_of(keys) -> int:
    """A torch seed from JAX PRNG keys (typed or raw uint32 data)."""
    import jax
    data = jax.random.key_data(keys) if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key) else keys
    return int(np.asarray(data, np.uint64).sum() % (2**31 - 1))


def hf_sample_fn(model, tokenizer, *, max_new_tokens: int, temperature: float, stop_ids: Sequence[int],
                 pad_id: int, vocab_limit: int | None = None):
    """SampleFn(agent, prompts, k, keys) for the rollout driver (`rollout.tree`), on `generate`.

    One model for every agent (policy.sharing = shared). Temperature 0 is greedy (log-probs
    0, like ours); otherwise plain sampling at `temperature` (no top-k, no top-p). The torch
    seed of a call comes from `keys` (one PRNG key per prompt), so a run is reproducible.
    vocab_limit: only ids below it are drawn (None: every row of the LM head).
    """
    import torch
    from transformers import LogitsProcessorList

    stops = sorted({int(s) for s in stop_ids})

    def sample_fn(agent: int, prompts, k: int, keys) -> SampleOut:
        width = max(len(p) for p in prompts)
        ids = np.full((len(prompts), width), pad_id, np.int64)
        mask = np.zeros((len(prompts), width), np.int64)
        for i, p in enumerate(prompts):  # left padding, as generate expects for a decoder
            ids[i, width - len(p):] = p
            mask[i, width - len(p):] = 1
        sampling = temperature > 0
        record = _chosen_logprobs_processor(temperature) if sampling else None
        processors = [] if vocab_limit is None or vocab_limit >= model.config.vocab_size \
            else [_vocab_limit_processor(vocab_limit)]
        kw = dict(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0) if sampling \
            else dict(do_sample=False)
        kw["logits_processor"] = LogitsProcessorList(processors + ([record] if sampling else []))
        torch.manual_seed(_seed_of(keys))
        # K branches = each prompt repeated K times (rows b*K + j), what num_return_sequences
        # does inside generate; greedy refuses num_return_sequences > 1.
        ids, mask = (torch.tensor(np.repeat(x, k, axis=0)) for x in (ids, mask))
        with torch.no_grad():
            seqs = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=stops,
                                  pad_token_id=pad_id, use_cache=True, **kw)
        new = seqs[:, width:].numpy()
        logps = record.finish(seqs) if sampling else np.zeros(new.shape, np.float32)
        is_stop = np.isin(new, stops)
        lengths = np.where(is_stop.any(1), is_stop.argmax(1) + 1, new.shape[1])
        texts = [tokenizer.decode([int(t) for t in row[:n] if int(t) not in stops])
                 for row, n in zip(new, lengths)]
        return SampleOut.from_rows(new, lengths, logps, texts, max_new_tokens)

    return sample_fn
