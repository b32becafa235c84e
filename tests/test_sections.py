"""Typed config sections (atgrpo_jax/typed_config.py): each key checked where it is defined, the config
converted once, its reference and resumable keys made from the fields."""
import dataclasses

import pytest

from atgrpo_jax.errors import ConfigError
from atgrpo_jax.train.config import RESUMABLE, Config, base_config
from atgrpo_jax.train.config_docs import config_docs


def test_the_file_format_and_the_typed_config_agree():
    c = Config.from_mapping(base_config())
    assert c == Config() and c.to_dict() == Config().to_dict()
    assert [k for k, _, _ in config_docs() if "." not in k][:3] == ["model", "tokenizer", "char_alphabet"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.rollout.k = 4  # what a run reads cannot change under it


@pytest.mark.parametrize("key,value,message", [
    ("rollout.k", "8", "config.rollout.k: must be an int, got '8'"),
    ("rollout.k", True, "config.rollout.k: must be an int, got True"),
    ("optim.lr", float("inf"), "config.optim.lr: must be a finite number, got inf"),
    ("optim.schedule", "cosin", "config.optim.schedule: unknown 'cosin' (did you mean 'cosine'?)"),
    ("loss.aggregation", "sum", "config.loss.aggregation: unknown 'sum'"),
    ("model.remat", 1, "config.model.remat: must be True or False, got 1"),
    ("reference.lr_schedule", "yes", "config.reference.lr_schedule: must be True, False or None"),
    ("rollout.top_p", 0.0, "config.rollout.top_p: must be in (0, 1], got 0.0"),
])
def test_a_bad_value_is_named_by_the_section_that_owns_it(key, value, message):
    with pytest.raises(ConfigError) as e:
        Config().replace_at(key, value)
    assert str(e.value).startswith(message)


def test_an_unknown_key_names_the_closest():
    d = base_config().to_dict()
    d["rollout"]["num_task"] = 8
    with pytest.raises(ConfigError, match=r"config.rollout.num_task: not a key of this version \(did you mean "
                                          r"'num_tasks'\?\)"):
        Config.from_mapping(d)


def test_resumable_keys_come_from_the_fields():
    assert {"train.steps", "train.eval_every", "model.decode_unroll", "mesh.", "distributed.", "sft."} <= set(RESUMABLE)
    assert not any(k.startswith(("train.seed", "rollout.k", "optim.", "loss.", "system.staleness")) for k in RESUMABLE)
