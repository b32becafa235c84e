"""The config's `sft` section (atgrpo_jax/sections.py): the supervised warm start's own keys. A `train`
run does not read them, so it may resume with any."""
from __future__ import annotations

import dataclasses

from atgrpo_jax.sections import Section, key, non_negative, positive


@dataclasses.dataclass(frozen=True)
class SftSettings(Section):
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
