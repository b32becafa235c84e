"""`bench sampler --dtype`: both sides run the dtype asked for (the bfloat16 comparison is only fair
when transformers gets bfloat16 too)."""
import json

import jax
import torch
from flax import nnx

from atgrpo_jax.bench import sampler
from atgrpo_jax.models import get_preset


def test_both_sides_are_built_in_the_dtype_asked_for(tmp_path):
    cfg = get_preset("demo-tiny", compute_dtype="bfloat16", param_dtype="bfloat16")
    ours, theirs = sampler.make_models(cfg, 0, str(tmp_path))
    assert {str(x.dtype) for x in jax.tree.leaves(nnx.state(ours, nnx.Param))} == {"bfloat16"}
    assert theirs.dtype == torch.bfloat16


def test_the_bfloat16_run_reports_its_dtype(capsys):
    assert sampler.main(["--configs", "demo-tiny", "--batch", "2", "--prompt", "8", "--new", "4", "--repeats", "1",
                         "--dtype", "bfloat16", "--tunix", "off", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["dtype"] == "bfloat16" and out["results"][0]["speedup"] > 0
