"""Bad checkpoints fail with an error that names the tensor or field."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from atgrpo_jax.models.hf_io import CheckpointError, load_pretrained
from hf_fixtures import make_hf_checkpoint


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    make_hf_checkpoint(path, layers=1)
    return path


def copy_with(tmp_path, good, *, edit_tensors=None, edit_config=None):
    tensors = load_file(str(good / "model.safetensors"))
    config = json.loads((good / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_good_checkpoint_loads(good):
    assert load_pretrained(str(good)).cfg.num_layers == 1


def test_missing_tensor(tmp_path, good):
    path = copy_with(tmp_path, good, edit_tensors=lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing.*model\.layers\.0\.self_attn\.k_proj\.weight"):
        load_pretrained(path)


def test_misshapen_tensor(tmp_path, good):
    def shrink(t):
        t["model.layers.0.mlp.up_proj.weight"] = np.zeros((95, 64), np.float32)

    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.up_proj\.weight has shape \(95, 64\)"):
        load_pretrained(copy_with(tmp_path, good, edit_tensors=shrink))


def test_extra_tensor(tmp_path, good):
    def add(t):
        t["model.layers.1.mlp.up_proj.weight"] = np.zeros((96, 64), np.float32)

    with pytest.raises(CheckpointError, match=r"unexpected.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_pretrained(copy_with(tmp_path, good, edit_tensors=add))


@pytest.mark.parametrize("field,value,pattern", [
    ("architectures", ["LlamaForCausalLM"], "architectures"),
    ("model_type", "qwen2", "model_type"),
    ("attention_bias", True, "attention_bias"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling"),
    ("some_new_feature", 1, "some_new_feature"),
])
def test_unsupported_config(tmp_path, good, field, value, pattern):
    path = copy_with(tmp_path, good, edit_config=lambda c: c.update({field: value}))
    with pytest.raises(CheckpointError, match=pattern):
        load_pretrained(path)


def test_missing_config_field(tmp_path, good):
    path = copy_with(tmp_path, good, edit_config=lambda c: c.pop("num_key_value_heads"))
    with pytest.raises(CheckpointError, match="num_key_value_heads"):
        load_pretrained(path)


def test_no_weights(tmp_path, good):
    (tmp_path / "config.json").write_text((good / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_pretrained(str(tmp_path))


def test_truncated_file_names_the_file(tmp_path, good):
    path = copy_with(tmp_path, good)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])  # an interrupted download
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file .* download it again"):
        load_pretrained(path)


def test_checkpoint_of_another_architecture_names_the_field(good):
    from atgrpo_jax.models.model_config import get_preset

    with pytest.raises(CheckpointError, match=r"has num_layers=1, but model.preset='test-tiny' has 2"):
        load_pretrained(str(good), expected=get_preset("test-tiny", vocab_size=256, hidden_size=64,
                                                       intermediate_size=96), expected_name="model.preset='test-tiny'")
