"""The verl-style PyTorch baseline (`bench/torch_verl.py`) and the paper-width step's time model:
packing keeps every row's attention to itself, and the variants compute the eager loss."""
import numpy as np
import pytest

from atgrpo_jax.bench import device, device_parts, torch_verl
from atgrpo_jax.bench.torch_baseline import random_hf_model
from atgrpo_jax.bench.train import make_batch
from atgrpo_jax.models import get_preset

torch = pytest.importorskip("torch")


def test_packing_lists_the_valid_tokens_in_row_order_with_positions_restarting():
    valid = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], bool)
    index, pos = torch_verl.packed(valid)
    assert index.tolist() == [0, 1, 2, 4, 5, 8, 9, 10, 11]
    assert pos.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]


def test_a_packed_forward_equals_the_padded_one_row_by_row():
    cfg = get_preset("test-tiny")
    data = make_batch(cfg.vocab_size, 3, 48, seed=1)
    assert data["valid"].sum() < data["valid"].size  # some rows padded
    model = random_hf_model(cfg, torch.device("cpu")).eval()
    tokens, valid = torch.tensor(data["tokens"]).long(), torch.tensor(data["valid"]).long()
    index, pos = (torch.tensor(a) for a in torch_verl.packed(data["valid"]))
    with torch.no_grad():
        padded = model.model(input_ids=tokens, attention_mask=valid).last_hidden_state.reshape(-1, cfg.hidden_size)
        packed = model.model(input_ids=tokens.view(-1)[index][None], position_ids=pos[None],
                             use_cache=False).last_hidden_state[0]
    assert float((packed - padded[index]).abs().max()) < 1e-4


def test_the_paper_width_step_is_modelled_for_the_gpu_it_runs_on():
    got = {}
    device.modelled_step(device_parts.REAL, got.__setitem__, "NVIDIA H200")
    m = got["paper_step_modelled"]
    assert m["target"] == "h200" and m["sampling"] > 0 and m["update"] > 0
    assert m["total"] == pytest.approx(m["sampling"] + m["update"])
    assert m["assumptions"]["response_tokens"] == 512  # the run's budget: random weights never stop
    device.modelled_step(device_parts.REAL, got.__setitem__, "NVIDIA H100 80GB HBM3")
    assert got["paper_step_modelled"]["sampling"] > m["sampling"]  # less memory bandwidth
    device.modelled_step(device_parts.REAL, got.__setitem__, "cpu")
    assert "no modelled chip" in got["paper_step_modelled"]["error"]


@pytest.mark.full  # tiers.py: torch.compile of the model (~1 min on 2 cores); the packing tests cover the baseline
def test_every_variant_starts_from_the_eager_loss():
    got = {}
    torch_verl.torch_update(device_parts.TINY, got.__setitem__)
    eager = got["torch_eager"]["first_loss"]
    assert got["torch_compiled"]["first_loss"] == pytest.approx(eager, rel=1e-3)
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        assert "liger" in got["torch_verl"]["error"].lower()
    else:
        assert got["torch_verl"]["first_loss"] == pytest.approx(eager, rel=1e-2)  # bf16 LM head


def test_the_time_model_reproduces_the_paper_width_step_measured_on_an_h200():
    """plan/costing.py's constants come from this measurement: the model and the record stay together."""
    import json
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "device_results", "h200_2026-11-28.json")
    with open(path) as f:
        measured = json.load(f)["call_2"]["parts"]["paper_step"]["paper_step"]
    got = {}
    device.modelled_step(device_parts.REAL, got.__setitem__, "NVIDIA H200")
    m = got["paper_step_modelled"]
    assert m["sampling"] == pytest.approx(measured["sampling_seconds"], rel=0.05)
    assert m["update"] == pytest.approx(measured["update_seconds"], rel=0.05)
    assert m["total"] == pytest.approx(measured["step_seconds"], rel=0.05)
