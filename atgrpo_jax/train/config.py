"""The training config: every number a user sets, its default and what it means.

Config files in `configs/` start from `base_config()` and change what their
task needs. Each key below has one comment: it is the key's documentation
(`config_docs.py` reads it; the README's config reference is checked against
it by a test). Validation lives in `validate.py`.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from atgrpo_jax.cli import OPEN_SECTIONS
from atgrpo_jax.envs.workflow import RECIPES  # noqa: F401  (config.recipe's choices, shared with the workflows)
from atgrpo_jax.errors import ConfigError  # noqa: F401  (raised here; also importable from here)


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = ml_collections.ConfigDict()  # the policy model (Qwen3)
    c.model.preset = "qwen3-1.7b"  # architecture, a name in atgrpo_jax.models.config.PRESETS; a checkpoint in
    # model.hf_path must match it ("" = whatever the checkpoint's config.json says)
    c.model.hf_path = ""  # the Qwen3 checkpoint to start from: a Hugging Face directory (config.json, *.safetensors,
    # tokenizer) or a hub id org/name[@revision] (downloaded into the Hugging Face cache; offline: from it)
    c.model.init = "auto"  # "auto": the weights of model.hf_path (random only for presets under 250M parameters);
    # "random": random on purpose
    c.model.param_dtype = "float32"  # storage dtype of the weights: float32, bfloat16 or float16
    c.model.compute_dtype = "float32"  # dtype of matmul inputs, activations and the KV cache
    c.model.remat = False  # recompute each layer in the backward pass (less memory, ~30% more compute)
    c.model.recompute_elementwise = True  # without remat: the backward recomputes norms, RoPE and SwiGLU instead of
    # keeping their intermediates: 9 of a layer's 20 sequence-sized tensors kept, no matmul run twice (models/qwen3.py)
    c.model.attention = "auto"  # auto|xla|chunked|splash|cudnn; auto: splash on TPU where it applies, cuDNN on
    # GPU, einsum on CPU for short rows, chunked (O(T) memory) otherwise; see README "Long responses"
    c.model.attention_block = 512  # query/key block of the chunked backend
    c.model.decode_attention = "xla"  # the sampler's decode steps: "xla" (einsums) or "pallas" (GPU: one Triton
    # kernel per part that skips masked key blocks, models/decode_kernel.py; CPU: its interpreter, tests only)
    c.model.decode_unroll = 0  # decoder layers per loop iteration in decode steps; all (auto on GPU and TPU):
    # unrolled on per-layer copies of the weights and caches (no per-step copies, one more copy of the layer
    # weights while sampling); 1 (auto on CPU): a rolled loop over the stacked ones (models/qwen3.py: layer_unroll)
    c.model.decode_gather = True  # per-layer decode steps (GPU, TPU) read the layer weights and the LM head
    # gathered whole over the mesh's fsdp axis once per sampling call (no weight collectives in a step; one
    # more copy of the weights / tensor on each device); False: each step gathers its shards (less memory)
    c.model.sequence_unroll = 0  # decoder layers per loop iteration in prefill and the update (the same
    # math); 0 = auto: all on GPU (a faster update, a longer compile: docs/device.md), 1 on CPU and TPU
    # (compile time flat in depth)
    c.model.init_seed = 0  # seed of random weights and of LoRA adapters
    c.model.init_from = ""  # the workdir of an `sft` (or `train`) run of one shared policy whose newest checkpoint's
    # weights start the model (after model.hf_path or random init; every policy starts from them, LoRA: the base);
    # read at step 0 only, so a resumed run no longer needs it ("" = none; docs/guides/sft.md)
    c.model.vocab_size = 0  # embedding rows of a random model; 0 = the preset's
    c.tokenizer = "qwen3"  # "qwen3" (offline, or model.hf_path's own), "char", or a directory (or hub id) with
    # tokenizer files
    c.char_alphabet = ""  # the char tokenizer's characters ("" = printable ASCII and newline)
    c.mesh = ml_collections.ConfigDict()  # device mesh (see atgrpo_jax/sharding.py); -1 = all remaining devices
    c.mesh.data = 0  # data-parallel axis: spans hosts; each data row holds a whole copy of each policy (0: one
    # row per host, so each host samples with its own copy)
    c.mesh.fsdp = -1  # parameters, optimizer state and batch split over this axis
    c.mesh.tensor = 1  # heads, MLP and vocabulary split over this axis
    c.env = ml_collections.ConfigDict()  # the task and its agents
    c.env.workflow = "plan_path_tool_plan"  # a registered workflow name (atgrpo_jax/envs/registry.py) or
    # "package.module:factory"
    c.env.single_agent = False  # the workflow's one-agent variant (the paper's single-agent baseline)
    c.env.kwargs = ml_collections.ConfigDict()  # keyword arguments of the workflow's factory; any key may be set
    c.policy = ml_collections.ConfigDict()  # who shares weights
    c.policy.sharing = "shared"  # "shared" (one model, role prompts), "per_role" (one model per agent), "lora" (one
    # adapter per agent on a frozen shared base), "shared_lora" (one adapter for all agents on a frozen base)
    c.policy.pools = False  # per_role: each agent's model on its own disjoint part of the mesh
    c.policy.frozen_agents = ()  # agents whose samples are not trained on (the paper's ablation: one role
    # trained alone while the other stays the base model)
    c.policy.phases = ()  # a role schedule: the agents that train in each phase, the phases taking turns (e.g.
    # ("planner", "executor"); several agents of one phase joined by "+"); the others sample but are not trained
    # on; () = every agent at every step
    c.policy.phase_steps = 10  # training steps per phase of policy.phases
    c.policy.role_optim = ml_collections.ConfigDict()  # per agent (per_role, lora), optimizer keys of its own policy,
    # e.g. --config.policy.role_optim.planner.lr=5e-7 (lr, schedule, warmup_steps, min_lr_ratio, weight_decay,
    # grad_clip, b1, b2); the rest as optim
    c.policy.role_models = ml_collections.ConfigDict()  # per agent (per_role), a model of its own, e.g.
    # --config.policy.role_models.executor.preset=qwen3-0.6b or .hf_path=DIR (preset, hf_path, init, init_from,
    # param_dtype, compute_dtype, remat, vocab_size, init_seed); the rest as model. One tokenizer serves all
    c.recipe = "paper"  # "paper": the paper's intent with the reference system's bugs fixed; "reference":
    # PettingLLMs as it runs (docs/paper.md "Recipes"): every switch left at None below, and the workflow's own
    # (env.kwargs, see each workflow), take the reference's behaviour
    c.reference = ml_collections.ConfigDict()  # one switch per difference from the reference that is a run
    # setting; None: as `recipe` says, True: the reference's behaviour, False: this project's
    c.reference.lr_schedule = None  # verl's cosine as the reference runs it: warm-up from min_lr_ratio x lr, and
    # with no total step count set, the rate alternates lr, min_lr_ratio x lr after the warm-up (a bug: row 8)
    c.reference.logprobs_at_t1 = None  # score old and new log-probs at temperature 1 with no top-k, top-p or
    # repetition penalty, whatever the tokens were drawn from (row 6)
    c.reference.lora_on_shared = None  # a "shared" policy trains one LoRA adapter (lora.rank 16, lora.alpha 32) on the
    # frozen model, as the reference's YAML asks; its official game scripts set rank 0 and train it whole (row 9)
    c.reference.unshuffled_minibatches = None  # mini-batches take the step's groups in the order they were
    # collected, not shuffled (row 15)
    c.regime = ""  # shorthand expanded once by resolve(): shared, per_role, lora, shared_lora, single_agent,
    # plain_grpo (see REGIMES)
    c.rollout = ml_collections.ConfigDict()  # sampling of training episodes
    c.rollout.tree = True  # AT-GRPO tree sampling (K branches per state, best branch continues); False: K independent
    # episodes per task
    c.rollout.plain_grouping = "task"  # without tree sampling: one group per "task" (every agent's sample at the
    # task's last turn, as the reference system), or per "task_agent" (each agent's last sample of each episode)
    c.rollout.num_tasks = 32  # tasks per training step (B)
    c.rollout.k = 8  # branches (tree) or episodes (plain) per task: the group size K
    c.rollout.max_turns = 4  # turns per episode (T); every agent acts once per turn
    c.rollout.temperature = 1.0  # sampling temperature in training (0: greedy; the update then scores at 1)
    c.rollout.top_p = 1.0  # nucleus sampling in training (1 = off)
    c.rollout.top_k = 0  # top-k sampling in training (0 = off); one for all agents
    c.rollout.repetition_penalty = 1.0  # vLLM's repetition penalty in training: logits of ids already in the prompt
    # or the response divided by it where positive, multiplied where not (1 = off)
    c.rollout.max_prompt_len = 4096  # prompt tokens kept (cut from the left)
    c.rollout.prompt_buckets = (512, 1024, 2048, 4096)  # padded prompt lengths (one compilation each); the last >=
    # max_prompt_len
    c.rollout.max_new_tokens = 2048  # response tokens per sample
    c.rollout.decode_slots = 0  # rows one sampling call decodes at once (0: all, tasks x k); fewer bound the new
    # tokens' cache to slots x max_new_tokens, and a finished row's slot takes a waiting row (continuous batching)
    c.rollout.eval_temperature = 0.0  # sampling temperature in evaluation (0 = greedy)
    c.rollout.eval_top_p = 1.0  # nucleus sampling in evaluation (1 = off)
    c.rollout.eval_top_k = 0  # top-k sampling in evaluation (0 = off); one for all agents
    c.rollout.eval_repetition_penalty = 1.0  # repetition penalty in evaluation (1 = off)
    c.rollout.thinking = False  # Qwen3's thinking mode (the chat template's enable_thinking); the paper's runs: off
    c.rollout.agents = ml_collections.ConfigDict()  # per agent: {name: {temperature, top_p, repetition_penalty,
    # eval_temperature, eval_top_p, eval_repetition_penalty, max_new_tokens, thinking}}, e.g.
    # --config.rollout.agents.reasoner.max_new_tokens=4096; unset keys: the rollout's
    c.algo = ml_collections.ConfigDict()  # rewards, advantages, group filters
    c.algo.alpha = 1.0  # an agent's reward = its own + alpha * the team's
    c.algo.advantage = "grpo"  # advantage estimator, a name in atgrpo_jax.algo.advantages.ADVANTAGES (grpo, drgrpo)
    c.algo.role_advantage = ml_collections.ConfigDict()  # per agent, another estimator than algo.advantage, e.g.
    # --config.algo.role_advantage.coder=drgrpo (rLLM's per-trajectory-group map); unset agents: algo.advantage
    c.algo.drop_low_mean_frac = 0.5  # drop this fraction of the groups with the lowest mean reward
    c.algo.drop_zero_variance = False  # drop groups whose K rewards are all equal
    c.algo.filter_plain = False  # apply the two filters above without tree sampling too (rollout.tree=False);
    # the reference filters only tree-sampled groups
    c.algo.filter_scope = "policy"  # the low-mean filter ranks groups within each "policy" (as each model's batch is
    # filtered on its own), each "agent", or the whole "batch"
    c.algo.overlong_buffer = 0  # DAPO's soft overlong punishment: a response within this many tokens of its
    # max_new_tokens loses up to algo.overlong_penalty of reward, linearly, all of it at the budget; 0: off
    c.algo.overlong_penalty = 1.0  # the most the soft overlong punishment takes (>= 0)
    c.algo.drop_overlong = False  # DAPO's overlong filtering: a response that used its whole budget (cut, most
    # likely) is not trained on; its group's advantages are computed with it
    c.algo.dynamic_sampling = 0  # DAPO's dynamic sampling: while a policy has fewer groups with reward variance
    # than its first rollout had groups, roll out rollout.num_tasks more tasks, at most this many times; 0: off
    c.loss = ml_collections.ConfigDict()  # the clipped policy-gradient loss
    c.loss.eps_low = 0.2  # clip the ratio below at 1 - eps_low
    c.loss.eps_high = 0.2  # clip the ratio above at 1 + eps_high
    c.loss.dual_clip = 0.0  # c > 1: dual clip for negative advantages; 0 = off
    c.loss.aggregation = "token-mean"  # a name in atgrpo_jax.algo.loss.AGGREGATIONS (token-mean, seq-mean-token-mean)
    c.loss.kl_coef = 0.0  # weight of the k3 KL to the starting policy (0: no reference kept)
    c.loss.entropy_coef = 0.0  # weight of the entropy bonus
    c.loss.is_correction = "none"  # "truncated" (TIS) / "masked" (MIS): weigh tokens by pi_trainer / pi_sampler,
    # capped at loss.is_cap or dropped above it, for a sampler that runs in another precision (logprob_gap > 0)
    c.loss.is_cap = 2.0  # C of loss.is_correction (>= 1)
    c.loss.ratio_level = "token"  # "sequence": GSPO's ratio and clip per sample (its mean token log-ratio);
    # GSPO's paper clips at eps_low 3e-4, eps_high 4e-4 and takes seq-mean-token-mean
    c.loss.logprob_chunk = 512  # tokens per chunk of the LM head in the update ([chunk, vocab] logits at a time)
    c.optim = ml_collections.ConfigDict()  # AdamW
    c.optim.lr = 1e-6  # learning rate
    c.optim.master_dtype = "auto"  # "float32": with a lower model.param_dtype, train float32 master weights
    # (AdamW's moments too) and sample with a copy in param_dtype; "param_dtype": train in param_dtype (less
    # memory, as the reference: row 7); "auto": float32 under recipe "paper", param_dtype under "reference"
    c.optim.schedule = "constant"  # "constant" or "cosine" (verl's: over the run's training steps down to
    # min_lr_ratio x lr); the rate changes once per training step, never within one
    c.optim.warmup_steps = 0  # training steps of linear warm-up from 0 (step s runs at (s - 1) / warmup_steps x lr)
    c.optim.min_lr_ratio = 0.0  # "cosine" ends at this fraction of lr
    c.optim.weight_decay = 0.01  # AdamW weight decay
    c.optim.grad_clip = 1.0  # global gradient-norm clip
    c.optim.b1 = 0.9  # AdamW beta1
    c.optim.b2 = 0.999  # AdamW beta2
    c.optim.mini_batch_size = 16  # samples per optimizer step (whole groups go together)
    c.optim.epochs = 1  # passes over each step's samples
    c.optim.share_prompts = True  # a group's samples share one forward pass of their prompt in the update
    c.system = ml_collections.ConfigDict()  # how a step's work is scheduled (atgrpo_jax/rollout/dispatch.py)
    c.system.schedule = "sync"  # "sync": each stage over all tasks in turn; "async": cohorts of tasks through one
    # sampling queue per policy and a pool of host workers, and the policies' updates at once (same samples)
    c.system.cohorts = 4  # async: the step's tasks move through their turns in this many independent cohorts
    c.system.host_workers = 4  # async: threads for environment steps (sandbox runs, grading, parsing)
    c.system.staleness = 0  # 1: step n+1's rollout runs on the weights from before step n's update while it runs
    # (the importance ratio is then taken against the sampler's log-probs); 0: exactly on-policy
    c.system.trace_every = 0  # write trace/step_N.json (Chrome/Perfetto timeline) every this many steps
    c.system.stage_timeout_s = 1800.0  # stop the run when one stage (a sampling call, an environment step)
    # runs longer than this many seconds, naming it (a hung device call or sandbox wait; 0 = no limit)
    c.lora = ml_collections.ConfigDict()  # adapters (policy.sharing = "lora" or "shared_lora")
    c.lora.rank = 16  # adapter rank r
    c.lora.alpha = 32.0  # adapter scale alpha (the update is alpha / r * A @ B)
    c.train = ml_collections.ConfigDict()  # the run
    c.train.steps = 200  # training steps
    c.train.seed = 0  # seed of tasks, sampling and mini-batch order
    c.train.eval_every = 10  # evaluate every this many steps (0 = never)
    c.train.eval_tasks = 100  # tasks per evaluation split of generated tasks (a finite split: all its problems)
    c.train.eval_k = 1  # episodes per held-out task (avg@k)
    c.train.log_every = 1  # write metrics every this many steps (evaluation steps always)
    c.train.log_episodes_every = 10  # write what the agents said (episodes.jsonl, TensorBoard text) every this many
    # steps (0 = never)
    c.train.log_episodes_tasks = 2  # tasks per logged step
    c.train.checkpoint_every = 10  # save a checkpoint every this many steps (and at the end)
    c.train.keep_last = 2  # checkpoints kept besides the best one (0 = all)
    c.train.time_budget_s = 0.0  # stop (evaluate, checkpoint) after this many seconds (0 = no limit)
    c.train.compile_cache = "auto"  # JAX's persistent compilation cache, so a second run of a config skips
    # compiling: "auto" = $JAX_COMPILATION_CACHE_DIR, else ~/.cache/atgrpo-jax/jax ($XDG_CACHE_HOME); "" = off; or a
    # directory
    c.train.max_skipped_updates = 4  # stop the run when a policy's updates are skipped (non-finite loss or
    # gradient) this many times in a row: it diverged (0 = never stop)
    c.train.loggers = ("console", "tensorboard", "jsonl")  # where metrics go: console (the progress line),
    # tensorboard (tb/), jsonl (metrics.jsonl, episodes.jsonl), wandb (Weights & Biases: pip install -e ".[wandb]";
    # a resume continues the same W&B run)
    c.train.wandb_project = ""  # W&B project ("" = $WANDB_PROJECT, else "atgrpo-jax")
    c.train.wandb_entity = ""  # W&B entity, a user or team ("" = your default)
    c.sft = ml_collections.ConfigDict()  # supervised warm start, `python -m atgrpo_jax.sft` (docs/guides/sft.md);
    # it also reads model.*, tokenizer, rollout.thinking (the chat template's), optim.*, train.seed,
    # train.checkpoint_every, train.keep_last, train.loggers
    c.sft.train_path = ""  # chat data to train on: .jsonl/.json/.parquet, a save_to_disk directory or hf:org/name,
    # rows of {"messages": [{"role": system|user|assistant, "content": str}, ...]}; loss on assistant tokens only
    c.sft.valid_path = ""  # held-out chat data in the same format, its loss logged as valid_loss ("" = none)
    c.sft.steps = 100  # optimizer steps (optim.schedule spans them)
    c.sft.rows = 8  # packed rows per optimizer step
    c.sft.row_tokens = 2048  # tokens per packed row: conversations are packed whole into rows (attending only
    # to themselves); a longer one is cut at the row's end (metric truncated)
    c.sft.eval_every = 10  # held-out loss on sft.valid_path every this many steps and at the end (0 = never)
    c.distributed = ml_collections.ConfigDict()  # several processes (hosts); see atgrpo_jax/distributed.py
    c.distributed.coordinator_address = ""  # host:port of process 0 (or ATGRPO_COORDINATOR)
    c.distributed.num_processes = 0  # processes in the run (0: from ATGRPO_NUM_PROCESSES, else 1)
    c.distributed.process_id = -1  # this process (-1: from ATGRPO_PROCESS_ID)
    c.distributed.auto = False  # let jax.distributed find the hosts itself (TPU pods, SLURM; tpu_scripts/launch.sh,
    # slurm.sh and gke.sh set it: docs/clusters.md)
    return c


@dataclasses.dataclass(frozen=True)
class AgentSampling:
    """How one agent's responses are sampled (rollout.* with its rollout.agents.<name> overrides)."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    thinking: bool
    repetition_penalty: float = 1.0

    @property
    def inv_temp(self) -> float:
        """What the update divides the logits by (greedy samples: scored at temperature 1)."""
        return 1.0 / self.temperature if self.temperature > 0 else 1.0


SAMPLING_KEYS = ("temperature", "top_p", "repetition_penalty")  # each with an eval_ twin
AGENT_KEYS = SAMPLING_KEYS + tuple(f"eval_{k}" for k in SAMPLING_KEYS) + ("max_new_tokens", "thinking")


def agent_sampling(c, name: str, evaluation: bool = False) -> AgentSampling:
    """Agent `name`'s sampling in training, or with `evaluation` the rollout.eval_* settings."""
    r = c.rollout
    mine = dict(r.agents.get(name, {}))
    pre = "eval_" if evaluation else ""
    get = lambda key: mine.get(key, r[key])  # noqa: E731
    return AgentSampling(float(get(pre + "temperature")), float(get(pre + "top_p")), int(r[pre + "top_k"]),
                         int(get("max_new_tokens")), bool(get("thinking")), float(get(pre + "repetition_penalty")))


def max_new_tokens(c) -> int:
    """The longest response any agent may give."""
    return max([c.rollout.max_new_tokens] + [int(a.get("max_new_tokens", 0)) for a in c.rollout.agents.values()])


@dataclasses.dataclass(frozen=True)
class Sharing:
    """How the agents map to trained weights (config.policy.sharing)."""

    per_agent: bool  # one trained weight set per agent (else one for all)
    lora: bool  # those weight sets are adapters on one frozen shared base

    def route(self, num_agents: int):
        """policy_of_agent [A]: the policy that acts for (and learns from) each agent."""
        import numpy as np
        return np.arange(num_agents) if self.per_agent else np.zeros(num_agents, np.int64)


SHARINGS = {"shared": Sharing(per_agent=False, lora=False),
            "per_role": Sharing(per_agent=True, lora=False),
            "lora": Sharing(per_agent=True, lora=True),
            "shared_lora": Sharing(per_agent=False, lora=True)}

# The shorthand `regime` -> the three settings it stands for.
REGIMES = {
    "shared": {"policy.sharing": "shared", "rollout.tree": True, "env.single_agent": False},
    "per_role": {"policy.sharing": "per_role", "rollout.tree": True, "env.single_agent": False},
    "lora": {"policy.sharing": "lora", "rollout.tree": True, "env.single_agent": False},
    "shared_lora": {"policy.sharing": "shared_lora", "rollout.tree": True, "env.single_agent": False},
    "single_agent": {"policy.sharing": "shared", "rollout.tree": True, "env.single_agent": True},
    "plain_grpo": {"policy.sharing": "shared", "rollout.tree": False, "env.single_agent": False},
}


def sharing(c) -> Sharing:
    return SHARINGS[c.policy.sharing]


def loss_config(c):
    """The loss settings as `algo.loss.LossConfig` (which checks them)."""
    from atgrpo_jax.algo.loss import LossConfig
    return LossConfig(**{k: v for k, v in c.loss.items() if k != "logprob_chunk"})


# ---------------------------------------------------------------- configs saved by earlier versions

def upgrade(saved: dict) -> dict:
    """A config dict (e.g. a run's config.json) written by an earlier version, in today's keys:
    `regime` and `policy_pools` became policy.sharing / rollout.tree / env.single_agent /
    policy.pools; `algo.use_std` became algo.advantage."""
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in saved.items()}
    regime = d.get("regime", "")
    if "policy_pools" in d:
        d.setdefault("policy", {})["pools"] = bool(d.pop("policy_pools"))
    if regime in REGIMES:
        for key, value in REGIMES[regime].items():
            section, leaf = key.split(".")
            d.setdefault(section, {})[leaf] = value
        d["regime"] = ""
    algo = d.get("algo", {})
    if "use_std" in algo:
        algo["advantage"] = "grpo" if algo.pop("use_std") else "drgrpo"
    return d


def from_saved(saved: dict) -> ml_collections.ConfigDict:
    """A run's saved config (its config.json, of this or an earlier version) as today's ConfigDict."""
    c = base_config()
    _merge(c, upgrade(saved), "")
    return c


def _merge(c: ml_collections.ConfigDict, d: dict, prefix: str):
    for key, value in d.items():
        if key not in c:
            raise ConfigError(f"config.{prefix}{key}: in the saved config but not a key of this version")
        if f"{prefix}{key}" in OPEN_SECTIONS:  # keys the user chose (agent names, kwargs): the saved ones
            c[key] = ml_collections.ConfigDict(value)
        elif isinstance(c[key], ml_collections.ConfigDict):
            _merge(c[key], value, f"{prefix}{key}.")
        else:
            c[key] = tuple(value) if isinstance(c[key], tuple) and isinstance(value, list) else value


def flat(c) -> dict:
    """{dotted key: value} of every leaf (env.kwargs as one dict)."""
    out = {}
    for key, value in c.items():
        if isinstance(value, ml_collections.ConfigDict) and key != "kwargs":
            out.update({f"{key}.{k}": v for k, v in flat(value).items()})
        else:
            out[key] = value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value
    return out


# Keys a resumed run may change: how long and how often, and where it runs.
# rollout.decode_slots, model.decode_attention, model.decode_unroll, model.decode_gather, model.sequence_unroll and
# model.recompute_elementwise change how the layers run, never the math (rounding aside);
# train.compile_cache only where compiled programs are kept.
RESUMABLE = ("train.steps", "train.time_budget_s", "train.eval_every", "train.eval_tasks", "train.eval_k",
             "train.log_every", "train.log_episodes", "train.checkpoint_every", "train.keep_last",
             "train.max_skipped_updates", "train.loggers", "train.wandb_", "train.compile_cache", "mesh.",
             "sft.",  # the sft command's own keys, which a train run does not read (sft.loop.SFT_RESUMABLE)
             "distributed.", "rollout.decode_slots", "model.decode_attention", "model.decode_unroll",
             "model.decode_gather",
             "model.sequence_unroll",
             "model.recompute_elementwise",
             "system.schedule", "system.cohorts",
             "system.host_workers", "system.trace_every", "system.stage_timeout_s")


def changed_keys(saved: ml_collections.ConfigDict, now: ml_collections.ConfigDict) -> dict[str, tuple]:
    """{key: (saved value, current value)} of the keys that differ, both resolved."""
    a, b = flat(saved), flat(now)
    norm = lambda v: list(v) if isinstance(v, tuple) else v
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if norm(a.get(k)) != norm(b.get(k))}
