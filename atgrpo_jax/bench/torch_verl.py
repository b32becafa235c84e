"""The PyTorch update as verl users run it, beside the eager baseline and ours (`bench device
--parts=torch_update`).

verl's actor update removes the padding (every row's valid tokens packed into one sequence,
positions restarting per row, attention kept inside each row), compiles the model, and computes
the log-probs and the clipped loss chunk by chunk straight from the hidden states and the LM head
(`use_fused_kernels`, or Liger's fused linear losses), so the [tokens, vocab] logits never exist
whole. On the same transformers model, batch and loss as `device_update.pytorch`:
- `eager`: the padded step as `device_update.pytorch` times it;
- `compiled`: `torch.compile` of that step (sdpa);
- `verl`: packed without padding, compiled, and Liger's fused linear GRPO loss (token-mean, the
  trainer's clip range) on the hidden states;
then ours (the trainer's update, the platform's first attention backend), so every ratio comes
from one process on one device. Each PyTorch variant records its first loss (before any update,
from the same weights: equal to the eager one's to bf16 rounding), tokens/s, MFU and peak memory;
one that cannot run here (no Liger, a compile error) records its error and the others go on.
"""
from __future__ import annotations

import time

import numpy as np

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.bench.device_parts import Shapes, datasheet_peak, error, torch_device, torch_sync
from atgrpo_jax.bench.device_update import backends_here, ours_timed
from atgrpo_jax.bench.torch_baseline import random_hf_model, torch_loss, torch_token_logprobs
from atgrpo_jax.bench.train import make_batch, optim_config, update_flops
from atgrpo_jax.models import get_preset


def packed(valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices of the valid tokens in row order, their positions restarting at 0 per row)."""
    rows, cols = np.nonzero(valid)
    return rows * valid.shape[1] + cols, cols


def padded_loss(model, t: dict, old, loss_cfg: LossSettings):
    """The eager baseline's loss: logits of the padded rows, full log_softmax, clipped token-mean."""
    import torch
    with torch.autocast(t["tokens"].device.type, dtype=torch.bfloat16):
        logits = model(input_ids=t["tokens"], attention_mask=t["valid"]).logits
    return torch_loss(loss_cfg, torch_token_logprobs(logits, t["tokens"]), old, t["adv"], t["is_resp"].float())


def verl_loss(body, head, t: dict, old, fused):
    """Packed forward of the model's body (its layers) to hidden states, back to [rows, width]
    places, Liger's fused linear loss on them and the LM head's weight: position t's hidden state
    scores token t + 1, as in the padded loss."""
    import torch
    rows, width = t["tokens"].shape
    with torch.autocast(t["tokens"].device.type, dtype=torch.bfloat16):
        hidden = body(input_ids=t["flat_ids"], position_ids=t["flat_pos"], use_cache=False).last_hidden_state[0]
    placed = hidden.new_zeros(rows * width, hidden.shape[-1]).index_copy(0, t["flat_index"], hidden)
    placed = placed.view(rows, width, -1)[:, :-1]
    loss, _ = fused(placed, head.to(placed.dtype), t["tokens"][:, 1:], t["is_resp"][:, 1:].float(), t["adv"],
                    old_per_token_logps=old[:, 1:])
    return loss


def make_step(model, opt, loss_fn, clip: float):
    import torch

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss
    return step


def timed(step, steps: int) -> tuple[float, float, list[float]]:
    """(first loss, compile-and-first seconds, [step seconds])."""
    start = time.perf_counter()
    first = float(step())
    torch_sync()
    first_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch_sync()
        times.append(time.perf_counter() - start)
    return first, first_s, times


def torch_update(shapes: Shapes, record) -> None:
    import torch
    rows, width = shapes.update_rows
    cfg = get_preset(shapes.preset)
    dev = torch_device()
    loss_cfg, optim = LossSettings(), optim_config()
    data = make_batch(cfg.vocab_size, rows, width)
    t = {k: torch.tensor(v).to(dev) for k, v in data.items()}
    t["tokens"], t["valid"] = t["tokens"].long(), t["valid"].long()
    index, pos = packed(data["valid"])
    t["flat_index"] = torch.tensor(index, device=dev)
    t["flat_ids"] = t["tokens"].view(-1)[t["flat_index"]][None]
    t["flat_pos"] = torch.tensor(pos, device=dev)[None]
    model = random_hf_model(cfg, dev)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            old = torch_token_logprobs(model(input_ids=t["tokens"], attention_mask=t["valid"]).logits,
                                       t["tokens"]).float()
    peak = datasheet_peak(str(torch.cuda.get_device_name()) if dev.type == "cuda" else "cpu")
    flops = update_flops(cfg, rows, width)

    def variant(name: str, loss_fn) -> None:
        model.load_state_dict(initial)  # every variant starts from the same weights
        opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay,
                                fused=dev.type == "cuda")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            first, first_s, times = timed(make_step(model, opt, loss_fn, optim.grad_clip), shapes.update_steps)
        except Exception as e:  # one variant that does not run here must not hide the others
            record(f"torch_{name}", error(e))
            return
        best = min(times)
        record(f"torch_{name}", {"first_loss": first, "compile_and_first_s": first_s, "step_seconds": times,
                                 "tokens_per_s": rows * width / best, "mfu": flops / best / peak if peak else None,
                                 "valid_tokens": int(data["valid"].sum()), "tokens": rows * width,
                                 "peak_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None})

    variant("eager", lambda: padded_loss(model, t, old, loss_cfg))
    compiled = torch.compile(model)
    variant("compiled", lambda: padded_loss(compiled, t, old, loss_cfg))
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        fused = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, loss_type="dapo", chunk_size=1,
                                         epsilon_low=loss_cfg.eps_low, epsilon_high=loss_cfg.eps_high,
                                         compiled=dev.type == "cuda")
    except Exception as e:  # Liger not installed here
        record("torch_verl", error(e))
    else:
        body = torch.compile(model.model)
        variant("verl", lambda: verl_loss(body, model.lm_head.weight, t, old, fused))
    del model, compiled, initial
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the cached blocks back for JAX's allocator
    ours_timed(shapes, record, backends_here()[0])
