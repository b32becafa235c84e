"""The memory planner against real shards, XLA's compiled memory analysis, and its CLI."""
import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from atgrpo_jax import plan as plan_cli
from atgrpo_jax.algo.logprobs import token_logprobs
from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.plan.devices import GiB, TPUS, parse_device
from atgrpo_jax.plan.memory import (abstract_mesh, kv_cache_bytes, local_bytes, model_params, param_bytes, plan,
                                    pool_mesh_sizes, sampling_memory, update_activations, update_memory)
from atgrpo_jax.sampling import decode, segments
from atgrpo_jax.sampling.cache import init_cache
from atgrpo_jax.sharding import MeshSettings, logical_sharding, make_mesh, sub_meshes
from atgrpo_jax.train.config import base_config
from atgrpo_jax.train.validate import resolve
from atgrpo_jax.bench.rows import rows_update
from atgrpo_jax.train.update import TrainState, make_optimizer, make_update_fns
from tiers import full_case
from tiny_config import tiny

TOLERANCE = 0.25

CONFIG_FILE = """
from atgrpo_jax.train.config import base_config

def get_config():
    c = base_config()
    c.model.preset = {preset!r}
    c.regime = {regime!r}
    return c
"""


def mesh_of(sizes):
    sizes = dict(zip(("data", "fsdp", "tensor"), sizes))
    return make_mesh(MeshSettings(**sizes), jax.devices()[:math.prod(sizes.values())])


def shard_bytes(x: jax.Array) -> int:
    return x.addressable_shards[0].data.nbytes


@pytest.fixture
def config_file(tmp_path):
    def write(preset="qwen3-1.7b", regime="shared"):
        path = tmp_path / f"{preset}_{regime}.py"
        path.write_text(CONFIG_FILE.format(preset=preset, regime=regime))
        return str(path)
    return write


def small_config(changes: dict | None = None, **model):
    """The tests' tiny config, planned: model keys, then `changes` ({dotted key: value})."""
    model = {f"model.{k}": v for k, v in {"preset": "test-tiny", "vocab_size": 0, **model}.items()}
    return resolve(tiny(**model, **{"rollout.num_tasks": 4, "rollout.k": 2, "rollout.max_new_tokens": 32,
                                    "optim.mini_batch_size": 8, "mesh.fsdp": -1, **(changes or {})}), weights=False)


# --- sizes against real arrays -------------------------------------------------------------

@pytest.mark.parametrize("sizes", [(1, 1, 1), (2, 2, 2), (1, 8, 1), (1, 4, 2)])
def test_param_bytes_equal_real_shards(sizes):
    cfg = get_preset("test-tiny")
    mesh = mesh_of(sizes)
    _, state = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    real = sum(shard_bytes(jax.device_put(np.zeros(v.shape, v.dtype), logical_sharding(mesh, v.logical_axes, v.shape)))
               for _, v in nnx.to_flat_state(state))
    assert param_bytes(model_params(cfg), abstract_mesh(dict(mesh.shape))) == real
    if sizes == (1, 1, 1):
        assert real == 4 * cfg.num_params()


@pytest.mark.parametrize("sizes,rows", [((1, 1, 1), 6), ((2, 2, 2), 8), ((1, 4, 2), 6)])
def test_kv_cache_bytes_equal_the_samplers_cache(sizes, rows):
    cfg = get_preset("test-tiny")
    mesh = mesh_of(sizes)
    with jax.set_mesh(mesh):
        cache = jax.jit(lambda: init_cache(cfg, rows, 40, "bfloat16"))()
    real = shard_bytes(cache.k) + shard_bytes(cache.v) + shard_bytes(cache.valid)
    assert kv_cache_bytes(cfg, abstract_mesh(dict(mesh.shape)), rows, 40, 2) == real


@pytest.mark.parametrize("slots", [0, 5])
def test_sampling_cache_equals_the_samplers_caches(slots):
    """The prompts' cache from prefill plus the decoded rows' caches (their new tokens; with
    continuous batching, each slot's copy of its prompt too), as the sampler allocates them."""
    cfg, tasks, k, prompt, new = get_preset("test-tiny"), 3, 4, 8, 6
    graphdef, weights = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    ids, mask = jnp.zeros((tasks, prompt), jnp.int32), jnp.ones((tasks, prompt), bool)
    pre = jax.eval_shape(lambda w: decode.prefill_jit(graphdef, w, ids, mask), weights)
    settings = decode.DecodeSettings(new, num_branches=k)
    stops, keys, budget = jnp.full((tasks, 1), -1), jax.random.split(jax.random.key(0), tasks * k), jnp.full(tasks, new)
    if slots:
        rows, _ = jax.eval_shape(lambda w, p: segments.empty_jit(graphdef, w, p, stops, keys, budget, slots=slots,
                                                                 settings=settings), weights, pre)
    else:
        rows, _ = jax.eval_shape(lambda w, p: decode.start_jit(graphdef, w, p, stops, keys, budget,
                                                               settings=settings), weights, pre)
    caches = [pre.cache, rows.own] + ([rows.prefix] if slots else [])
    real = sum(nbytes((c.k, c.v, c.valid)) for c in caches)
    planned = sampling_memory(cfg, abstract_mesh({"data": 1, "fsdp": 1, "tensor": 1}), tasks, k, prompt, new,
                              jnp.dtype(cfg.dtype).itemsize, decode_slots=slots)
    assert planned["kv_cache"] == real
    assert planned["decode_rows"] == (slots or tasks * k)
    assert planned["layer_weights"] == 0 and planned["decode_layer_kv"] > 0  # a CPU decodes rolled over the stacks


def nbytes(tree) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def test_per_layer_decode_memory_equals_the_samplers_copies():
    """Where decode steps run per layer (GPU and TPU by default): the per-layer weights sliced once per
    sampling call and the prompts' cache as prefill hands it over, as planned."""
    cfg = get_preset("test-tiny").replace(decode_unroll=2)  # every layer: per layer on this CPU too
    graphdef, weights = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    ids, mask = jnp.zeros((3, 8), jnp.int32), jnp.ones((3, 8), bool)
    pre = jax.eval_shape(lambda w: decode.prefill_jit(graphdef, w, ids, mask), weights)
    layers = jax.eval_shape(lambda w: decode.layer_weights_jit(graphdef, w), weights)
    mesh = abstract_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    planned = sampling_memory(get_preset("test-tiny"), mesh, 3, 2, 8, 6, 4, platform="gpu")
    assert pre.cache.layered and planned["prompt_cache"] == nbytes((pre.cache.k, pre.cache.v, pre.cache.valid))
    assert planned["layer_weights"] == nbytes(layers) > 0
    assert planned["decode_layer_kv"] == 0


@pytest.mark.parametrize("sizes", [(2, 2, 2), (1, 4, 2), (1, 8, 1), (1, 1, 8)])
def test_policy_pools_match_sub_meshes(sizes):
    mesh = mesh_of(sizes)
    expected = dict(sub_meshes(mesh, 2)[0].shape)
    assert pool_mesh_sizes(dict(zip(("data", "fsdp", "tensor"), sizes)), 8, 2) == expected


# --- against XLA's compiled memory analysis --------------------------------------------------

def abstract_params(cfg, mesh):
    """(graphdef, params as ShapeDtypeStructs sharded by their logical axes)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    params = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=logical_sharding(
        mesh, v.logical_axes, v.shape)), state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return graphdef, params


def abstract_state(cfg, mesh, tx):
    """The trainer's TrainState as sharded ShapeDtypeStructs."""
    graphdef, params = abstract_params(cfg, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, params)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    opt_state = jax.eval_shape(tx.init, params)
    opt_shardings = optax.tree_map_params(tx, lambda _, s: s, opt_state, shardings,
                                          transform_non_params=lambda _: replicated)
    opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), opt_state, opt_shardings)
    return graphdef, TrainState(params, opt_state, jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated))


def memory_total(m) -> int:
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def compiled_grad_bytes(cfg, batch, seq, chunk, sizes):
    """(argument + output + temp - alias, temp) of jit(grad(-mean log p)) for the model on a mesh."""
    mesh = mesh_of(sizes)
    graphdef, params = abstract_params(cfg, mesh)

    def loss(params, tokens, targets):
        model = nnx.merge(graphdef, params)
        positions = jnp.broadcast_to(jnp.arange(seq), tokens.shape)
        hidden, _ = model.hidden_states(tokens, positions)
        logp, _ = token_logprobs(hidden, model.head_weight(), targets, chunk)
        return -logp.mean()

    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=logical_sharding(mesh, ("batch", "seq"), (batch, seq)))
    with jax.set_mesh(mesh):
        fn = jax.jit(jax.grad(loss), out_shardings=jax.tree.map(lambda x: x.sharding, params))
        m = fn.lower(params, tok, tok).compile().memory_analysis()
    return memory_total(m), m.temp_size_in_bytes


# None of these shapes were used to read the working-set factors (atgrpo_jax/plan/memory.py).
@pytest.mark.parametrize("preset,batch,seq,chunk,remat,sizes", [  # the default tier: one case each (tiers.py)
    ("test-tiny", 6, 96, 64, False, (1, 1, 1)),
    full_case("bench-small", 4, 192, 256, False, (1, 2, 2)),
    full_case("bench-small", 8, 96, 128, True, (2, 2, 2)),
])
def test_update_memory_within_25_percent_of_compiled(preset, batch, seq, chunk, remat, sizes, xla_default_scheduler):
    if not xla_default_scheduler:
        return  # measured in a child process with XLA's default CPU scheduler (conftest.py)
    cfg = get_preset(preset, remat=remat)
    compiled, temp = compiled_grad_bytes(cfg, batch, seq, chunk, sizes)
    mesh = abstract_mesh(dict(zip(("data", "fsdp", "tensor"), sizes)))
    params = param_bytes(model_params(cfg), mesh)  # arguments; the gradients are outputs of the same size
    tokens = 2 * local_bytes((batch, seq), ("batch", "seq"), 4, mesh)
    activations = update_activations(cfg, mesh, batch, seq, chunk, remat)["total"]
    planned = 2 * params + tokens + activations
    assert abs(planned / compiled - 1) <= TOLERANCE, (planned, compiled)
    assert abs(activations / temp - 1) <= TOLERANCE, (activations, temp)


@pytest.mark.parametrize("preset,batch,width,chunk,remat,sizes", [
    ("bench-small", 4, 193, 256, True, (1, 1, 1)),
    full_case("test-tiny", 8, 129, 64, False, (1, 2, 2)),
])
def test_trainer_update_step_within_25_percent_of_compiled(preset, batch, width, chunk, remat, sizes, xla_default_scheduler):
    if not xla_default_scheduler:
        return  # measured in a child process with XLA's default CPU scheduler (conftest.py)
    """The trainer's own jitted update (loss, AdamW with clipping, donated state) against the plan."""
    cfg = get_preset(preset, remat=remat)
    mesh = mesh_of(sizes)
    tx, _ = make_optimizer(base_config().optim, 100)
    graphdef, state = abstract_state(cfg, mesh, tx)
    _, update_fn = make_update_fns(graphdef, nnx.State({}), tx, LossSettings(), chunk)
    rows = logical_sharding(mesh, ("batch", "seq"), (batch, width))
    arr = lambda dtype: jax.ShapeDtypeStruct((batch, width), dtype, sharding=rows)  # noqa: E731
    adv = jax.ShapeDtypeStruct((batch,), jnp.float32, sharding=logical_sharding(mesh, ("batch",), (batch,)))
    with jax.set_mesh(mesh):
        m = rows_update(update_fn).lower(state, (arr(jnp.int32), arr(bool), arr(bool), arr(jnp.float32), adv)).compile()
    compiled = memory_total(m.memory_analysis())
    amesh = abstract_mesh(dict(mesh.shape))
    params = model_params(cfg)
    resident = 3 * param_bytes(params, amesh)  # weights and two AdamW moments
    planned = resident + update_memory(cfg, amesh, params, batch, width, chunk)["total"]
    assert abs(planned / compiled - 1) <= TOLERANCE, (planned, compiled)


@pytest.mark.parametrize("sizes", [(1, 1, 1), full_case((1, 4, 2))])
def test_params_gradients_and_adamw_state_match_compiled(sizes, xla_default_scheduler):
    if not xla_default_scheduler:
        return  # measured in a child process with XLA's default CPU scheduler (conftest.py)
    """An AdamW step (state donated) holds parameters, both moments and the gradients."""
    cfg = get_preset("bench-small")
    mesh = mesh_of(sizes)
    opt = optax.adamw(1e-6, weight_decay=0.01)
    _, state = abstract_state(cfg, mesh, opt)
    shardings = jax.tree.map(lambda x: x.sharding, state.params)
    opt_shardings = jax.tree.map(lambda x: x.sharding, state.opt_state)

    def step(params, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    with jax.set_mesh(mesh):
        m = jax.jit(step, in_shardings=(shardings, opt_shardings, shardings),
                    out_shardings=(shardings, opt_shardings), donate_argnums=(0, 1)).lower(
            state.params, state.opt_state, state.params).compile().memory_analysis()
    config = small_config({"mesh.data": sizes[0], "mesh.fsdp": sizes[1], "mesh.tensor": sizes[2]},
                          preset="bench-small")
    p = plan(config, TPUS["v5p"], math.prod(sizes))
    assert abs((p.params + p.optimizer + p.gradients) / memory_total(m) - 1) <= 0.05


# --- the plan's logic --------------------------------------------------------------------------

def test_remat_batch_and_devices_move_activations_the_right_way():
    base = plan(small_config(), TPUS["v5p"], 1)
    assert plan(small_config(remat=True), TPUS["v5p"], 1).activations < base.activations
    bigger = small_config({"optim.mini_batch_size": 16})
    assert plan(bigger, TPUS["v5p"], 1).activations > base.activations
    assert plan(small_config(), TPUS["v5p"], 8).activations < base.activations
    assert base.activations == base.activations_no_remat and base.fits


def test_per_role_pools_halve_the_devices_per_policy():
    # 8 prompts: their cache is split over 8 devices as over 4 (4 would not split)
    shared = small_config({"rollout.num_tasks": 8})
    per_role = small_config({"rollout.num_tasks": 8, "policy.sharing": "per_role", "policy.pools": True})
    a, b = plan(shared, TPUS["v5p"], 8), plan(per_role, TPUS["v5p"], 8)
    assert (a.pool_mesh, b.pool_mesh) == ({"data": 1, "fsdp": 8, "tensor": 1}, {"data": 1, "fsdp": 4, "tensor": 1})
    on_four = plan(shared, TPUS["v5p"], 4)  # one pool of a per-role run is a shared run on 4 devices
    assert (b.params, b.kv_cache, b.peak) == (on_four.params, on_four.kv_cache, on_four.peak)
    assert b.params > 1.9 * a.params and b.kv_cache == 2 * a.kv_cache
    per_role = per_role.replace_at("policy.pools", False)  # both models on all 8 devices: twice a shared run's state, its KV cache
    c = plan(per_role, TPUS["v5p"], 8)
    assert c.pool_mesh == a.pool_mesh and (c.params, c.optimizer) == (2 * a.params, 2 * a.optimizer)
    assert c.kv_cache == a.kv_cache


def test_staleness_keeps_n_copies_of_the_trained_weights():
    """train/prefetch.py holds the weights each rollout in flight was made with: N copies at most."""
    on_policy = plan(small_config(), TPUS["v5p"], 1)
    for n in (1, 2):
        ahead = plan(small_config({"system.staleness": n}), TPUS["v5p"], 1)
        assert ahead.params == (1 + n) * on_policy.params and ahead.optimizer == on_policy.optimizer
        assert any("system.staleness" in note for note in ahead.notes)


def test_kl_reference_and_lora_change_what_is_resident():
    p = plan(small_config({"loss.kl_coef": 0.001}), TPUS["v5p"], 1)
    assert p.reference == p.params
    c = small_config({"policy.sharing": "lora", "lora.rank": 2})
    lora, full = plan(c, TPUS["v5p"], 1), plan(small_config(), TPUS["v5p"], 1)
    assert lora.gradients < full.gradients / 10 and lora.optimizer < full.optimizer / 10


def test_an_unrolled_update_on_a_gpu_plans_no_updates_tree():
    """Auto `sequence_unroll` unrolls the update's layers on GPUs only, where the compiled peak holds no
    second gradient-sized tree (plan.memory.update_memory); a rolled loop, or a TPU, keeps it."""
    gpu, _ = parse_device("gpu", 80)
    auto, rolled = plan(small_config(), gpu, 1), plan(small_config(sequence_unroll=1), gpu, 1)
    assert auto.updates == 0 and rolled.updates == rolled.gradients > 0
    assert rolled.update_peak - auto.update_peak == rolled.gradients
    tpu = plan(small_config(), TPUS["v5p"], 1)
    assert tpu.updates == tpu.gradients


@pytest.mark.parametrize("name,family,chips", [
    ("v5p-8", "v5p", 4), ("v5p-32", "v5p", 16), ("v4-8", "v4", 4), ("v5litepod-8", "v5e", 8),
    ("v6e-16", "v6e", 16), ("v6e", "v6e", 8), ("v5p", "v5p", 4)])
def test_parse_device(name, family, chips):
    device, n = parse_device(name)
    assert (device, n) == (TPUS[family], chips)


@pytest.mark.parametrize("name", ["v5p-8", "v5p-32", "v4-16", "v5litepod-8", "v5litepod-16", "v6e-8", "v6e-16",
                                  "v6e-32"])
def test_the_planner_and_the_compile_target_count_the_same_hosts(name):
    """A v6e-16 is four 4-chip hosts, not two of 8: the planner places a sampler copy per host as the
    compile (and Cloud TPU) does."""
    from atgrpo_jax.plan.devices import hosts_of
    from atgrpo_jax.plan.targets import parse_target

    device, chips = parse_device(name)
    target = parse_target(name)
    assert (chips, hosts_of(device, chips)) == (target.chips, target.hosts)
    assert hosts_of(target.planner_device(), target.chips) == target.hosts


def test_parse_device_gpu_and_errors():
    device, n = parse_device("gpu", 40)
    assert device.hbm_bytes == 40 * GiB and n == 8
    with pytest.raises(ValueError, match="unknown device 'tpu9'"):
        parse_device("tpu9")
    with pytest.raises(ValueError, match="gpu-memory-gb"):
        parse_device("gpu", 0)


def test_advice_lowers_the_peak_and_the_combination_fits(config_file, capsys):
    code = plan_cli.main(["plan", f"--config={config_file('qwen3-1.7b')}", "--device=v5p-8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == plan_cli.EXIT_DOES_NOT_FIT == 1  # a script can tell
    assert out["num_devices"] == 4 and out["pool_mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert not out["fits"] and out["peak"] > out["usable_bytes"]  # float32, no remat, 16 x 6144 tokens
    assert out["advice"] and all(a["peak"] < out["peak"] for a in out["advice"])
    assert any(a["overrides"] == {"model.remat": True} for a in out["advice"])
    combined = out["combined"]
    assert combined["fits"]
    config = plan_cli.with_overrides(resolve(base_config(), weights=False), {"model.preset": "qwen3-1.7b"} | {
        k: v for k, v in combined["overrides"].items() if k != "num_devices"})
    replanned = plan(config, TPUS["v5p"], combined["overrides"].get("num_devices", 4))
    assert replanned.fits and replanned.peak == combined["peak"]


def test_text_report_and_per_role_on_v5p_32(config_file, capsys):
    """Per-role models on their own pools of a 4-host slice: each pool keeps every host's data row
    (mesh.data 0: one per host), the trained state split over the pool's 8 chips."""
    args = ["plan", f"--config={config_file('qwen3-8b', 'per_role')}", "--device=v5p-32",
            "--config.model.remat=True", "--config.model.compute_dtype=bfloat16"]
    code = plan_cli.main(args + ["--config.policy.pools=True"])
    text = capsys.readouterr().out
    assert code == 0
    assert "16 x TPU v5p" in text and "per policy pool: data=4 fsdp=2 tensor=1" in text
    assert "FITS" in text and "2 policies" in text and "split over all 8 devices" in text
    code = plan_cli.main(args)  # both models on the whole mesh: twice the state per chip
    text = capsys.readouterr().out
    assert code == 0 and "mesh: data=4 fsdp=4 tensor=1" in text and "2 models" in text


@pytest.mark.parametrize("args,message", [
    (["--device=v5p"], "--config=configs/X.py is required"),
    (["--config={cfg}", "--config.optim.lr=-1.0"], "config.optim.lr"),
    (["--config={cfg}", "--config.mesh.data=3", "--num-devices=8"], "not a multiple of 3"),
    (["--config={cfg}", "--device=tpu9"], "unknown device"),
    (["--config={cfg}", "--bogus=1"], "bogus"),
])
def test_cli_errors_are_clear(config_file, capsys, args, message):
    cfg = config_file()
    code = plan_cli.main(["plan"] + [a.format(cfg=cfg) for a in args])
    assert code == 2 and message in capsys.readouterr().err


def test_module_entry_point_reads_overrides(config_file):
    out = subprocess.run([sys.executable, "-m", "atgrpo_jax.plan", f"--config={config_file('qwen3-0.6b')}",
                          "--device=gpu", "--gpu-memory-gb=24", "--num-devices=2",
                          "--config.optim.mini_batch_size=2", "--config.model.remat=True", "--json"],
                         capture_output=True, text=True, timeout=120)
    p = json.loads(out.stdout)
    assert out.returncode == (0 if p["fits"] else 1), out.stderr  # 1: it does not fit
    assert p["mini_batch"] == 2 and p["num_devices"] == 2 and p["hbm_bytes"] == 24 * GiB
    assert p["activations"] == p["activations_remat"]

