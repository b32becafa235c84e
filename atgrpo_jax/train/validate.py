"""Config validation: `resolve` expands the `regime` shorthand once, then `validate` checks every
field; both run before anything compiles, and every error names its key (`ConfigError`)."""
from __future__ import annotations

import math

import ml_collections

from atgrpo_jax.registry import closest
from atgrpo_jax.train.config import (AGENT_KEYS, RECIPES, REGIMES, SHARINGS, ConfigError, agent_sampling, base_config,
                                     flat, loss_config)
from atgrpo_jax.train.roles import ROLE_MODEL_KEYS, ROLE_OPTIM_KEYS, role_config, role_optim

FILTER_SCOPES = ("policy", "agent", "batch")
MODEL_INITS = ("auto", "random")
LOGGERS = ("console", "tensorboard", "jsonl", "wandb")
# Presets small enough to train from random weights without saying so (the CPU demo, tests,
# benchmarks); a larger one needs model.hf_path or model.init="random".
RANDOM_INIT_MAX_PARAMS = 250_000_000


def _get(c, dotted: str):
    for part in dotted.split("."):
        c = c[part]
    return c


def _set(c, dotted: str, value):
    *parents, leaf = dotted.split(".")
    for part in parents:
        c = c[part]
    c[leaf] = value


def resolve(c: ml_collections.ConfigDict, *, weights: bool = True) -> ml_collections.ConfigDict:
    """Expand `regime` into the settings it stands for (once: regime is then ""), settle every switch
    the `recipe` decides (reference.* and optim.master_dtype "auto"), then validate.

    A setting the user changed from its default to something the regime contradicts is an error.
    weights=False: do not ask for model weights (the memory planner needs the architecture only).
    """
    if c.regime:
        _require(c.regime in REGIMES, "regime", f"unknown {c.regime!r}{closest(c.regime, REGIMES)}; "
                 f"known: {', '.join(REGIMES)}")
        default = base_config()
        for key, value in REGIMES[c.regime].items():
            mine = _get(c, key)
            _require(mine == value or mine == _get(default, key), key,
                     f"{mine!r} contradicts regime={c.regime!r}, which sets it to {value!r}")
            _set(c, key, value)
        c.regime = ""
    _require(c.recipe in RECIPES, "recipe", f"unknown {c.recipe!r}{closest(c.recipe, RECIPES)}; known: "
             f"{', '.join(RECIPES)}")
    as_reference = c.recipe == "reference"
    for key, value in c.reference.items():
        _require(value is None or isinstance(value, bool), f"reference.{key}",
                 f"must be True, False or None (as recipe={c.recipe!r}), got {value!r}")
        if value is None:
            c.reference[key] = as_reference
    if c.reference.lora_on_shared and c.policy.sharing == "shared":  # row 9: the reference's L1 YAML
        c.policy.sharing = "shared_lora"
    if c.optim.master_dtype == "auto":
        c.optim.master_dtype = "param_dtype" if as_reference else "float32"
    return validate(c, weights=weights)


def _role_sections(c, section: str, keys, example: str) -> list[str]:
    """The roles of policy.<section> (role_models, role_optim), each checked to be a section of `keys`."""
    for role, own in c.policy[section].items():
        _require(isinstance(own, (dict, ml_collections.ConfigDict)), f"policy.{section}.{role}",
                 f"must be a section of keys, e.g. --config.policy.{section}.{role}.{example}")
        unknown = sorted(set(own) - set(keys))
        _require(not unknown, f"policy.{section}.{role}", f"{unknown} cannot differ per role; known: {', '.join(keys)}")
    return list(c.policy[section])


def _check_weights(m, where: str, weights: bool) -> None:
    """The keys of a model section `m` that say which weights it has (config.model, or a role's:
    `roles.role_config`) are usable; errors name `where` (model.preset, policy.role_models.ROLE.preset...)."""
    from atgrpo_jax.models.config import DTYPES, PRESETS

    _require(m.preset in PRESETS or (m.preset == "" and bool(m.hf_path)), f"{where}.preset",
             f"unknown preset {m.preset!r}{closest(m.preset, PRESETS)}; known: {sorted(PRESETS)} "
             f"(or \"\" with {where}.hf_path: the checkpoint's architecture)")
    _require(m.init in MODEL_INITS, f"{where}.init", f"must be one of {MODEL_INITS}, got {m.init!r}")
    _require(isinstance(m.init_from, str), f"{where}.init_from",
             f"must be a run's workdir (a string; \"\" = none), got {m.init_from!r}")
    if weights and not m.hf_path and not m.init_from and m.init == "auto" and m.preset in PRESETS:
        size = PRESETS[m.preset].num_params()
        _require(size < RANDOM_INIT_MAX_PARAMS, f"{where}.hf_path",
                 f"preset {m.preset!r} ({size / 1e9:.1f}B parameters) has no weights: set {where}.hf_path to a "
                 "Hugging Face checkpoint directory (tpu_scripts/setup.sh --hf-model downloads one), or "
                 f"{where}.init='random' to train from random weights on purpose")
    for key in ("param_dtype", "compute_dtype"):
        _require(m[key] in DTYPES, f"{where}.{key}", f"must be one of {sorted(DTYPES)}")
    _require(m.vocab_size >= 0, f"{where}.vocab_size", "must be >= 0 (0 = the preset's)")


def _check_optim(o, where: str) -> None:
    """The optimizer keys `o` (config.optim, or a role's: `roles.role_optim`) are usable; errors name `where`."""
    from atgrpo_jax.train.update import SCHEDULES
    _require(o.lr > 0, f"{where}.lr", f"must be > 0, got {o.lr}")
    for key in ("b1", "b2"):  # AdamW's moment decays: 1 never forgets the first gradient (b2: divides by ~0)
        _require(0 <= o[key] < 1, f"{where}.{key}", f"must be in [0, 1), got {o[key]}")
    _require(o.schedule in SCHEDULES, f"{where}.schedule", f"must be one of {SCHEDULES}")
    _require(isinstance(o.warmup_steps, int) and o.warmup_steps >= 0, f"{where}.warmup_steps",
             f"must be an int >= 0 (training steps), got {o.warmup_steps!r}")
    _require(0 <= o.min_lr_ratio <= 1, f"{where}.min_lr_ratio", f"must be in [0, 1], got {o.min_lr_ratio}")
    _require(o.weight_decay >= 0 and o.grad_clip > 0, where, "weight_decay must be >= 0 and grad_clip > 0")


def _require(ok: bool, key: str, msg: str):
    if not ok:
        raise ConfigError(f"config.{key}: {msg}")


def validate(c: ml_collections.ConfigDict, *, weights: bool = True) -> ml_collections.ConfigDict:
    """Check every field that can be wrong before anything compiles (after `resolve`)."""
    from atgrpo_jax.algo.advantages import ADVANTAGES
    from atgrpo_jax.models.attention import BACKENDS
    from atgrpo_jax.models.decode_kernel import DECODE_ATTENTION
    from atgrpo_jax.rollout.tree import PLAIN_GROUPINGS
    from atgrpo_jax.train.policies import MASTER_DTYPES

    for key, value in flat(c).items():  # inf or NaN in any number would only show as a diverged run
        if isinstance(value, float) and not key.startswith("env.kwargs"):
            _require(math.isfinite(value), key, f"must be a finite number, got {value}")
    m = c.model
    _check_weights(m, "model", weights)
    for role in _role_sections(c, "role_models", ROLE_MODEL_KEYS, "preset=qwen3-0.6b"):  # as its policy builds it
        _check_weights(role_config(c, role).model, f"policy.role_models.{role}", weights)
    _require(not c.policy.role_models or c.policy.sharing == "per_role", "policy.role_models",
             f"gives a role a model of its own, which only policy.sharing='per_role' has; got {c.policy.sharing!r}")
    _require(c.optim.master_dtype in MASTER_DTYPES + ("auto",), "optim.master_dtype",
             f"must be one of {MASTER_DTYPES + ('auto',)}, got {c.optim.master_dtype!r}")
    _require(m.attention in BACKENDS, "model.attention",
             f"unknown {m.attention!r}{closest(m.attention, BACKENDS)}; known: {', '.join(BACKENDS)}")
    _require(m.attention != "splash" or not c.optim.share_prompts, "model.attention",
             "splash knows only causal masks and segment ids, not rows that pack several responses after one "
             "prompt: set optim.share_prompts=False with it")
    _require(isinstance(m.attention_block, int) and m.attention_block > 0, "model.attention_block",
             f"must be a positive int, got {m.attention_block!r}")
    _require(m.decode_attention in DECODE_ATTENTION, "model.decode_attention",
             f"unknown {m.decode_attention!r}{closest(m.decode_attention, DECODE_ATTENTION)}; "
             f"known: {', '.join(DECODE_ATTENTION)}")
    _require(isinstance(m.decode_unroll, int) and m.decode_unroll >= 0, "model.decode_unroll",
             f"must be an int >= 0 (0 = auto), got {m.decode_unroll!r}")
    _require(isinstance(m.decode_gather, bool), "model.decode_gather", f"must be True or False, got {m.decode_gather!r}")
    _require(isinstance(m.sequence_unroll, int) and m.sequence_unroll >= 0, "model.sequence_unroll",
             f"must be an int >= 0 (0 = auto), got {m.sequence_unroll!r}")
    _require(not c.regime, "regime", "call resolve() first: it expands the shorthand")
    _require(c.policy.sharing in SHARINGS, "policy.sharing",
             f"unknown {c.policy.sharing!r}{closest(c.policy.sharing, SHARINGS)}; known: {', '.join(SHARINGS)}")
    _require(not c.policy.pools or c.policy.sharing == "per_role", "policy.pools",
             f"only policy.sharing='per_role' has one model per agent to place on its own pool, got "
             f"{c.policy.sharing!r}")
    for key in ("data", "fsdp", "tensor"):
        v = c.mesh[key]
        _require(isinstance(v, int) and (v > 0 or v == -1 or (key == "data" and v == 0)), f"mesh.{key}",
                 f"must be > 0 or -1{' (or 0: one row per host)' if key == 'data' else ''}, got {v!r}")
    r = c.rollout
    for key in ("num_tasks", "k", "max_turns", "max_new_tokens", "max_prompt_len"):
        _require(isinstance(r[key], int) and r[key] > 0, f"rollout.{key}", f"must be a positive int, got {r[key]!r}")
    _require(r.k >= 2, "rollout.k", f"{r.k}: a group of one sample has no reward variance, so every advantage is "
             "0 and nothing is learned; use k >= 2 (the paper: 8)")
    _require(isinstance(r.decode_slots, int) and r.decode_slots >= 0, "rollout.decode_slots",
             f"must be an int >= 0 (0 = all rows at once), got {r.decode_slots!r}")
    _require(r.plain_grouping in PLAIN_GROUPINGS, "rollout.plain_grouping",
             f"must be one of {PLAIN_GROUPINGS}, got {r.plain_grouping!r}")
    for pre in ("", "eval_"):  # training, then evaluation
        _require(r[pre + "temperature"] >= 0, f"rollout.{pre}temperature",
                 f"must be >= 0, got {r[pre + 'temperature']}")
        _require(0 < r[pre + "top_p"] <= 1, f"rollout.{pre}top_p", f"must be in (0, 1], got {r[pre + 'top_p']}")
        _require(isinstance(r[pre + "top_k"], int) and r[pre + "top_k"] >= 0, f"rollout.{pre}top_k",
                 f"must be an int >= 0 (0 = off), got {r[pre + 'top_k']!r}")
        _require(r[pre + "repetition_penalty"] > 0, f"rollout.{pre}repetition_penalty",
                 f"must be > 0 (1 = off), got {r[pre + 'repetition_penalty']}")
    _require(list(r.prompt_buckets) == sorted(r.prompt_buckets) and len(r.prompt_buckets) > 0,
             "rollout.prompt_buckets", "must be a non-empty increasing list")
    _require(r.prompt_buckets[-1] >= r.max_prompt_len, "rollout.prompt_buckets",
             f"largest bucket {r.prompt_buckets[-1]} < rollout.max_prompt_len {r.max_prompt_len}")
    for name, mine in r.agents.items():
        _require(hasattr(mine, "keys") and set(mine) <= set(AGENT_KEYS), f"rollout.agents.{name}",
                 f"must set some of {AGENT_KEYS}, got {dict(mine) if hasattr(mine, 'keys') else mine!r}")
        for evaluation in (False, True):
            s = agent_sampling(c, name, evaluation)
            _require(s.temperature >= 0 and 0 < s.top_p <= 1 and s.repetition_penalty > 0 and s.max_new_tokens > 0,
                     f"rollout.agents.{name}", "needs (eval_)temperature >= 0, (eval_)top_p in (0, 1], "
                     "(eval_)repetition_penalty > 0 and max_new_tokens > 0")
    a = c.algo
    _require(a.advantage in ADVANTAGES, "algo.advantage",
             f"unknown {a.advantage!r}{closest(a.advantage, ADVANTAGES)}; known: {', '.join(ADVANTAGES)}")
    for name, estimator in a.role_advantage.items():
        _require(estimator in ADVANTAGES, f"algo.role_advantage.{name}",
                 f"unknown {estimator!r}{closest(str(estimator), ADVANTAGES)}; known: {', '.join(ADVANTAGES)}")
    _require(0 <= a.drop_low_mean_frac < 1, "algo.drop_low_mean_frac", "must be in [0, 1)")
    _require(isinstance(a.filter_plain, bool), "algo.filter_plain", f"must be True or False, got {a.filter_plain!r}")
    _require(isinstance(a.overlong_buffer, int) and a.overlong_buffer >= 0, "algo.overlong_buffer",
             f"must be an integer >= 0 (0: off), got {a.overlong_buffer!r}")
    _require(a.overlong_penalty >= 0, "algo.overlong_penalty", f"must be >= 0, got {a.overlong_penalty}")
    _require(isinstance(a.drop_overlong, bool), "algo.drop_overlong", f"must be True or False, got {a.drop_overlong!r}")
    _require(isinstance(a.dynamic_sampling, int) and a.dynamic_sampling >= 0, "algo.dynamic_sampling",
             f"must be an integer >= 0 (extra rollouts at most; 0: off), got {a.dynamic_sampling!r}")
    _require(not (a.dynamic_sampling and c.system.staleness), "algo.dynamic_sampling",
             "rolls out more tasks after a step's rollout, with the step's weights; system.staleness = 1 made "
             "that rollout with older ones; set one of them to 0")
    _require(a.filter_scope in FILTER_SCOPES, "algo.filter_scope", f"must be one of {FILTER_SCOPES}, got "
             f"{a.filter_scope!r}")
    try:
        loss_config(c)
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    _require(c.loss.logprob_chunk > 0, "loss.logprob_chunk", "must be > 0")
    o = c.optim
    _check_optim(o, "optim")
    for role in _role_sections(c, "role_optim", ROLE_OPTIM_KEYS, "lr=1e-6"):  # as its optimizer will read them
        _check_optim(role_optim(c, role), f"policy.role_optim.{role}")
    _require(isinstance(c.policy.phases, (tuple, list)) and all(isinstance(x, str) and x for x in c.policy.phases),
             "policy.phases", f"must be a tuple of agent names (several in one phase joined by '+'), got "
             f"{c.policy.phases!r}")
    _require(isinstance(c.policy.phase_steps, int) and c.policy.phase_steps > 0, "policy.phase_steps",
             f"must be an integer > 0 (training steps per phase), got {c.policy.phase_steps!r}")
    _require(o.mini_batch_size > 0 and o.epochs > 0, "optim.mini_batch_size", "mini_batch_size and epochs must be > 0")
    _require(c.lora.rank > 0, "lora.rank", "must be > 0")
    y = c.system
    _require(y.schedule in ("sync", "async"), "system.schedule", f"must be 'sync' or 'async', got {y.schedule!r}")
    _require(y.cohorts >= 1 and y.host_workers >= 1, "system.cohorts", "cohorts and host_workers must be >= 1")
    _require(y.staleness in (0, 1), "system.staleness", f"must be 0 or 1, got {y.staleness!r}")
    _require(not (y.staleness and c.reference.logprobs_at_t1), "system.staleness",
             "1 takes the importance ratio against the sampler's log-probs, which reference.logprobs_at_t1 "
             "(on under recipe='reference') does not score under; set one of them to 0 / False")
    _require(y.trace_every >= 0, "system.trace_every", "must be >= 0")
    _require(y.stage_timeout_s >= 0, "system.stage_timeout_s", "must be >= 0 (0 = no limit)")
    t = c.train
    _require(t.steps > 0, "train.steps", "must be > 0")
    for key in ("eval_every", "checkpoint_every", "keep_last", "log_episodes_every", "log_episodes_tasks",
                "max_skipped_updates"):
        _require(t[key] >= 0, f"train.{key}", "must be >= 0")
    _require(t.log_every >= 1, "train.log_every", "must be >= 1")
    _require(isinstance(t.compile_cache, str), "train.compile_cache",
             f"must be \"auto\", \"\" (off) or a directory, got {t.compile_cache!r}")
    s = c.sft
    for key in ("train_path", "valid_path"):
        _require(isinstance(s[key], str), f"sft.{key}", f"must be a data source (a string), got {s[key]!r}")
    for key in ("steps", "rows", "row_tokens"):
        _require(isinstance(s[key], int) and s[key] > 0, f"sft.{key}", f"must be a positive int, got {s[key]!r}")
    _require(s.row_tokens >= 2, "sft.row_tokens", f"must be >= 2 (a token and the one it predicts), got {s.row_tokens}")
    _require(isinstance(s.eval_every, int) and s.eval_every >= 0, "sft.eval_every",
             f"must be an int >= 0 (0 = never), got {s.eval_every!r}")
    loggers = t.loggers
    _require(isinstance(loggers, (tuple, list)) and all(isinstance(x, str) for x in loggers), "train.loggers",
             f"must be a tuple of names from {LOGGERS}, e.g. ('console', 'wandb'), got {loggers!r}")
    unknown = [x for x in loggers if x not in LOGGERS]
    _require(not unknown, "train.loggers", f"unknown {unknown[0]!r}{closest(unknown[0], LOGGERS)}; known: "
             f"{', '.join(LOGGERS)}" if unknown else "")
    return c


def validate_sft(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """What the sft command needs besides `resolve` (atgrpo_jax/sft: one full model, trained on chat data)."""
    resolve(c)
    _require(bool(c.sft.train_path), "sft.train_path",
             "is required: the chat data to train on (--config.sft.train_path=FILE.jsonl; docs/guides/sft.md)")
    _require(c.policy.sharing == "shared", "policy.sharing",
             f"sft trains one full model, so it must be 'shared', got {c.policy.sharing!r}; a per_role or lora "
             "train run then starts every policy (LoRA: the base) from it with model.init_from")
    return c
