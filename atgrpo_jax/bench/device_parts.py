"""The parts of `bench device` that need no update: the device's two ceilings, bf16 parity with
transformers, the sampler against `generate` (fixed and long-tailed lengths).

Each part is a function `part(shapes, record)`: `shapes` says how big (the real sizes or
`--tiny` ones), and `record(name, value)` stores a figure as soon as it is measured, so a part
cut short by its time limit still reports what it finished. `device.py` runs every part in its
own process (a crash or an out-of-memory in one loses no other part, and each process's peak
device memory is its own).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gzip
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from atgrpo_jax.bench.common import cpu_model, timed
from atgrpo_jax.bench.kernels import profile_kernels
from atgrpo_jax.bench.longtail import EOS, forced_eos, longtail_lengths
from atgrpo_jax.bench.sampler import generate_flops, prefill_times
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.model_config import Qwen3Config
from atgrpo_jax.models.decode_kernel import supported
from atgrpo_jax.models.hf_io import load_pretrained, save_pretrained
from atgrpo_jax.models.qwen3 import layer_unroll
from atgrpo_jax.sampling import generate, segments, select


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Sizes of every part: `REAL` on a GPU/TPU, `TINY` for the CPU test."""
    preset: str  # the sampler's and the update's model (random weights)
    parity_layers: int  # layers of the parity model (the preset's widths and vocabulary)
    parity_tokens: tuple[int, int]  # [batch, length] scored in the parity check
    batch: int  # sampler rows
    prompt: int
    new: int  # new tokens per row (fixed lengths); the long tail's budget
    update_rows: tuple[int, int]  # [rows, width]: rows x width tokens per update step
    update_steps: int  # timed steps per backend
    update_sweep: tuple[tuple[int, int, int, bool], ...]  # (log-prob chunk, rows, sequence_unroll,
    # recompute_elementwise): the first backend's
    copy_mib: int  # buffer of the bandwidth measurement
    matmul: int  # size of the peak matmul
    step_overrides: tuple[str, ...]  # flags of the one AT-GRPO step
    paper_step_overrides: tuple[str, ...]  # flags of the full-width step (the paper's batch)


# The update's sweep on a GPU, where the layers run unrolled (`layer_unroll`): twice the tokens, the
# elementwise intermediates kept, the layers rolled.
REAL = Shapes("qwen3-1.7b", 4, (2, 256), 64, 512, 512, (4, 1024), 3,
              ((2048, 8, 28, True), (512, 4, 28, False), (512, 4, 1, True)), 4096, 8192,
              ("--config.rollout.num_tasks=2", "--config.rollout.k=4", "--config.rollout.max_turns=2",
               "--config.rollout.max_new_tokens=256", "--config.rollout.max_prompt_len=1024",
               "--config.rollout.prompt_buckets=(512,1024)"),
              ("--config.rollout.max_turns=2", "--config.rollout.max_new_tokens=512"))
TINY = Shapes("test-tiny", 2, (2, 16), 4, 16, 16, (2, 32), 1, ((16, 2, 2, True), (16, 2, 1, False)), 8, 256,
              ("--config.model.preset=test-tiny", "--config.model.vocab_size=151936",
               "--config.rollout.num_tasks=2", "--config.rollout.k=2", "--config.rollout.max_turns=1",
               "--config.rollout.max_new_tokens=8", "--config.rollout.max_prompt_len=512",
               "--config.rollout.prompt_buckets=(512,)", "--config.model.param_dtype=float32",
               "--config.model.compute_dtype=float32"),
              ("--config.model.preset=test-tiny", "--config.model.vocab_size=151936",
               "--config.rollout.num_tasks=2", "--config.rollout.k=2", "--config.rollout.max_turns=1",
               "--config.rollout.max_new_tokens=8", "--config.rollout.max_prompt_len=512",
               "--config.rollout.prompt_buckets=(512,)", "--config.model.param_dtype=float32",
               "--config.model.compute_dtype=float32"))

# Dense bf16 peak of the datasheets (FLOP/s): MFU is measured against these, as is usual.
DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12,
                  "TPU v6": 918e12, "TPU v4": 275e12}


def torch_device():
    """The torch device beside JAX's: the GPU when JAX runs on one (and torch sees it), else the CPU."""
    import torch
    return torch.device("cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu")


def torch_sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def datasheet_peak(kind: str) -> float | None:
    return next((v for k, v in DATASHEET_BF16.items() if k.lower() in kind.lower()), None)


# ---------------------------------------------------------------- the ceilings

def facts(shapes: Shapes, record) -> None:
    """What runs here, and the two ceilings: copy bandwidth and a bf16 matmul's rate."""
    import flax
    import optax
    dev = jax.devices()[0]
    record("device", {"platform": dev.platform, "kind": dev.device_kind, "count": jax.device_count(), **cpu_model(),
                      "jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
                      "memory_bytes": (dev.memory_stats() or {}).get("bytes_limit")})
    record("datasheet_bf16_flops_per_s", datasheet_peak(dev.device_kind))
    n = shapes.copy_mib * 2 ** 20 // 4
    x = jax.random.normal(jax.random.key(0), (n,), jnp.float32)
    copy = jax.jit(lambda x: x * 1.0001)  # reads and writes every byte once
    record("copy_bytes_per_s", 2 * x.nbytes / min(timed(copy, x, repeats=10, warmup=2)))
    del x
    m = shapes.matmul
    a = jax.random.normal(jax.random.key(1), (m, m), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(2), (m, m), jnp.bfloat16)
    mm = jax.jit(lambda a, b: a @ b)
    record("matmul_bf16_flops_per_s", 2 * m ** 3 / min(timed(mm, a, b, repeats=10, warmup=2)))


# ---------------------------------------------------------------- parity

def _errors(x: np.ndarray, ref: np.ndarray) -> dict:
    x, ref = x.astype(np.float64), ref.astype(np.float64)
    return {"rel_l2": float(np.linalg.norm(x - ref) / np.linalg.norm(ref)),
            "max_rel": float(np.abs(x - ref).max() / np.abs(ref).max()),
            "argmax_agree": float((x.argmax(-1) == ref.argmax(-1)).mean())}


def parity(shapes: Shapes, record, tmp: str) -> None:
    """Logits of ours and of transformers in bf16, each against a float32 reference on the same
    device (transformers in float32 on the same bf16-rounded weights, TF32 off)."""
    import torch
    import transformers
    cfg = get_preset(shapes.preset).replace(num_layers=shapes.parity_layers, param_dtype="bfloat16",
                                            compute_dtype="bfloat16")
    save_pretrained(nnx.jit(lambda: Qwen3(cfg, rngs=nnx.Rngs(1)))(), tmp)
    b, t = shapes.parity_tokens
    tokens = np.random.RandomState(1).randint(1, cfg.vocab_size, (b, t)).astype(np.int32)
    positions = np.broadcast_to(np.arange(t), (b, t))
    ours = {}
    for dt, precision in (("bfloat16", "default"), ("float32", "highest")):  # float32: no TF32 on GPUs
        model = load_pretrained(tmp, compute_dtype=dt)
        with jax.default_matmul_precision(precision):
            logits = nnx.jit(lambda m, x, p: m(x, p)[0])(model, tokens, positions)
        ours[dt] = np.asarray(jax.device_get(logits), np.float32)
        del model, logits
    dev = torch_device()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    theirs = {}
    for name, dt in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=dt).to(dev).eval()
        with torch.no_grad():
            theirs[name] = hf(input_ids=torch.tensor(tokens, dtype=torch.long, device=dev)).logits.float().cpu().numpy()
        del hf
    ref = theirs["float32"]
    record("parity", {"model": f"{shapes.preset} widths, {cfg.num_layers} layers", "tokens": [b, t],
                      "ours_bf16_vs_f32_ref": _errors(ours["bfloat16"], ref),
                      "transformers_bf16_vs_f32_ref": _errors(theirs["bfloat16"], ref),
                      "ours_f32_vs_f32_ref": _errors(ours["float32"], ref),
                      "ours_bf16_vs_transformers_bf16": _errors(ours["bfloat16"], theirs["bfloat16"])})


# ---------------------------------------------------------------- the sampler

def weight_read_bytes(cfg: Qwen3Config) -> int:
    """Bytes a decode step must read of the weights: every layer and the LM head (the embedding
    lookup reads a few rows only), in the weights' dtype."""
    d, v = cfg.hidden_size, cfg.vocab_size
    layers = cfg.num_layers * (d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
                               + 3 * d * cfg.intermediate_size)
    return (layers + d * v) * jnp.dtype(cfg.weight_dtype).itemsize


def cache_read_bytes(cfg: Qwen3Config, rows: int, keys: float) -> float:
    """Bytes of keys and values a decode step reads for `rows` rows of `keys` cached tokens."""
    return 2 * cfg.num_layers * rows * keys * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize


def _ours(model, prompts, budgets, segment=16):
    """Seconds of the first call (compilation included), of a second one, and the first's output."""
    gen = lambda: generate(model, prompts, max_new_tokens=budgets, key=jax.random.key(0),  # noqa: E731
                           buckets=(prompts.shape[1],), temperature=1.0, segment=segment)
    start = time.perf_counter()
    out = gen()
    first = time.perf_counter() - start
    return first, min(timed(gen, repeats=1, warmup=0)), out


def _theirs(hf, prompts, max_new, processors=None):
    """Seconds of one `generate` after a short warm-up, and its new tokens."""
    import torch
    dev = hf.device
    ids = torch.tensor(prompts, dtype=torch.long, device=dev)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
              pad_token_id=0, use_cache=True)
    kw.update(eos_token_id=EOS, logits_processor=processors) if processors else \
        kw.update(eos_token_id=None, min_new_tokens=max_new)
    with torch.no_grad():
        hf.generate(ids, max_new_tokens=4, **{k: v for k, v in kw.items() if k != "min_new_tokens"})
        torch_sync()
        start = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=max_new, **kw)
        torch_sync()
    return time.perf_counter() - start, out[:, prompts.shape[1]:].cpu().numpy()


@contextlib.contextmanager
def first_call_of(module, name: str):
    """Inside the block, the jitted `module.name` keeps its first call's arguments (as shapes:
    the call may donate its buffers) in the list this yields."""
    jitted, seen = getattr(module, name), []

    def spy(*args, **kwargs):
        if not seen:
            as_shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) \
                if isinstance(x, jax.Array) else x  # noqa: E731
            seen.append(jax.tree.map(as_shape, (args, kwargs)))
        return jitted(*args, **kwargs)
    setattr(module, name, spy)
    try:
        yield seen
    finally:
        setattr(module, name, jitted)


def write_hlo(jitted, call, path: Path, record, key: str) -> None:
    """The compiled HLO of `jitted` for `call` ((args, kwargs)), gzipped to `path`, for reading
    off the device; an error is recorded under `key`, not raised (a diagnosis must not cost the
    part's timings)."""
    try:
        args, kwargs = call
        path.write_bytes(gzip.compress(jitted.lower(*args, **kwargs).compile().as_text().encode()))
    except Exception as e:
        record(key, error(e))


def error(e: Exception) -> dict:
    return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}


def sampler(shapes: Shapes, record, tmp: str, out_dir: str | None = None) -> None:
    """Tokens/s of ours vs transformers' generate, bf16, same weights and settings (temperature
    1, no top-k/top-p); the decode step against the weight-read floor; then long-tailed lengths.
    The decode segment's compiled HLO goes to `out_dir/decode_hlo.txt.gz`."""
    import transformers
    cfg = get_preset(shapes.preset).replace(param_dtype="bfloat16", compute_dtype="bfloat16")
    model = nnx.jit(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)))()
    save_pretrained(model, tmp)
    b, p, n = shapes.batch, shapes.prompt, shapes.new
    prompts = np.random.RandomState(0).randint(2, cfg.vocab_size, (b, p)).astype(np.int32)
    with first_call_of(segments, "segment_jit") as segment_call:
        first, seconds, out = _ours(model, prompts, n)
    assert out.lengths.min() == n, "every row must produce all new tokens"
    if out_dir:
        write_hlo(segments.segment_jit, segment_call[0], Path(out_dir) / "decode_hlo.txt.gz", record, "decode_hlo")
    prefill_s, setup_s, _ = prefill_times(model, prompts, n, 1, 2)
    step = (seconds - prefill_s - setup_s) / (n - 1)  # the first token comes from the prefill
    record("sampler_fixed", {"batch": b, "prompt": p, "new": n, "params": cfg.num_params(),
                             "ours_compile_and_first_s": first, "ours_seconds": seconds,
                             "decode_unroll": layer_unroll(cfg, 1), "ours_tokens_per_s": b * n / seconds,
                             "prefill_seconds": prefill_s,
                             "decode_step_ms": 1e3 * step, "useful_flops": generate_flops(cfg, b, p, n),
                             "weight_bytes": weight_read_bytes(cfg),
                             "mean_cache_bytes_per_step": cache_read_bytes(cfg, b, p + n / 2)})
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype="bfloat16").to(torch_device()).eval()
    theirs_s, new = _theirs(hf, prompts, n)
    assert new.shape[1] == n
    record("sampler_fixed_transformers", {"seconds": theirs_s, "tokens_per_s": b * n / theirs_s,
                                          "speedup": theirs_s / seconds, "attention": hf.config._attn_implementation})
    lengths = longtail_lengths(b, n)
    useful = int(lengths.sum())
    first, seconds, out = _ours(model, prompts, [int(x) for x in lengths])
    assert (out.lengths == lengths).all(), "every row must produce exactly its forced length"
    even = np.full(b, useful // b) + (np.arange(b) < useful % b)
    _, even_s, _ = _ours(model, prompts, [int(x) for x in even])
    record("sampler_longtail", {"median_length": float(np.median(lengths)), "useful_tokens": useful,
                                "ours_compile_and_first_s": first, "ours_seconds": seconds,
                                "ours_useful_tokens_per_s": useful / seconds, "fixed_lengths_seconds": even_s,
                                "vs_fixed_lengths": even_s / seconds})
    theirs_s, new = _theirs(hf, prompts, int(lengths.max()), forced_eos(lengths, p))
    got = np.where((new == EOS).any(1), (new == EOS).argmax(1) + 1, new.shape[1])
    assert (got == lengths).all(), "transformers must end every row at its forced length"
    record("sampler_longtail_transformers", {"seconds": theirs_s, "useful_tokens_per_s": useful / theirs_s,
                                             "speedup": theirs_s / seconds})


def agreement(a, b) -> dict:
    """How far two samplings of the same rows with the same draws agree: the steps before each
    row's first different token, and the largest log-prob difference before it (bf16 rounding
    flips a near tie now and then; a broken kernel differs from the first step)."""
    tokens_a, tokens_b = np.asarray(a.tokens), np.asarray(b.tokens)
    same = np.cumprod(tokens_a == tokens_b, axis=1).astype(bool)
    first_diff = same.sum(axis=1)
    gap = np.abs(np.asarray(a.logprobs, np.float64) - np.asarray(b.logprobs, np.float64))
    return {"steps": int(tokens_a.shape[1]), "rows_identical": float((first_diff == tokens_a.shape[1]).mean()),
            "mean_steps_before_first_difference": float(first_diff.mean()),
            "min_steps_before_first_difference": int(first_diff.min()),
            "max_logprob_gap_before_it": float(gap[same].max()) if same.any() else None}


def decode(shapes: Shapes, record) -> None:
    """Where a decode step's time goes: the step at 1 row and at the sampler's rows (a cost that
    does not grow with rows is per-step overhead, not reading weights), with the decoder layers
    as a rolled loop over the stacked weights and caches (`model.decode_unroll=1`), unrolled
    over per-layer ones (auto, `decodes_per_layer`), and unrolled with the Pallas decode attention
    (`model.decode_attention="pallas"`), and its pieces alone: the LM head's matmul and the token
    selection over [rows, V] logits. The Pallas form's tokens and log-probs are set against the
    einsums' (same weights, same draws): `kernel_vs_einsum`."""
    cfg = get_preset(shapes.preset).replace(param_dtype="bfloat16", compute_dtype="bfloat16")
    rng = np.random.RandomState(0)
    prompts = {rows: rng.randint(2, cfg.vocab_size, (rows, shapes.prompt)).astype(np.int32)
               for rows in sorted({1, shapes.batch})}  # two run lengths each: 4 compiles per loop form
    short, long_ = max(2, shapes.new // 8), shapes.new
    record("kernel_applies", supported(cfg.head_dim, shapes.prompt, shapes.new))  # else the einsum runs
    forms = (("rolled", dict(decode_unroll=1)), ("unrolled", dict(decode_unroll=cfg.num_layers)),
             ("kernel", dict(decode_unroll=cfg.num_layers, decode_attention="pallas")))
    outputs = {}
    for form, change in forms:  # the same weights (seed 0) under each form
        model = nnx.jit(lambda: Qwen3(cfg.replace(**change), rngs=nnx.Rngs(0)))()
        steps, key = {}, "decode_step_ms_by_rows" + ("" if form == "rolled" else f"_{form}")
        try:
            for rows, ids in prompts.items():
                runs = {n: _ours(model, ids, n, segment=0) for n in (short, long_)}
                steps[rows] = 1e3 * (runs[long_][1] - runs[short][1]) / (long_ - short)  # set-up cancels
                record(key, steps)
            outputs[form] = runs[long_][2]  # the long run at the most rows (the last), for kernel_vs_einsum
        except Exception as e:  # a form that does not compile here loses only itself
            record(key, error(e))
            continue
        # the kernels of one short run at the most rows (decode dominates it: divide by `steps`)
        run = lambda: _ours(model, prompts[shapes.batch], short, segment=0)[2].tokens  # noqa: E731
        record(f"profile_{form}", {"rows": shapes.batch, "steps": short - 1, **profile_kernels(run)})
    if "kernel" in outputs and "unrolled" in outputs:
        record("kernel_vs_einsum", agreement(outputs["kernel"], outputs["unrolled"]))
    h = jax.random.normal(jax.random.key(0), (shapes.batch, cfg.hidden_size), jnp.bfloat16)
    head = jax.jit(lambda m, h: m.logits(h))
    record("lm_head_ms", 1e3 * min(timed(head, model, h, repeats=10, warmup=2)))
    logits = head(model, h)
    u = jax.random.uniform(jax.random.key(1), (shapes.batch, 2))
    pick = jax.jit(lambda x, u: select(x, u, 1.0))
    record("select_t1_ms", 1e3 * min(timed(pick, logits, u, repeats=10, warmup=2)))
