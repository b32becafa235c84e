"""Hub ids (`org/name[@revision]`) offline, against a cache laid out as huggingface_hub lays it out."""
import os

import numpy as np
import pytest

from atgrpo_jax.models.hf_io import CheckpointError
from atgrpo_jax.models.hub_ids import local_model_dir, parse_hub_id
from hf_fixtures import make_hf_checkpoint

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """HF_HUB_CACHE with models--tiny-org--tiny-qwen3: refs/main -> snapshots/SHA (a tiny Qwen3)."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--tiny-org--tiny-qwen3"
    snapshot = repo / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    model = make_hf_checkpoint(snapshot, layers=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    return cache, snapshot, model


@pytest.fixture
def offline_cache(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache[0]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def test_hub_ids_are_told_from_paths(tmp_path):
    assert parse_hub_id("Qwen/Qwen3-1.7B") == ("Qwen/Qwen3-1.7B", None)
    assert parse_hub_id("Qwen/Qwen3-1.7B@v1.0") == ("Qwen/Qwen3-1.7B", "v1.0")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    os.chdir(tmp_path)
    for local in ("org/name", "./models/x", "/abs/dir", "gs://bucket/x", "models/a/b", ""):
        assert parse_hub_id(local) is None, local
    assert local_model_dir("org/name") == "org/name"  # an existing directory wins over a hub id


def test_offline_resolves_the_cache_by_ref_and_by_commit(offline_cache):
    _, snapshot, _ = offline_cache
    assert local_model_dir("tiny-org/tiny-qwen3") == str(snapshot)
    assert local_model_dir(f"tiny-org/tiny-qwen3@{SHA}") == str(snapshot)


def test_offline_missing_is_one_line_naming_the_download(offline_cache):
    with pytest.raises(CheckpointError) as e:
        local_model_dir("tiny-org/tiny-qwen3@v2")
    msg = str(e.value)
    assert "\n" not in msg and "model.hf_path='tiny-org/tiny-qwen3@v2'" in msg and "HF_HUB_OFFLINE=1" in msg
    assert "hf download tiny-org/tiny-qwen3 --revision v2" in msg
    with pytest.raises(CheckpointError, match="hf download other-org/absent`"):
        local_model_dir("other-org/absent")


def test_the_trainer_builds_the_model_from_a_hub_id(offline_cache):
    import jax
    from atgrpo_jax.sharding import make_mesh
    from atgrpo_jax.train.config import base_config
    from atgrpo_jax.train.setup import build_model

    c = base_config()
    c.model.update(hf_path="tiny-org/tiny-qwen3", preset="")
    model = build_model(c, make_mesh(dict(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1]))
    torch_model = offline_cache[2]
    want = torch_model.model.embed_tokens.weight.detach().numpy()
    assert np.allclose(np.asarray(model.embed.value), want)


def test_evaluate_hf_path_offline_fails_in_one_line(offline_cache, tmp_path, capsys):
    import types

    from atgrpo_jax import cli, evaluate

    values = dict(config=os.path.join(ROOT, "configs", "demo.py"), checkpoint=None, hf_path="tiny-org/not-downloaded",
                  splits=[], tasks=None, k=None, temperature=None, out=str(tmp_path), policies=[])
    flags = types.SimpleNamespace(**{k: types.SimpleNamespace(value=v) for k, v in values.items()})
    with pytest.raises(SystemExit) as e, cli.fail():  # as cli.command runs it
        evaluate.main(flags)
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith(
        "error: --hf_path='tiny-org/not-downloaded': no such directory, and as a hub id: not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE=1: run `hf download tiny-org/not-downloaded`" in lines[0]


def test_load_pretrained_takes_a_hub_id(offline_cache):
    from atgrpo_jax.models.hf_io import load_pretrained

    model = load_pretrained("tiny-org/tiny-qwen3")
    assert np.allclose(np.asarray(model.embed.value), offline_cache[2].model.embed_tokens.weight.detach().numpy())
