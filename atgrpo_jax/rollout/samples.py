"""What a rollout produces and the update consumes: dense arrays of samples, grouped, with their ids.

A sample is one agent's response at one turn of one task, on one branch. G groups of
K samples each (group g = (task[g], agent[g], turn[g]) in tree sampling) are stored as
padded arrays, as the sampler returns them: token ids right-padded with 0, lengths
beside them. Each prompt is stored once and each sample names its prompt (`prompt_of`): a
tree group's K samples name one, plain GRPO's samples one each. The group and prompt ids
travel with every sample (as verl's `index`), so the trainer never has to find them again.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class SampleOut:
    """What a sample function returns: K responses for each of B prompts (row b*K + k)."""

    tokens: np.ndarray  # [B*K, R] int32 response ids (stop token included), 0 after each row's length
    lengths: np.ndarray  # [B*K] int32
    logprobs: np.ndarray  # [B*K, R] float32 sampler log-probs, 0 after each row's length
    texts: list[str]  # B*K decoded responses

    @classmethod
    def from_rows(cls, tokens: np.ndarray, lengths: np.ndarray, logprobs: np.ndarray, texts: list[str],
                  width: int) -> "SampleOut":
        """From [N, <= width] arrays whose entries past each row's length may hold anything."""
        lengths = np.asarray(lengths, np.int32)
        keep = np.arange(width)[None, :] < lengths[:, None]
        return cls(np.where(keep, _fit(tokens, width, np.int32), 0), lengths,
                   np.where(keep, _fit(logprobs, width, np.float32), np.float32(0)), list(texts))


    def rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ids, log-probs) of each row, cut to its length."""
        return [(t[:n], lp[:n]) for t, lp, n in zip(self.tokens, self.logprobs, self.lengths)]


def _fit(x, width: int, dtype) -> np.ndarray:
    """[N, any] -> [N, width]: cut or right-padded with zeros."""
    x = np.asarray(x, dtype)[:, :width]
    return np.pad(x, ((0, 0), (0, width - x.shape[1])))


@dataclasses.dataclass
class Samples:
    """G groups of K samples (dense); `mask` marks the samples that exist (their task was live)."""

    prompt: np.ndarray  # [Q, P] int32, right-padded with 0: every prompt once
    prompt_len: np.ndarray  # [Q] int32
    prompt_of: np.ndarray  # [G, K] int: the prompt (row of `prompt`) each sample answers
    response: np.ndarray  # [G, K, R] int32, right-padded with 0
    response_len: np.ndarray  # [G, K] int32
    sampler_logp: np.ndarray  # [G, K, R] float32, 0 past each response
    reward: np.ndarray  # [G, K] float32: local + alpha * team
    local_reward: np.ndarray  # [G, K] float32: the acting agent's own reward
    team_reward: np.ndarray  # [G, K] float32: the team's (environment's) reward
    mask: np.ndarray  # [G, K] bool
    task: np.ndarray  # [G] the task's position in the step's task list
    agent: np.ndarray  # [G] the agent of the group's samples (-1: several, see sample_agent)
    sample_agent: np.ndarray  # [G, K] the agent of each sample (it routes the sample to its policy)
    turn: np.ndarray  # [G] (-1: the last turn each episode reached, plain GRPO)
    text: np.ndarray  # [G, K] object: the decoded responses
    parsed_as: np.ndarray  # [G, K] object: what the environment read from each response (or why nothing)
    selected: np.ndarray  # [G] the branch the episode continued from (-1: none, plain GRPO)
    # [G, K] int: the optimizer step of the weights that sampled each sample (-1: not known). With
    # system.staleness >= 2 one episode's turns may come from different weights (a partial rollout).
    version: np.ndarray
    reward_parts: np.ndarray  # [G, K] object: each sample's reward by part (a dict), or None where not said
    # [G, K] float32: the reward with the team's outcome at the end of the turn, the turn's later agents'
    # chosen responses replayed on this sample's own branch (rollout/counterfactual.py); None: `reward`
    counterfactual_reward: np.ndarray | None = None

    def __post_init__(self):
        if self.counterfactual_reward is None:
            self.counterfactual_reward = self.reward

    @classmethod
    def empty(cls, k: int) -> "Samples":
        z = lambda *shape, dtype=np.int32: np.zeros(shape, dtype)
        f = lambda: z(0, k, dtype=np.float32)
        return cls(z(0, 0), z(0), z(0, k), z(0, k, 0), z(0, k), z(0, k, 0, dtype=np.float32), f(), f(), f(),
                   z(0, k, dtype=bool), z(0), z(0), z(0, k), z(0), z(0, k, dtype=object), z(0, k, dtype=object), z(0),
                   z(0, k), z(0, k, dtype=object))

    @property
    def num_groups(self) -> int:
        return len(self.task)

    def sample_prompt_len(self) -> np.ndarray:
        """[G, K]: the length of each sample's prompt."""
        return self.prompt_len[self.prompt_of]

    def prompt_ids(self, g: int, k: int) -> np.ndarray:
        """The prompt token ids of sample (g, k)."""
        q = self.prompt_of[g, k]
        return self.prompt[q, :self.prompt_len[q]]

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """(group, branch) indices of the samples that exist and have a response, group-major."""
        return np.nonzero(self.mask & (self.response_len > 0))

    def take(self, groups: np.ndarray) -> "Samples":
        """The given groups, in the given order (the prompts stay: the samples name them)."""
        groups = np.asarray(groups, np.int64)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return Samples(**{k: (v if k in PROMPT_FIELDS else v[groups]) for k, v in fields.items()})


def pad_to(x: np.ndarray, width: int, axis: int = -1) -> np.ndarray:
    """`x` right-padded with zeros along `axis` to `width`."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, width - x.shape[axis])
    return np.pad(x, pad)


def right_padded(seqs: Sequence[np.ndarray], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ragged int sequences -> ([N, width] right-padded with 0, lengths [N])."""
    lengths = np.array([len(s) for s in seqs], np.int32)
    width = int(lengths.max(initial=0)) if width is None else width
    out = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out, lengths


PROMPT_FIELDS = ("prompt", "prompt_len")  # indexed by prompt, not by group


def concat(parts: Sequence[Samples]) -> Samples:
    """Groups of several `Samples` one after another (prompts and responses padded to the widest)."""
    if not parts:
        raise ValueError("nothing to concatenate")
    p = max(s.prompt.shape[1] for s in parts)
    r = max(s.response.shape[2] for s in parts)
    cat = lambda name, width=None: np.concatenate(
        [getattr(s, name) if width is None else pad_to(getattr(s, name), width) for s in parts])
    first = np.cumsum([0] + [len(s.prompt) for s in parts[:-1]])  # each part's prompts follow the earlier ones'
    prompt_of = np.concatenate([s.prompt_of + q for s, q in zip(parts, first)])
    return Samples(cat("prompt", p), cat("prompt_len"), prompt_of, cat("response", r), cat("response_len"),
                   cat("sampler_logp", r), cat("reward"), cat("local_reward"), cat("team_reward"), cat("mask"),
                   cat("task"), cat("agent"), cat("sample_agent"), cat("turn"), cat("text"), cat("parsed_as"),
                   cat("selected"), cat("version"), cat("reward_parts"), cat("counterfactual_reward"))
