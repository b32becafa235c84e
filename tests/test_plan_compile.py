"""`python -m atgrpo_jax.plan --compile=TARGET`: a small config's training step compiled for TPU
topologies on this CPU (libtpu describes the chips; nothing runs), checked against the planner,
the sharding's intent and the report's promises."""
import json
import os
import re

import jax
import pytest

from atgrpo_jax import cli
from atgrpo_jax.plan import main as plan_main
from atgrpo_jax.plan.compiled import COLLECTIVES, analyze, collectives
from atgrpo_jax.plan.programs import step_programs
from atgrpo_jax.plan.targets import parse_target
from atgrpo_jax.train.validate import resolve

# Programs of two topologies with the same local devices share a persistent-cache key; reading back an
# executable compiled for devices this process only describes fails, and JAX compiles it again.
pytestmark = pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
ROOT = os.path.join(os.path.dirname(__file__), "..")
DEMO = os.path.join(ROOT, "configs", "demo.py")
# The demo's task with a model large enough to split (bench-small: 7.3M, vocab 8192) over 4 chips.
SMALL = ["--config.model.preset=bench-small", "--config.model.vocab_size=0", "--config.rollout.max_new_tokens=64",
         "--config.rollout.k=4", "--config.optim.mini_batch_size=16", "--config.mesh.data=0", "--config.mesh.fsdp=-1",
         "--config.model.param_dtype=bfloat16", "--config.model.compute_dtype=bfloat16"]


def config_of(*overrides):
    parsed, _ = cli.pop_overrides(["plan", *overrides])
    return resolve(cli.config_from_args(DEMO, parsed), weights=False)


def verdict(err: str) -> list[str]:
    """stderr of plan --compile without its progress lines (one as each program starts and ends compiling)."""
    return [line for line in err.strip().splitlines() if not PROGRESS.fullmatch(line)]


PROGRESS = re.compile(r"compiling .+|  compiled .+ in \d+ s")


def report(capsys, *args):
    code = plan_main(["plan", f"--config={DEMO}", *args, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out.strip().splitlines()[-1]), out.err


def test_one_host_fits_agrees_with_the_planner_and_gathers_weights_for_the_update(capsys):
    code, r, err = report(capsys, "--compile=v5p:2x2x1", *SMALL)
    assert code == 0 and r["fits"] and (r["target"], r["chips"], r["hosts"]) == ("v5p:2x2x1", 4, 1)
    progress = err.strip().splitlines()  # a line as each program starts compiling and one as it ends
    assert "compiling update of policy for v5p:2x2x1" in progress, progress
    assert any(re.fullmatch(r"  compiled update of policy in \d+ s", line) for line in progress), progress
    assert r["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    names = [p["name"] for p in r["programs"]]
    assert names == ["prefill", "decode segment", "old log-probs", "update"]
    for p in r["programs"]:
        assert set(p) >= {"name", "pool", "compiled_peak_bytes", "planned_peak_bytes", "hbm_bytes", "flops",
                          "bytes_accessed", "collectives", "modelled_s"}
        assert set(p["collectives"]) == set(COLLECTIVES) and p["flops"] > 0 and p["modelled_s"] > 0
        assert p["hbm_bytes"] == 95 * 2**30 and 0 < p["compiled_peak_bytes"] < p["hbm_bytes"]
        # every compiled program is planned; small models: XLA's fixed costs weigh more than at 1.7B (docs)
        assert abs(p["planned_peak_bytes"] / p["compiled_peak_bytes"] - 1) < 0.35, p
    update = r["programs"][3]["collectives"]
    assert update["all-gather"]["count"] > 0  # FSDP: each layer's weights gathered for its matmuls
    assert update["all-reduce"]["count"] + update["reduce-scatter"]["count"] > 0  # gradients summed over chips
    assert r["step_modelled_s"] > 0 and r["run_modelled_hours"] == pytest.approx(r["step_modelled_s"] * 400 / 3600)


def test_a_tensor_parallel_decode_loop_gathers_no_weights(capsys):
    """Heads and the MLP split over 2 chips (and rows over 2): a decode step reads its own shards; nothing
    the size of a weight crosses chips inside the loop (the per-layer weights are laid out once per call)."""
    config = config_of(*SMALL, "--config.mesh.fsdp=2", "--config.mesh.tensor=2")  # 2 kv heads: one per chip
    steps = step_programs(config, parse_target("v5p:2x2x1").devices(), 1)
    segment = next(p for p in steps.programs if p.name == "decode segment")
    smallest_weight = min(x.size * x.dtype.itemsize for x in jax.tree.leaves(segment.args[2].layers) if x.ndim > 1)
    gathered = collectives(analyze(segment, keep_text=True).text)["all-gather"]
    assert gathered["bytes"] < smallest_weight


@pytest.mark.full  # tiers.py: ~18 s; the one-host compile (above) keeps plan --compile's pools in the default tier
def test_four_hosts_sample_on_their_own_chips_and_update_on_all(capsys):
    code, r, _ = report(capsys, "--compile=v5p:2x2x4", *SMALL)
    assert code == 0 and (r["chips"], r["hosts"]) == (16, 4)
    assert r["mesh"] == {"data": 4, "fsdp": 4, "tensor": 1}  # mesh.data 0: one row per host
    config = config_of(*SMALL)
    steps = step_programs(config, parse_target("v5p:2x2x4").devices(), 4)
    on = {p.name: p.mesh for p in steps.programs}
    assert on["decode segment"].devices.size == 4 and len({d.process_index for d in on["prefill"].devices.flat}) == 1
    assert on["update"].devices.size == 16
    params = jax.tree.leaves(steps.pools[0].train.params)
    assert any("data" in str(x.sharding.spec) for x in params)  # the trained state is split over hosts too


def test_splash_attention_lowers_through_mosaic_when_compiled_for_a_tpu():
    """The model picks its TPU path from the mesh it is compiled for, not from this CPU host: with one
    response per row the update's attention is the Pallas splash kernel (a Mosaic custom call)."""
    config = config_of(*SMALL, "--config.optim.share_prompts=False")
    steps = step_programs(config, parse_target("v5p:2x2x1").devices(), 1)
    update = next(p for p in steps.programs if p.name == "update")
    assert "tpu_custom_call" in analyze(update, keep_text=True).text


def test_a_program_that_cannot_fit_is_one_line_and_exit_1(capsys):
    code = plan_main(["plan", f"--config={DEMO}", "--compile=v5e:2x2", *SMALL, "--config.rollout.num_tasks=256",
                      "--config.rollout.k=16", "--config.rollout.max_new_tokens=16384"])
    err = verdict(capsys.readouterr().err)
    assert code == 1, err
    assert re.fullmatch(r"DOES NOT FIT on v5e:2x2: decode start of policy needs [\d.]+ GiB per chip, more than the "
                        r"1\d\.\d\d GiB the compiler may use of each chip", err[0]), err[0]  # the rows' caches: 256 x 16 x 16k tokens
    # then what to try: the planner's changes that lower the peak, the fewer rows decoded at once among them
    assert err[1] == "what lowers the peak (the planner's estimate; compile again to confirm):" and 2 <= len(err) - 2 <= 4
    assert all(re.fullmatch(r"  - .+: [\d.]+ GiB less", line) for line in err[2:]), err
    assert any("rollout.decode_slots=" in line or "rollout.num_tasks=" in line for line in err[2:]), err


@pytest.mark.parametrize("target", ["v5p:9x9", "tpu9", "v5p-6"])
def test_an_unknown_target_is_one_line_listing_the_forms(capsys, target):
    code = plan_main(["plan", f"--config={DEMO}", f"--compile={target}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "v5p:2x2x4" in err[0] and "h100" in err[0]


def test_a_gpu_target_without_jax_s_cuda_plugin_is_one_line_and_exit_2(capsys):
    """The suite's environment has no CUDA plugin (tools/gpu_aot.sh makes a venv that has it)."""
    code = plan_main(["plan", f"--config={DEMO}", "--compile=h100"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs the CUDA plugin of the installed jax" in err[0]


def test_targets_name_chips_and_hosts_as_cloud_tpu_builds_them():
    cases = {"v5p:2x2x1": (4, 1), "v5p-8": (4, 1), "v5p-32": (16, 4), "v5p:2x2x4": (16, 4), "v6e-8": (8, 1),
             "v6e:2x4": (8, 1), "v6e:4x4": (16, 4), "v5litepod-16": (16, 4), "h100": (1, 1), "h200x8": (8, 1), "h100x16": (16, 2)}
    for name, (chips, hosts) in cases.items():
        t = parse_target(name)
        assert (t.chips, t.hosts) == (chips, hosts), name
    devices = parse_target("v6e-8").devices()
    assert len(devices) == 8 and len({d.process_index for d in devices}) == 1


def test_collectives_are_counted_with_the_bytes_of_their_results():
    text = "\n".join([
        "  %all-gather.1 = bf16[128,64]{1,0:T(8,128)(2,1)} all-gather(%x), channel_id=4, dimensions={0}",
        "  %ar = (f32[384,128]{0,1}, f32[10]{0}) all-reduce(%a, %b), to_apply=%add",
        "  %ags = (bf16[2,8]{1,0}, bf16[8,8]{1,0}) all-gather-start(%y), dimensions={0}",
        "  %agd = bf16[8,8]{1,0} all-gather-done(%ags)",
        "  %cp = s32[4]{0} collective-permute(%z), source_target_pairs={{0,1}}",
        "  %notacollective = f32[2]{0} add(%p, %q)",
    ])
    c = collectives(text)
    assert c["all-gather"] == {"count": 2, "bytes": 128 * 64 * 2 + 8 * 8 * 2}
    assert c["all-reduce"] == {"count": 1, "bytes": 384 * 128 * 4 + 40}
    assert c["collective-permute"] == {"count": 1, "bytes": 16}
    assert c["reduce-scatter"] == c["all-to-all"] == {"count": 0, "bytes": 0}


def test_the_time_model_counts_what_the_benchmarks_count():
    """The update's useful FLOPs are the benchmarks' MFU numerator (bench.train.update_flops); a decode
    step reads the weights once and each prompt's keys and values once (its branches share them)."""
    from atgrpo_jax.bench.train import update_flops
    from atgrpo_jax.models.model_config import get_preset
    from atgrpo_jax.plan import costing

    cfg = get_preset("qwen3-1.7b", param_dtype="bfloat16", compute_dtype="bfloat16")
    assert 3 * costing.forward_flops(cfg, 4, 1024) == pytest.approx(update_flops(cfg, 4, 1024), rel=1e-9)
    mesh = {"data": 1, "fsdp": 4, "tensor": 1}
    per_token_kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    layers = cfg.num_layers * (cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
                               + 3 * cfg.hidden_size * cfg.intermediate_size)
    weights = (layers + cfg.hidden_size * cfg.vocab_size) * 2  # bf16, whole on each chip (decode_gather)
    expected = weights + per_token_kv * (32 * 1000 + 256 * 300) / 4
    assert costing.decode_step_bytes(cfg, mesh, 32, 1000, 256, 300) == pytest.approx(expected, rel=1e-9)
    sharded = costing.decode_step_bytes(cfg.replace(decode_gather=False), mesh, 32, 1000, 256, 300)
    assert sharded == pytest.approx(weights / 4 + per_token_kv * (32 * 1000 + 256 * 300) / 4, rel=1e-9)


def aborting_compile(config, target, assumptions, devices, progress):
    """In plan --compile's child instead of the step's programs: 'update of policy_b' compiled as the
    all-reduce libtpu 0.0.42 aborts on (over the second pool of a v5p-16, the chips with x = 1, without
    sharding.pool_compiler_options), so the command meets a real failed CHECK in its child."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    progress(f"compiling update of policy_b for {target.name}", ("update", "policy_b"))
    chips = [d for d in target.devices() if d.coords[0] == 1]
    mesh = Mesh(np.asarray(chips, dtype=object).reshape(2, 2), ("data", "fsdp"))
    x = jax.ShapeDtypeStruct((4, 1 << 20), "float32", sharding=NamedSharding(mesh, P(("data", "fsdp"))))
    psum = jax.shard_map(lambda v: jax.lax.psum(v, ("data", "fsdp")), mesh=mesh, in_specs=P(("data", "fsdp")),
                         out_specs=P())
    jax.jit(psum).lower(x).compile()
    raise AssertionError("libtpu compiled the all-reduce it aborts on: see sharding.pool_compiler_options")


@pytest.mark.full  # tiers.py: ~10 s (a child process and libtpu); the child's death read from its log (below)
# keeps the one line in the default tier
def test_a_compiler_abort_is_one_line_naming_the_program_and_exit_1(capsys, monkeypatch):
    """libtpu ends its process on a failed CHECK: the compile runs in a child, and the command says in one
    line which program of which pool aborted, for which target, the CHECK and what to try."""
    from atgrpo_jax.plan import compile_cli

    monkeypatch.setattr(compile_cli, "_compile_here", aborting_compile)
    code = plan_main(["plan", f"--config={DEMO}", "--compile=v5p:2x2x2", *SMALL])
    out = capsys.readouterr()
    err = verdict(out.err)
    assert code == 1 and out.out == "" and len(err) == 1, out.err
    assert re.fullmatch(r"libtpu aborted compiling update of policy_b for v5p:2x2x2 \(a compiler bug: Check failed: "
                        r"get_loop_bound\(color\) == loop_bound \(0 vs\. 4\) at rotated_pincer_emitter_base\.cc:\d+\); "
                        r"try .+--config\.policy\.pools=False.+", err[0]), err[0]
    assert "compiling update of policy_b for v5p:2x2x2" in out.err  # the progress line of the program


def test_a_child_that_died_in_a_check_is_the_one_line_and_one_killed_otherwise_says_so(tmp_path):
    """What plan --compile's child leaves when libtpu aborts it (its log: the CHECK and a stack trace;
    its exit: SIGABRT) is one CompilerFailed naming the program; a child killed otherwise is one CompileDied."""
    import signal
    from atgrpo_jax.plan.compile_cli import CompileDied, CompilerFailed, _died

    log = tmp_path / "child.log"
    log.write_text("compiling\nF1202 02:10:02.409946   22410 rotated_pincer_emitter_base.cc:1524] Check failed: "
                   "get_loop_bound(color) == loop_bound (0 vs. 4) \n*** Check failure stack trace: ***\n"
                   "    @     0x7f4180b0c5b0  absl::internal_any_invocable::RemoteInvoker<>()\n")
    e = _died(-signal.SIGABRT, ("old log-probs", "policy_plan"), "v5p:2x2x2", str(log))
    assert isinstance(e, CompilerFailed) and "\n" not in str(e) and "0x7f" not in str(e)
    assert str(e).startswith("libtpu aborted compiling old log-probs of policy_plan for v5p:2x2x2 (a compiler bug: "
                             "Check failed: get_loop_bound(color) == loop_bound (0 vs. 4) at "
                             "rotated_pincer_emitter_base.cc:1524); try "), e
    log.write_text("")
    killed = _died(-signal.SIGKILL, ("update", "policy"), "v5p:2x2x1", str(log))
    assert isinstance(killed, CompileDied) and "signal 9" in str(killed) and "update of policy" in str(killed)


def test_four_roles_make_four_pools_of_programs_on_their_own_chips():
    """A four-role workflow (tests/train/team_workflow.py) per role with pools: four policies, each
    with its own programs on its own chip of the four (no compile: the programs as laid out)."""
    config = config_of("--config.env.workflow=team_workflow:make", "--config.env.kwargs.roles=4",
                       "--config.policy.sharing=per_role", "--config.policy.pools=True", "--config.mesh.data=0",
                       "--config.mesh.fsdp=-1")
    steps = step_programs(config, parse_target("v5p:2x2x1").devices(), 1)
    assert [s.name for s in steps.pools] == ["policy_r0", "policy_r1", "policy_r2", "policy_r3"]
    assert [s.agents for s in steps.pools] == [[0], [1], [2], [3]]
    chips = [{d.id for d in s.mesh.devices.flat} for s in steps.pools]
    assert sorted(map(len, chips)) == [1, 1, 1, 1] and len(set().union(*chips)) == 4
    for s in steps.pools:  # every policy's own step, on its own chip
        mine = [p for p in steps.programs if p.pool == s.name and p.reported]
        assert [p.name for p in mine] == ["prefill", "decode segment", "old log-probs", "update"], s.name
        assert all({d.id for d in p.mesh.devices.flat} <= {d.id for d in s.mesh.devices.flat} for p in mine)


def test_three_pools_on_three_hosts_of_four_chips_are_refused_as_the_trainer_refuses_them(capsys):
    """v5p:2x2x3 (3 hosts of 4 chips) for three roles' pools: a pool per host would leave each host without
    the other roles' models, and every host samples its share of the tasks with every model, so the trainer
    refuses it (train/setup.py, via sharding.pool_sizes); plan --compile says the same line, exit 2, before
    any program compiles."""
    code = plan_main(["plan", f"--config={DEMO}", "--compile=v5p:2x2x3", *SMALL,
                      "--config.env.workflow=team_workflow:make", "--config.env.kwargs.roles=3",
                      "--config.policy.sharing=per_role", "--config.policy.pools=True"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not any(line.startswith(("compiling ", "  compiled ")) and " of " in line for line in err), err
    assert err[-1] == ("error: cannot split a mesh of {'data': 3, 'fsdp': 4, 'tensor': 1} over 3 hosts into 3 pools "
                       "with devices on every host (each host samples its share of the tasks with every policy): "
                       "a host's fsdp*tensor (4) is not a multiple of 3"), err


def test_a_slice_that_cannot_be_cut_into_the_roles_pools_says_so_before_compiling(capsys):
    """Three roles' pools on a v5p:2x2x1 (4 chips, one host): one line naming the mesh and the count, exit 2,
    before any program compiles."""
    code = plan_main(["plan", f"--config={DEMO}", "--compile=v5p:2x2x1", *SMALL,
                      "--config.env.workflow=team_workflow:make", "--config.env.kwargs.roles=3",
                      "--config.policy.sharing=per_role", "--config.policy.pools=True"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not any(line.startswith(("compiling ", "  compiled ")) and " of " in line for line in err), err
    assert err[-1] == ("error: cannot split a mesh of {'data': 1, 'fsdp': 4, 'tensor': 1} into 3 equal pools: neither "
                       "fsdp*tensor (4) nor data (1) is a multiple of 3"), err


# The slices users rent (docs/results/tpu.md "Pools on every slice"), each cut into the two roles' pools;
# v6e:4x4's first pool fails a RET_CHECK of libtpu's compile-only client (the test after).
POOL_SLICES = ["v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4", "v5p:2x4x4", "v6e:2x2", "v6e:2x4", "v5e:2x4"]
PER_ROLE_POOLS = ["--config.policy.sharing=per_role", "--config.policy.pools=True"]


@pytest.mark.full  # tiers.py: ~40 s a slice; the v5p:2x2x1 compile above keeps pools in the default tier
@pytest.mark.parametrize("target", POOL_SLICES)
def test_two_roles_pools_compile_on_every_slice_users_rent(capsys, target):
    """The small model per role with a pool per role: every program of both pools compiles, each on
    its own half of the slice's chips, and every one of them is planned: never far under, and over by
    less than 128 MiB (at this size XLA's fixed costs weigh most; the 1.7B test below holds it to 10%)."""
    code, r, err = report(capsys, f"--compile={target}", *SMALL, *PER_ROLE_POOLS)
    assert code == 0 and r["fits"], err
    assert len({p["pool"] for p in r["programs"]}) == 2 and len(r["programs"]) == 8  # two pools' own four
    for p in r["programs"]:
        planned, compiled = p["planned_peak_bytes"], p["compiled_peak_bytes"]
        assert planned and 0.7 * compiled < planned < compiled + 128 * 2**20, p


@pytest.mark.full  # tiers.py: twelve or sixteen programs of the small model, ~50 and ~80 s on two cores
@pytest.mark.parametrize("roles,pools", [(4, True), (3, False)], ids=["4-roles-4-pools", "3-roles-shared-chips"])
def test_teams_compile_on_two_hosts(capsys, roles, pools):
    """A team on v5p:2x2x2 (2 hosts of 4 chips), one model per role. Four pools: each is one chip of each host
    (data 2), so each host samples with every model. Three roles, whose pools no TPU host divides: the
    three models share all 8 chips. Every program of every model compiles and is planned as in the
    two-role test above."""
    code, r, err = report(capsys, "--compile=v5p:2x2x2", *SMALL, "--config.env.workflow=team_workflow:make",
                          f"--config.env.kwargs.roles={roles}", "--config.policy.sharing=per_role",
                          f"--config.policy.pools={pools}")
    assert code == 0 and r["fits"] and r["hosts"] == 2, err
    assert sorted({p["pool"] for p in r["programs"]}) == [f"policy_r{i}" for i in range(roles)]
    assert len(r["programs"]) == 4 * roles
    for p in r["programs"]:
        planned, compiled = p["planned_peak_bytes"], p["compiled_peak_bytes"]
        assert planned and 0.7 * compiled < planned < compiled + 128 * 2**20, p


@pytest.mark.full  # tiers.py: ~20 s; its line's form is the default tier's (the child's log read back, above)
def test_v6e_16_s_first_pool_fails_libtpu_s_compile_only_check_in_one_line(capsys):
    """libtpu's compile-only client rejects a collective of the first pool on a v6e:4x4 (a RET_CHECK: a
    device id beyond the pool's count, docs/results/tpu.md): one line naming the program, exit 1. This
    test fails once a libtpu compiles it, and the cut is then one users can rent."""
    code = plan_main(["plan", f"--config={DEMO}", "--compile=v6e:4x4", *SMALL, *PER_ROLE_POOLS])
    err = verdict(capsys.readouterr().err)
    assert code == 1 and len(err) == 1, err
    assert re.fullmatch(r"libtpu (aborted|failed) compiling .+ of policy_\w+ for v6e:4x4 \(.*Unexpected device_id.*",
                        err[0]), err


@pytest.mark.full  # tiers.py: ~8 min on two cores (eight 1.7B programs); the sweep's row on the results page
def test_the_1p7b_per_role_pools_config_compiles_on_a_v5p_16_within_the_plan(capsys):
    """The command of docs/results/tpu.md "Two roles on two pools of a v5p-16": two Qwen3-1.7B models on
    their pools of 4 chips compile (the second pool's with the all-reduce libtpu lowers) and fit, and the
    planner is within 10% of every compiled peak."""
    code = plan_main(["plan", f"--config={os.path.join(ROOT, 'configs', 'plan_path_qwen3_1p7b.py')}",
                      "--compile=v5p:2x2x2", "--config.regime=per_role", "--config.policy.pools=True",
                      "--config.model.init=random", "--json"])
    out = capsys.readouterr()
    r = json.loads(out.out.strip().splitlines()[-1])
    assert code == 0 and r["fits"], out.err
    assert sorted({p["pool"] for p in r["programs"]}) == ["policy_plan", "policy_tool"]
    for p in r["programs"]:
        assert abs(p["planned_peak_bytes"] / p["compiled_peak_bytes"] - 1) < 0.10, p
