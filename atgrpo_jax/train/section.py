"""The trainer's config sections (atgrpo_jax/typed_config.py): `policy` (who shares weights), `reference`
(the switches of recipe "reference"), `optim` (AdamW and its schedule), `train` (the run) and `sft` (the
supervised warm start, whose command builds on the trainer)."""
from __future__ import annotations

import dataclasses

import numpy as np

from atgrpo_jax.registry import closest
from atgrpo_jax.typed_config import Section, at_least, key, non_negative, positive, within
from atgrpo_jax.train.update import SCHEDULES


@dataclasses.dataclass(frozen=True)
class Sharing:
    """How the agents map to trained weights (config.policy.sharing)."""

    per_agent: bool  # one trained weight set per agent (else one for all)
    lora: bool  # those weight sets are adapters on one frozen shared base

    def route(self, num_agents: int):
        """policy_of_agent [A]: the policy that acts for (and learns from) each agent."""
        return np.arange(num_agents) if self.per_agent else np.zeros(num_agents, np.int64)


SHARINGS = {"shared": Sharing(per_agent=False, lora=False),
            "per_role": Sharing(per_agent=True, lora=False),
            "lora": Sharing(per_agent=True, lora=True),
            "shared_lora": Sharing(per_agent=False, lora=True)}
ROLE_OPTIM_KEYS = ("lr", "schedule", "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip", "b1", "b2")
# the keys that say which weights a role's model has; the rest of `model` (attention, unrolls, ...) is the run's
ROLE_MODEL_KEYS = ("preset", "hf_path", "init", "init_from", "param_dtype", "compute_dtype", "remat", "vocab_size",
                   "init_seed")
MASTER_DTYPES = ("float32", "param_dtype")  # optim.master_dtype once resolved ("auto" before)
LOGGERS = ("console", "tensorboard", "jsonl", "wandb")


@dataclasses.dataclass(frozen=True)
class PolicySettings(Section):
    PATH = "policy"

    sharing: str = key("shared", '"shared" (one model, role prompts), "per_role" (one model per agent), "lora" (one '
                       'adapter per agent on a frozen shared base), "shared_lora" (one adapter for all agents on a '
                       "frozen base)", choices=SHARINGS)
    pools: bool = key(False, "per_role: each agent's model on its own disjoint part of the mesh")
    frozen_agents: tuple = key((), "agents whose samples are not trained on (the paper's ablation: one role trained "
                               "alone while the other stays the base model)")
    phases: tuple = key((), "a role schedule: the agents that train in each phase, the phases taking turns (e.g. "
                        '("planner", "executor"); several agents of one phase joined by "+"); the others sample but '
                        "are not trained on; () = every agent at every step")
    phase_steps: int = key(10, "training steps per phase of policy.phases", check=positive)
    role_optim: dict = key({}, "per agent (per_role, lora), optimizer keys of its own policy, e.g. "
                           "--config.policy.role_optim.planner.lr=5e-7 (lr, schedule, warmup_steps, min_lr_ratio, "
                           "weight_decay, grad_clip, b1, b2); the rest as optim")
    role_models: dict = key({}, "per agent (per_role), a model of its own, e.g. "
                            "--config.policy.role_models.executor.preset=qwen3-0.6b or .hf_path=DIR (preset, "
                            "hf_path, init, init_from, param_dtype, compute_dtype, remat, vocab_size, init_seed); the "
                            "rest as model. One tokenizer serves all")

    def check(self):
        self.require(not self.pools or self.sharing == "per_role", "pools",
                     f"only policy.sharing='per_role' has one model per agent to place on its own pool, got "
                     f"{self.sharing!r}")
        self.require(all(isinstance(x, str) and x for x in self.phases), "phases",
                     f"must be a tuple of agent names (several in one phase joined by '+'), got {self.phases!r}")
        for name, keys, example in (("role_models", ROLE_MODEL_KEYS, "preset=qwen3-0.6b"),
                                    ("role_optim", ROLE_OPTIM_KEYS, "lr=1e-6")):
            for role, own in getattr(self, name).items():
                self.require(isinstance(own, dict), f"{name}.{role}",
                             f"must be a section of keys, e.g. --config.policy.{name}.{role}.{example}")
                unknown = sorted(set(own) - set(keys))
                self.require(not unknown, f"{name}.{role}", f"{unknown} cannot differ per role; known: "
                             f"{', '.join(keys)}")
        self.require(not self.role_models or self.sharing == "per_role", "role_models",
                     f"gives a role a model of its own, which only policy.sharing='per_role' has; got "
                     f"{self.sharing!r}")

    @property
    def routing(self) -> Sharing:
        return SHARINGS[self.sharing]


@dataclasses.dataclass(frozen=True)
class ReferenceSettings(Section):
    """One switch per difference from the reference that is a run setting; None: as `recipe` says, True: the
    reference's behaviour, False: this project's (`resolve` settles each None)."""

    PATH = "reference"

    lr_schedule: bool | None = key(None, "verl's cosine as the reference runs it: warm-up from min_lr_ratio x lr, "
                                   "and with no total step count set, the rate alternates lr, min_lr_ratio x lr after "
                                   "the warm-up (a bug: row 8)")
    logprobs_at_t1: bool | None = key(None, "score old and new log-probs at temperature 1 with no top-k, top-p or "
                                      "repetition penalty, whatever the tokens were drawn from (row 6)")
    lora_on_shared: bool | None = key(None, 'a "shared" policy trains one LoRA adapter (lora.rank 16, lora.alpha '
                                      "32) on the frozen model, as the reference's YAML and its AT-GRPO Sokoban "
                                      "script ask; two of its game scripts set rank 0 and train it whole (row 9)")
    unshuffled_minibatches: bool | None = key(None, "mini-batches take the step's groups in the order they were "
                                              "collected, not shuffled (row 15)")
    shared_scheduler: bool | None = key(None, "with one LoRA adapter per agent (L2), every agent's update steps "
                                        "one shared lr scheduler, the agents in name order: with lr_schedule, "
                                        "after the warm-up the first agent always trains at lr and the second at "
                                        "min_lr_ratio x lr (row 8)")
    peft_lora_init: bool | None = key(None, "LoRA's A starts as peft's default (kaiming-uniform with a = sqrt(5): "
                                      "U(-1/sqrt(d), 1/sqrt(d)), variance 1/(3d)) instead of N(0, 1/d); B is zero "
                                      "either way (row L)")
    shared_lora_samples_base: bool | None = key(None, 'with one adapter for all agents ("shared_lora", L1 with '
                                                "LoRA), rollouts and evaluation sample from the frozen base "
                                                "weights, the adapter only scoring and training: the reference's "
                                                "requests never name its adapter (row L)")
    shared_later_reward: bool | None = key(None, "tree sampling: a turn's later agents are scored on copies of the "
                                           "branch selected for its first agent, so their K samples share one "
                                           "reward (a group with no variance) and the episode goes on from that "
                                           "branch (X3)")
    drop_after_done: bool | None = key(None, "tree sampling: in a turn whose selected branch ends the episode, "
                                       "the samples of the agents after the first are dropped (X3)")
    lumped_groups: bool | None = key(None, "tree sampling: advantages and filters see one group per (K "
                                     "consecutive tasks, agent, turn), the reference's key dividing the task "
                                     "index by K once too often (X3)")


@dataclasses.dataclass(frozen=True)
class OptimSettings(Section):
    """AdamW, its schedule and the update's batches (a role's own: `roles.role_optim`)."""

    PATH = "optim"

    lr: float = key(1e-6, "learning rate", check=positive)
    master_dtype: str = key("auto", '"float32": with a lower model.param_dtype, train float32 master weights '
                            "(AdamW's moments too) and sample with a copy in param_dtype; \"param_dtype\": train in "
                            'param_dtype (less memory, as the reference: row 7); "auto": float32 under recipe '
                            '"paper", param_dtype under "reference"', choices=MASTER_DTYPES + ("auto",))
    schedule: str = key("constant", "\"constant\" or \"cosine\" (verl's: over the run's training steps down to "
                        "min_lr_ratio x lr); the rate changes once per training step, never within one",
                        choices=SCHEDULES)
    warmup_steps: int = key(0, "training steps of linear warm-up from 0 (step s runs at (s - 1) / warmup_steps x "
                            "lr)", check=non_negative)
    min_lr_ratio: float = key(0.0, '"cosine" ends at this fraction of lr', check=within(0, 1))
    weight_decay: float = key(0.01, "AdamW weight decay", check=non_negative)
    grad_clip: float = key(1.0, "global gradient-norm clip", check=positive)
    # AdamW's moment decays: 1 never forgets the first gradient (b2: divides by ~0)
    b1: float = key(0.9, "AdamW beta1", check=within(0, 1, high_open=True))
    b2: float = key(0.999, "AdamW beta2", check=within(0, 1, high_open=True))
    mini_batch_size: int = key(16, "samples per optimizer step (whole groups go together)", check=positive)
    epochs: int = key(1, "passes over each step's samples", check=positive)
    share_prompts: bool = key(True, "a group's samples share one forward pass of their prompt in the update")


@dataclasses.dataclass(frozen=True)
class TrainSettings(Section):
    """The run: all but the seed may change when it resumes (how long, how often, where it logs)."""

    PATH = "train"

    steps: int = key(200, "training steps", check=positive, resumable=True)
    seed: int = key(0, "seed of tasks, sampling and mini-batch order")
    eval_every: int = key(10, "evaluate every this many steps (0 = never)", check=non_negative, resumable=True)
    eval_first: bool = key(True, "with eval_every, evaluate before the first step too (the untrained start: step 0); "
                           "False skips it, e.g. in an ablation whose arms all start from the same weights",
                           resumable=True)
    eval_tasks: int = key(100, "tasks per evaluation split of generated tasks (a finite split: all its problems)",
                          resumable=True)
    eval_k: int = key(1, "episodes per held-out task (avg@k)", resumable=True)
    log_every: int = key(1, "write metrics every this many steps (evaluation steps always)", check=at_least(1),
                         resumable=True)
    log_episodes_every: int = key(10, "write what the agents said (episodes.jsonl, TensorBoard text) every this "
                                  "many steps (0 = never)", check=non_negative, resumable=True)
    log_episodes_tasks: int = key(2, "tasks per logged step", check=non_negative, resumable=True)
    checkpoint_every: int = key(10, "save a checkpoint every this many steps (and at the end)", check=non_negative,
                                resumable=True)
    keep_last: int = key(2, "checkpoints kept besides the best one (0 = all)", check=non_negative, resumable=True)
    time_budget_s: float = key(0.0, "stop (evaluate, checkpoint) after this many seconds (0 = no limit)",
                               resumable=True)
    compile_cache: str = key("auto", "JAX's persistent compilation cache, so a second run of a config skips "
                             'compiling: "auto" = $JAX_COMPILATION_CACHE_DIR, else ~/.cache/atgrpo-jax/jax '
                             '($XDG_CACHE_HOME); "" = off; or a directory', resumable=True)
    preempt_deadline_s: float = key(20.0, "seconds a run that must stop (SIGTERM, SIGINT, a stage past "
                                    "system.stage_timeout_s) has to save its last completed step and exit, "
                                    "whatever a reward call, sandboxed program or rollout is doing (the step "
                                    "under way is abandoned, not awaited)", check=positive, resumable=True)
    max_skipped_updates: int = key(4, "stop the run when a policy's updates are skipped (non-finite loss or "
                                   "gradient) this many times in a row: it diverged (0 = never stop)",
                                   check=non_negative, resumable=True)
    loggers: tuple = key(("console", "tensorboard", "jsonl"), "where metrics go: console (the progress line), "
                         "tensorboard (tb/), jsonl (metrics.jsonl, episodes.jsonl), wandb (Weights & Biases: pip "
                         'install -e ".[wandb]"; a resume continues the same W&B run)', resumable=True)
    wandb_project: str = key("", 'W&B project ("" = $WANDB_PROJECT, else "atgrpo-jax")', resumable=True)
    wandb_entity: str = key("", 'W&B entity, a user or team ("" = your default)', resumable=True)

    def check(self):
        self.require(all(isinstance(x, str) for x in self.loggers), "loggers",
                     f"must be a tuple of names from {LOGGERS}, e.g. ('console', 'wandb'), got {self.loggers!r}")
        for name in self.loggers:
            self.require(name in LOGGERS, "loggers", f"unknown {name!r}{closest(name, LOGGERS)}; known: "
                         f"{', '.join(LOGGERS)}")


@dataclasses.dataclass(frozen=True)
class SftSettings(Section):
    """The supervised warm start's own keys (atgrpo_jax/sft, a command above the trainer, reads them); a
    `train` run does not read them, so it may resume with any."""

    PATH = "sft"

    train_path: str = key("", "chat data to train on: .jsonl/.json/.parquet, a save_to_disk directory or "
                          'hf:org/name, rows of {"messages": [{"role": system|user|assistant, "content": str}, ...]}; '
                          "loss on assistant tokens only")
    valid_path: str = key("", 'held-out chat data in the same format, its loss logged as valid_loss ("" = none)',
                          resumable=True)
    steps: int = key(100, "optimizer steps (optim.schedule spans them)", check=positive, resumable=True)
    rows: int = key(8, "packed rows per optimizer step", check=positive)
    row_tokens: int = key(2048, "tokens per packed row: conversations are packed whole into rows (attending only to "
                          "themselves); a longer one is cut at the row's end (metric truncated)",
                          check=(lambda v: v >= 2, "must be >= 2 (a token and the one it predicts), got {value}"))
    eval_every: int = key(10, "held-out loss on sft.valid_path every this many steps and at the end (0 = never)",
                          check=non_negative, resumable=True)
