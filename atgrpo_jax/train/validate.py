"""Config conversion: `resolve` expands the `regime` shorthand and settles the recipe's switches on the
ConfigDict, then converts it, once, into the typed `Config` (each section checks its own keys), and
`validate` checks the rules between sections; both run before anything compiles, and every error names
its key (`ConfigError`)."""
from __future__ import annotations

import ml_collections

from atgrpo_jax.models.model_config import PRESETS
from atgrpo_jax.registry import closest
from atgrpo_jax.train.config import RECIPES, REGIMES, Config, ConfigError, base_config

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


def resolve(c, *, weights: bool = True) -> Config:
    """The typed `Config` of ConfigDict `c` (left as it is): `regime` expanded into the settings it stands
    for, every switch the `recipe` decides settled (reference.* and optim.master_dtype "auto"), every key
    checked. A `Config` is returned as it is: it was resolved when it was made.

    A setting the user changed from its default to something the regime contradicts is an error.
    weights=False: do not ask for model weights (the memory planner needs the architecture only).
    """
    if isinstance(c, Config):
        return c
    c = ml_collections.ConfigDict(c.to_dict())
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
        if value is None:
            c.reference[key] = as_reference
    if c.reference.lora_on_shared is True and c.policy.sharing == "shared":  # row 9: the reference's L1 YAML
        c.policy.sharing = "shared_lora"
    if c.optim.master_dtype == "auto":
        c.optim.master_dtype = "param_dtype" if as_reference else "float32"
    return validate(Config.from_mapping(c), weights=weights)


def _require(ok: bool, key: str, msg: str):
    if not ok:
        raise ConfigError(f"config.{key}: {msg}")


def _check_weights(m, where: str) -> None:
    """A model section `m` (config.model, or a role's: `Config.role`) that names no weights is
    small enough to start from random ones, or says so (model.init="random")."""
    if not m.hf_path and not m.init_from and m.init == "auto" and m.preset in PRESETS:
        size = PRESETS[m.preset].num_params()
        _require(size < RANDOM_INIT_MAX_PARAMS, f"{where}.hf_path",
                 f"preset {m.preset!r} ({size / 1e9:.1f}B parameters) has no weights: set {where}.hf_path to a "
                 "Hugging Face checkpoint directory (tpu_scripts/setup.sh --hf-model downloads one), or "
                 f"{where}.init='random' to train from random weights on purpose")


CHAT_TEMPLATE_CHARS = "assistant\nuser"  # what the char tokenizer's chat template writes around every chat


def checked_alphabet(alphabet: str) -> str:
    """char_alphabet, refused in one line when a character repeats or one the chat template writes is
    missing (it would become <unk> in every prompt: "assista<unk>t")."""
    repeated = sorted({ch for ch in alphabet if alphabet.count(ch) > 1})
    if repeated:
        raise ConfigError(f"config.char_alphabet: {''.join(repeated)!r} appear more than once; each character once")
    missing = sorted(set(CHAT_TEMPLATE_CHARS) - set(alphabet))
    if missing:
        raise ConfigError(f"config.char_alphabet: has no {''.join(missing)!r}, which the chat template writes "
                          f"(the roles 'user' and 'assistant', newlines): add them to char_alphabet")
    return alphabet


def validate(c: Config, *, weights: bool = True) -> Config:
    """The rules between sections (each section checked its own keys when it was built)."""
    # the derived facts (Config's role views, optimizers, schedule), made now: their errors name the keys
    models = [(c.model, "model")] + [(view.model, f"policy.role_models.{r}") for r, view in c.role_views.items()]
    _ = c.role_optims, c.role_schedule
    if weights:
        for m, where in models:
            _check_weights(m, where)
    _require(c.model.attention != "splash" or not c.optim.share_prompts, "model.attention",
             "splash knows only causal masks and segment ids, not rows that pack several responses after one "
             "prompt: set optim.share_prompts=False with it")
    _require(not c.regime, "regime", "call resolve() first: it expands the shorthand")
    if c.tokenizer == "char" and c.char_alphabet:
        checked_alphabet(c.char_alphabet)
    _require(not (c.algo.dynamic_sampling and c.system.staleness), "algo.dynamic_sampling",
             "rolls out more tasks after a step's rollout, with the step's weights; system.staleness >= 1 made "
             "that rollout with older ones; set one of them to 0")
    _require(c.rollout.tree or "counterfactual" not in {c.algo.advantage, *c.algo.role_advantage.values()},
             "algo.advantage", "counterfactual credit compares an agent's K branches from one state, which only "
             "tree sampling makes: set rollout.tree=True, or another estimator")
    _require(not (c.system.staleness and c.reference.logprobs_at_t1), "system.staleness",
             "N >= 1 takes the importance ratio against the sampler's log-probs, which reference.logprobs_at_t1 "
             "(on under recipe='reference') does not score under; set one of them to 0 / False")
    return c


def validate_sft(c: Config) -> Config:
    """What the sft command needs of a resolved config (atgrpo_jax/sft: one full model, trained on chat data)."""
    _require(bool(c.sft.train_path), "sft.train_path",
             "is required: the chat data to train on (--config.sft.train_path=FILE.jsonl; docs/guides/sft.md)")
    _require(c.policy.sharing == "shared", "policy.sharing",
             f"sft trains one full model, so it must be 'shared', got {c.policy.sharing!r}; a per_role or lora "
             "train run then starts every policy (LoRA: the base) from it with model.init_from")
    return c
