"""The sft loop: supervised steps on chat data, with the train command's workdir, checkpoints, resume,
metrics and stops (train/loop.py), so export, evaluate and `train --config.model.init_from=DIR` read an
sft run as they read a train run of one shared policy (docs/guides/sft.md).

Step s packs the sequences the stream gives it (sft/data.py: a pure function of train.seed, s and the
data) into sft.rows rows and takes one optimizer step (optim.*, its schedule over sft.steps) on their
token-mean NLL (sft/update.py). A resume restores the newest checkpoint that restores and replays the
stream up to it, so it continues exactly as an uninterrupted run; only the keys of SFT_RESUMABLE may
change on a resume (--allow_config_change: any, the old config.json kept as config.step<N>.json).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, Callable

import jax
import numpy as np

from atgrpo_jax import workdir as wd
from atgrpo_jax.distributed import global_array, is_multiprocess, local_mesh
from atgrpo_jax.errors import ConfigError
from atgrpo_jax.sft import data
from atgrpo_jax.sft.update import make_sft_fns
from atgrpo_jax.sharding import batch_shards, make_mesh
from atgrpo_jax.train import checkpoint, compile_cache
from atgrpo_jax.train.config import RESUMABLE, SHARINGS
from atgrpo_jax.train.policies import Policy, PolicySpec, build_policies, on_mesh
from atgrpo_jax.train.progress import say
from atgrpo_jax.train.resume import has_checkpoints, restore_or_start
from atgrpo_jax.train.setup import make_tokenizer, starting_model
from atgrpo_jax.train.start import Launch, Resumed, check_before_writing, check_resume, held, open_outputs
from atgrpo_jax.train.stops import Saver, diverged_stop, ending_in_one_line
from atgrpo_jax.train.update import make_optimizer
from atgrpo_jax.train.validate import resolve, validate_sft

# How long, how often and where (train's RESUMABLE, whose "sft." says a train run ignores these keys),
# and the sft keys that do not change what is trained.
SFT_RESUMABLE = tuple(k for k in RESUMABLE if k != "sft.")  # its own resumable keys (train/section.py: SftSettings) stay


@dataclasses.dataclass
class SftRun:
    """What an sft run is built from: its model as the one policy of a `train` run with policy.sharing
    "shared" (so its checkpoints are that run's), the jitted update and the tokenized data."""

    config: Any
    mesh: Any
    policies: list[Policy]  # one: "policy"
    lr_schedule: Callable[[int], float]  # step (1-based) -> learning rate
    update: Callable  # (state, rows) -> (state, metrics)
    nll: Callable  # (params, rows) -> (sum, count)
    train: list[data.Example]
    valid: list[data.Example]

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """Tokens of each training sequence (what packing reads)."""
        return np.array([len(e.tokens) for e in self.train])

    @property
    def shards(self) -> int:
        return batch_shards(self.mesh)

    def placed(self, rows: data.Rows) -> data.Rows:
        return data.Rows(*(global_array(x, self.mesh) for x in rows))


def padded_rows(config, mesh) -> int:
    """sft.rows rounded up to a multiple of the devices the batch is split over (the extra rows empty)."""
    n = batch_shards(mesh)
    return -(-config.sft.rows // n) * n


def build_sft(config, tokenizer, train: list, valid: list, *, init_from: bool = False) -> SftRun:
    """The run's mesh, model (from model.hf_path, random, or with `init_from` model.init_from) and update."""
    mesh = make_mesh(config.mesh.to_dict())
    base = starting_model(config, mesh, init_from)
    if base.cfg.vocab_size < len(tokenizer):
        raise ConfigError(f"config.model: vocab_size {base.cfg.vocab_size} < tokenizer size {len(tokenizer)}")
    tx, lr_at = make_optimizer(config.optim, config.sft.steps, config.reference.lr_schedule)
    local = local_mesh(mesh) if is_multiprocess() else None
    spec = PolicySpec(SHARINGS["shared"], config.loss, master_dtype=config.optim.master_dtype)
    policies = build_policies(spec, base, ["all"], tx, meshes=lambda i: (mesh, local))
    p = policies[0]
    update, nll = make_sft_fns(p.graphdef, p.frozen, tx, config.loss.logprob_chunk)
    return SftRun(config, mesh, policies, lr_at, update, nll, train, valid)


def held_out_loss(run: SftRun) -> float:
    """The token-mean NLL of every sequence of sft.valid_path under the current weights."""
    total, count = 0.0, 0
    p = run.policies[0]
    with on_mesh(p.mesh):
        for rows in data.held_out_steps(run.valid, padded_rows(run.config, run.mesh), run.config.sft.row_tokens):
            s, n = run.nll(p.state.params, run.placed(rows))
            total, count = total + float(s), count + int(n)
    return total / max(count, 1)


def sft_step(run: SftRun, step: int, cursor: data.Cursor) -> tuple[dict, data.Cursor]:
    """One optimizer step on the step's packed rows; (metrics as numbers, the cursor after it)."""
    s = run.config.sft
    placed, after = data.plan_step(run.lengths, cursor, s.rows, s.row_tokens, run.config.train.seed)
    rows, counts = data.pack_rows(run.train, placed, padded_rows(run.config, run.mesh), s.row_tokens)
    p = run.policies[0]
    p.set_lr(run.lr_schedule(step))
    with on_mesh(p.mesh):
        state, metrics = run.update(p.state, run.placed(rows))
    p.load(state)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    return dict(metrics, lr=run.lr_schedule(step), epoch=after.epoch + after.index / len(run.train), **counts), after


def run_sft(config, workdir: str, *, allow_config_change: bool = False, fresh_if_unreadable: bool = False,
            new_history: bool = False) -> dict:
    """Train on config.sft.train_path (resuming from workdir's newest checkpoint); returns the last metrics.
    Every error in the config or the data is raised before the workdir is touched."""
    config = validate_sft(resolve(config))
    launch = Launch(workdir, allow_config_change, fresh_if_unreadable, new_history)
    check_before_writing(config, workdir)
    lead = jax.process_index() == 0
    say(f"reading and tokenizing {config.sft.train_path}", lead)
    tokenizer = make_tokenizer(config.tokenizer, config.model.hf_path, config.char_alphabet)
    thinking = config.rollout.thinking
    train = data.load_examples(config.sft.train_path, tokenizer, thinking)
    valid = data.load_examples(config.sft.valid_path, tokenizer, thinking) if config.sft.valid_path else []
    with held(workdir, config.train.preempt_deadline_s) as stop:
        return _sft(config, launch, tokenizer, train, valid, stop)


def _sft(config, launch: Launch, tokenizer, train, valid, stop) -> dict:
    t, s, workdir, lead = config.train, config.sft, launch.workdir, launch.lead
    ckpt_dir = wd.checkpoint_dir(workdir)
    resumed = has_checkpoints(workdir)
    changed = check_resume(config, workdir, launch.allow_config_change, SFT_RESUMABLE) if resumed else {}
    compile_cache.enable(t.compile_cache, workdir)
    say(f"building the model: {len(train)} training sequences, {len(valid)} held out", lead)
    run = build_sft(config, tokenizer, train, valid, init_from=not resumed)
    stop.install()
    start, states, _ = restore_or_start(config, run, workdir, launch.fresh_if_unreadable, changed)
    if states is not None:
        run.policies[0].load(states[run.policies[0].name])
    elif resumed and config.model.init_from:  # no checkpoint restored after all: a fresh start from model.init_from
        run = build_sft(config, tokenizer, train, valid, init_from=True)
    best = "valid_loss" if valid and s.eval_every else None
    ckpt = checkpoint.Checkpointer(ckpt_dir, keep_last=t.keep_last, best_metric=best, best_mode="min")
    steps = {"train.steps": changed["sft.steps"]} if "sft.steps" in changed else {}  # what the schedule spans
    writer, bar = open_outputs(config, launch, Resumed(start, states is not None, changed, steps), s.steps,
                               ("loss", "valid_loss", "grad_norm", "skipped"))
    cursor = data.Cursor()
    for _ in range(start):  # the stream up to the checkpoint: what the steps before it trained on
        _, cursor = data.plan_step(run.lengths, cursor, s.rows, s.row_tokens, t.seed)
    began, last, step, streak = time.time(), {}, start, 0
    saver = Saver(ckpt, writer, lambda step: ({p.name: p.state for p in run.policies},
                                              {"step": step, "command": "sft"}, None))  # export tells sft runs by it
    with ending_in_one_line(ckpt, writer, bar, lambda: step):
        if start == 0 and valid and s.eval_every:
            say("held-out loss before training (the first call compiles the forward pass)", lead)
            last = {"valid_loss": held_out_loss(run), "time_s": 0.0}
            writer.write(0, last)
        for step in range(start + 1, s.steps + 1):
            if stop.requested():
                raise saver.stopped(stop, start, step - 1, last, healthy=not streak)
            if step == start + 1:
                say(f"step {step}: the first step compiles the update; later steps reuse it", lead)
            metrics, cursor = sft_step(run, step, cursor)
            streak = streak + 1 if metrics["skipped"] else 0
            if valid and s.eval_every and (step % s.eval_every == 0 or step == s.steps):
                metrics["valid_loss"] = held_out_loss(run)
            metrics["time_s"] = time.time() - began
            writer.write(step, metrics)
            bar.update(step, metrics)
            if t.max_skipped_updates and streak >= t.max_skipped_updates:
                raise diverged_stop(ckpt, {"policy": streak}, step, t.max_skipped_updates)
            if not streak and t.checkpoint_every and (step % t.checkpoint_every == 0 or step == s.steps):
                saver.save(step, metrics)
            last = metrics
        ckpt.close()
    if lead:
        print(json.dumps({k: last[k] for k in ("loss", "valid_loss") if k in last} | {"steps": step}), flush=True)
    return last

