"""export's model card (atgrpo_jax/model_card.py) and --push_to_hub."""
import json
import re
import types

import pytest
import yaml

from atgrpo_jax import cli, export
from atgrpo_jax.model_card import model_card
from atgrpo_jax.train.config import base_config, flat
from atgrpo_jax.train.validate import resolve

METRICS = [{"step": 0, "eval_success": 0.0, "loss": None}, {"step": 5, "loss": 0.1},
           {"step": 10, "eval_success": 0.4, "eval/test/avg@1": 0.4}, {"step": 20, "eval_success": 0.9}]


def card(hf_path, regime, adapter=False, step=15):
    c = base_config()
    c.model.update(hf_path=hf_path, preset="")
    c.env.workflow = "prompt_reward"
    c.regime = regime
    c = resolve(c, weights=False)
    text = model_card(c, step=step, policy="policy", adapter=adapter, metrics=METRICS, agents=["solver", "checker"])
    front, body = re.match(r"---\n(.*?)\n---\n(.*)", text, re.S).groups()
    return c, yaml.safe_load(front), body


def test_the_card_has_the_hubs_front_matter_the_results_and_the_config():
    c, front, body = card("Qwen/Qwen3-1.7B@main", "per_role")
    assert front["base_model"] == "Qwen/Qwen3-1.7B" and front["license"] == "apache-2.0"
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "text-generation"
    assert {"atgrpo-jax", "at-grpo", "multi-agent", "prompt_reward"} <= set(front["tags"])
    assert "| regime | `per_role` |" in body and "| steps | 15 of 200" in body
    # the last evaluation at or before the exported step (15): step 10's, not step 20's
    assert "## Held-out results (step 10)" in body and "| `eval/test/avg@1` | 0.4 |" in body
    assert "| `eval_success` | 0.9 |" not in body
    config = json.loads(re.search(r"```json\n(.*?)```", body, re.S).group(1))
    assert config == json.loads(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in flat(c).items()},
                                           default=str))


def test_a_local_base_has_no_base_model_and_an_adapter_is_peft(tmp_path):
    _, front, body = card(str(tmp_path), "plain_grpo", adapter=True, step=3)
    assert "base_model" not in front and "license" not in front
    assert front["library_name"] == "peft" and {"lora", "plain-grpo"} <= set(front["tags"])
    assert "| regime | `plain_grpo` |" in body and "## Held-out results (step 0)" in body


def flags(**values):
    names = ("checkpoint", "out", "step", "policy", "lora", "overwrite", "push_to_hub")
    return types.SimpleNamespace(**{n: types.SimpleNamespace(value=values.get(n)) for n in names})


@pytest.mark.parametrize("repo, message", [
    ("me/my-model", r"--push_to_hub=me/my-model: HF_HUB_OFFLINE=1, so nothing can be uploaded"),
    ("not a repo", r"--push_to_hub=not a repo: give a Hugging Face repository id, org/name"),
])
def test_push_is_refused_in_one_line_before_any_work(tmp_path, capsys, repo, message):
    # (the checkpoint does not exist: the refusal comes first)
    with pytest.raises(SystemExit) as e, cli.fail():  # as cli.command runs it
        export.main(flags(checkpoint=str(tmp_path / "no_run"), out=str(tmp_path / "o"), push_to_hub=repo))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "o").exists()


def test_push_uploads_the_directory(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    class FakeApi:
        def create_repo(self, repo, exist_ok):
            calls.append(("create", repo, exist_ok))

        def upload_folder(self, folder_path, repo_id, commit_message):
            calls.append(("upload", folder_path, repo_id))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    assert export.push(str(tmp_path), "me/my-model") == "https://huggingface.co/me/my-model"
    assert calls == [("create", "me/my-model", True), ("upload", str(tmp_path), "me/my-model")]
