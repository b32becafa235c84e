"""The sampler benchmark's optional Tunix baseline: the --tunix flag without Tunix (an error for
`on`, one line for `auto`), the pure config mapping and id tokenizer, and, where google-tunix is
installed, a real run on the tiny model (same weights checked by logits, every row all new tokens)."""
import importlib.util
import json

import numpy as np
import pytest

from atgrpo_jax.bench import sampler as bench
from atgrpo_jax.bench import tunix_baseline as tb
from atgrpo_jax.models import get_preset
from atgrpo_jax.models.hf_io import config_to_hf

TINY = ["--configs", "test-tiny", "--no-torch", "--batch", "2", "--prompt", "8", "--new", "4",
        "--branches", "2", "--repeats", "1", "--json"]


def test_available_is_false_without_the_package():
    assert isinstance(tb.available(), bool)
    if importlib.util.find_spec("tunix") is None:
        assert not tb.available() and tb.missing_message() == tb.NOT_INSTALLED


def test_tunix_on_without_tunix_is_an_error_before_any_work(monkeypatch, capsys):
    monkeypatch.setattr(tb, "available", lambda: False)
    assert bench.main(TINY + ["--tunix", "on"]) == 2
    out = capsys.readouterr()
    assert "tunix: not installed (pip install google-tunix)" in out.err
    assert "machine:" not in out.out  # nothing was measured


def test_tunix_on_with_longtail_lengths_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(TINY + ["--tunix", "on", "--lengths", "longtail"])
    assert e.value.code == 2 and "--lengths=fixed only" in capsys.readouterr().err


@pytest.mark.parametrize("flag,installed", [("auto", False), ("off", False), ("auto", True), ("off", True),
                                             ("on", True)])
def test_the_flag_decides_whether_tunix_runs(monkeypatch, capsys, flag, installed):
    monkeypatch.setattr(tb, "available", lambda: installed)
    monkeypatch.setattr(bench, "matmul_peak", lambda *a, **k: 1e9)
    monkeypatch.setattr(bench, "report", lambda r: None)
    runs = []
    monkeypatch.setattr(bench, "bench_config", lambda name, args, peak: runs.append(args.tunix_run) or {})
    assert bench.main(TINY + ["--tunix", flag]) == 0
    assert runs == [installed and flag != "off"]
    said = "tunix: not installed (pip install google-tunix)" in capsys.readouterr().out.splitlines()
    assert said == (flag == "auto" and not installed)


def test_without_tunix_the_fixed_lengths_bench_runs_as_before(monkeypatch, capsys):
    monkeypatch.setattr(tb, "available", lambda: False)
    monkeypatch.setattr(bench, "matmul_peak", lambda *a, **k: 1e9)  # (not what this test is about: quicker)
    monkeypatch.setattr(bench, "selection_costs", lambda *a: {})
    assert bench.main(TINY + ["--tunix", "auto"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "tunix: not installed (pip install google-tunix)" in lines
    (r,) = json.loads(lines[-1])["results"]
    assert r["ours_tokens_per_s"] > 0 and not any("tunix" in k for k in r)


def test_tunix_config_follows_the_hf_config_of_our_checkpoint():
    for name in ("bench-small", "bench-qwen-like", "qwen3-0.6b", "test-tiny"):
        cfg = get_preset(name)
        kw, hf = tb.model_config_kwargs(cfg), config_to_hf(cfg)
        assert (kw["num_layers"], kw["vocab_size"], kw["embed_dim"], kw["hidden_dim"]) == (
            hf["num_hidden_layers"], hf["vocab_size"], hf["hidden_size"], hf["intermediate_size"])
        assert (kw["num_heads"], kw["num_kv_heads"], kw["head_dim"], kw["norm_eps"], kw["use_tied_embedding"]) == (
            hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"], hf["rms_norm_eps"],
            hf["tie_word_embeddings"])
        assert kw["rope_theta"] == hf["rope_theta"] and kw["dtype"] == kw["param_dtype"] == np.float32
    with pytest.raises(ValueError, match="theta"):  # Tunix would silently use 1e6
        tb.model_config_kwargs(get_preset("test-tiny", rope_theta=10_000.0))
    with pytest.raises(ValueError, match="LoRA"):
        tb.model_config_kwargs(get_preset("test-tiny", lora_rank=4))


def test_id_tokenizer_is_one_to_one_and_never_stops():
    tok = tb.IdTokenizer()
    rows = np.array([[5, 0, 511], [7, 7, 1]], np.int32)
    texts = tok.prepare(rows)
    assert texts == ["5 0 511", "7 7 1"]
    assert [tok.encode(t) for t in texts] == rows.tolist() and tok.encode("3 4") == [3, 4]
    assert [tok.decode(tok.encode(t)) for t in texts] == texts
    assert tok.eos_id() == tok.pad_id() == tb.NO_ID < 0 and not tok.bos_id()  # no id a model samples


@pytest.mark.skipif(not tb.available(), reason="google-tunix is not installed (optional baseline)")
def test_tunix_run_on_the_same_weights(monkeypatch, capsys):
    monkeypatch.setattr(bench, "matmul_peak", lambda *a, **k: 1e9)
    monkeypatch.setattr(bench, "selection_costs", lambda *a: {})
    assert bench.main(TINY + ["--tunix", "on"]) == 0
    (r,) = json.loads(capsys.readouterr().out.splitlines()[-1])["results"]
    assert r["tunix_logit_max_diff"] <= 1e-4 and r["tunix_tokens_per_s"] > 0
    assert r["speedup_vs_tunix"] == pytest.approx(r["tunix_seconds"] / r["ours_seconds"])
    # other weights are caught before any timing
    import tempfile

    from flax import nnx

    from atgrpo_jax.models import Qwen3
    from atgrpo_jax.models.hf_io import save_pretrained
    cfg = get_preset("test-tiny")
    ours, other = Qwen3(cfg, rngs=nnx.Rngs(0)), Qwen3(cfg, rngs=nnx.Rngs(1))
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(other, tmp)
        theirs = tb.load_model(cfg, tmp)
    with pytest.raises(RuntimeError, match="disagree"):
        tb.run(theirs, ours, np.ones((2, 8), np.int32), 4, 1)
