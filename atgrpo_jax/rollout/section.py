"""The config's `rollout` and `system` sections (atgrpo_jax/typed_config.py): how training episodes are
sampled, and how a step's work is scheduled; and `AgentSampling`, one agent's sampling settings."""
from __future__ import annotations

import dataclasses

from atgrpo_jax.typed_config import Section, key, non_negative, positive

PLAIN_GROUPINGS = ("task", "task_agent")  # rollout.plain_grouping: see rollout/plain.py
SCHEDULES = ("sync", "async")  # system.schedule


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


@dataclasses.dataclass(frozen=True)
class RolloutSettings(Section):
    PATH = "rollout"

    tree: bool = key(True, "AT-GRPO tree sampling (K branches per state, best branch continues); False: K "
                     "independent episodes per task")
    plain_grouping: str = key("task", 'without tree sampling: one group per "task" (every agent\'s sample at the '
                              'task\'s last turn, as the reference system), or per "task_agent" (each agent\'s last '
                              "sample of each episode)", choices=PLAIN_GROUPINGS)
    num_tasks: int = key(32, "tasks per training step (B)", check=positive)
    k: int = key(8, "branches (tree) or episodes (plain) per task: the group size K",
                 check=(lambda v: v >= 2, "{value}: a group of one sample has no reward variance, so every advantage "
                        "is 0 and nothing is learned; use k >= 2 (the paper: 8)"))
    max_turns: int = key(4, "turns per episode (T); every agent acts once per turn", check=positive)
    temperature: float = key(1.0, "sampling temperature in training (0: greedy; the update then scores at 1)",
                             check=non_negative)
    top_p: float = key(1.0, "nucleus sampling in training (1 = off)",
                       check=(lambda v: 0 < v <= 1, "must be in (0, 1], got {value}"))
    top_k: int = key(0, "top-k sampling in training (0 = off); one for all agents", check=non_negative)
    repetition_penalty: float = key(1.0, "vLLM's repetition penalty in training: logits of ids already in the "
                                    "prompt or the response divided by it where positive, multiplied where not (1 = "
                                    "off)", check=positive)
    max_prompt_len: int = key(4096, "prompt tokens kept (cut from the left)", check=positive)
    prompt_buckets: tuple = key((512, 1024, 2048, 4096), "padded prompt lengths (one compilation each); the last "
                                ">= max_prompt_len")
    max_new_tokens: int = key(2048, "response tokens per sample", check=positive)
    decode_slots: int = key(0, "rows one sampling call decodes at once (0: all, tasks x k); fewer bound the new "
                            "tokens' cache to slots x max_new_tokens, and a finished row's slot takes a waiting row "
                            "(continuous batching)", check=non_negative, resumable=True)  # never the math
    eval_temperature: float = key(0.0, "sampling temperature in evaluation (0 = greedy)", check=non_negative)
    eval_top_p: float = key(1.0, "nucleus sampling in evaluation (1 = off)",
                            check=(lambda v: 0 < v <= 1, "must be in (0, 1], got {value}"))
    eval_top_k: int = key(0, "top-k sampling in evaluation (0 = off); one for all agents", check=non_negative)
    eval_repetition_penalty: float = key(1.0, "repetition penalty in evaluation (1 = off)", check=positive)
    thinking: bool = key(False, "Qwen3's thinking mode (the chat template's enable_thinking); the paper's runs: off")
    agents: dict = key({}, "per agent: {name: {temperature, top_p, repetition_penalty, eval_temperature, "
                       "eval_top_p, eval_repetition_penalty, max_new_tokens, thinking}}, e.g. "
                       "--config.rollout.agents.reasoner.max_new_tokens=4096; unset keys: the rollout's")

    def check(self):
        b = self.prompt_buckets
        self.require(len(b) > 0 and all(isinstance(x, int) for x in b) and list(b) == sorted(b), "prompt_buckets",
                     "must be a non-empty increasing list")
        self.require(b[-1] >= self.max_prompt_len, "prompt_buckets",
                     f"largest bucket {b[-1]} < rollout.max_prompt_len {self.max_prompt_len}")
        for name, mine in self.agents.items():
            self.require(hasattr(mine, "keys") and set(mine) <= set(AGENT_KEYS), f"agents.{name}",
                         f"must set some of {AGENT_KEYS}, got {mine!r}")
            for evaluation in (False, True):
                s = self.agent(name, evaluation)
                self.require(s.temperature >= 0 and 0 < s.top_p <= 1 and s.repetition_penalty > 0
                             and s.max_new_tokens > 0, f"agents.{name}", "needs (eval_)temperature >= 0, "
                             "(eval_)top_p in (0, 1], (eval_)repetition_penalty > 0 and max_new_tokens > 0")

    def agent(self, name: str, evaluation: bool = False) -> AgentSampling:
        """Agent `name`'s sampling in training, or with `evaluation` the eval_* settings: rollout.* with
        rollout.agents.<name>'s keys."""
        mine = dict(self.agents.get(name, {}))
        pre = "eval_" if evaluation else ""
        get = lambda k: mine.get(k, getattr(self, k))  # noqa: E731
        return AgentSampling(float(get(pre + "temperature")), float(get(pre + "top_p")),
                             int(getattr(self, pre + "top_k")), int(get("max_new_tokens")), bool(get("thinking")),
                             float(get(pre + "repetition_penalty")))

    def longest_response(self) -> int:
        """The longest response any agent may give."""
        return max([self.max_new_tokens] + [int(a.get("max_new_tokens", 0)) for a in self.agents.values()])



@dataclasses.dataclass(frozen=True)
class SystemSettings(Section):
    """How a step's work is scheduled (atgrpo_jax/rollout/dispatch.py); all but staleness may change on resume:
    they change when work runs, not what it computes."""

    PATH = "system"

    schedule: str = key("sync", '"sync": each stage over all tasks in turn; "async": cohorts of tasks through one '
                        "sampling queue per policy and a pool of host workers, and the policies' updates at once "
                        "(same samples)", choices=SCHEDULES, resumable=True)
    cohorts: int = key(4, "async: the step's tasks move through their turns in this many independent cohorts",
                       check=positive, resumable=True)
    host_workers: int = key(4, "async: threads for environment steps (sandbox runs, grading, parsing)",
                            check=positive, resumable=True)
    staleness: int = key(0, "N >= 1: the rollouts of the next N steps are made while a step's update runs, with the "
                         "weights from before it; each rollout in N parts by turns, so an episode's later turns sample "
                         "with newer weights (partial rollouts, Samples.version records which), the oldest up to N "
                         "updates behind; the importance ratio is then taken against the sampler's log-probs. "
                         "0: exactly on-policy", check=non_negative)
    trace_every: int = key(0, "write trace/step_N.json (Chrome/Perfetto timeline) every this many steps",
                           check=non_negative, resumable=True)
    stage_timeout_s: float = key(1800.0, "stop the run when one stage (a sampling call, an environment step) runs "
                                 "longer than this many seconds, naming it (a hung device call or sandbox wait; 0 = "
                                 "no limit)", check=non_negative, resumable=True)

