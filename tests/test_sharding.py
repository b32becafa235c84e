"""Meshes, logical rules, device pools; a sharded forward equals the unsharded one."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.hf_io import load_pretrained, save_pretrained
from atgrpo_jax.sharding import MeshSettings, logical_spec, make_mesh, pool_sizes, sub_meshes
from hf_fixtures import left_padded_batch


def test_eight_devices_are_simulated():
    assert jax.device_count() == 8


def test_mesh_shapes_and_fill():
    mesh = make_mesh(MeshSettings(data=2, fsdp=-1, tensor=2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    assert dict(make_mesh({"tensor": 4, "fsdp": -1}).shape) == {"data": 1, "fsdp": 2, "tensor": 4}
    small = make_mesh(MeshSettings(data=1, fsdp=2, tensor=1))  # fewer devices than there are
    assert [d.id for d in small.devices.flat] == [0, 1]
    assert dict(make_mesh(MeshSettings()).shape) == {"data": 1, "fsdp": 8, "tensor": 1}  # data 0: one row per host


def test_pools_are_compact_blocks_of_each_host_s_chips():
    """Cut along the longest axis of a host's chip grid (the first on a tie): the layouts libtpu compiles."""
    from atgrpo_jax.plan.targets import parse_target

    for target, expected in (("v5p-32", [[0, 2], [1, 3]]), ("v6e-8", [[0, 1, 2, 3], [4, 5, 6, 7]])):
        devices = parse_target(target).devices()
        pools = sub_meshes(make_mesh(MeshSettings(), devices), 2)
        assert [[d.id for d in p.devices[0].flat] for p in pools] == expected, target


def test_the_second_pool_of_a_v5p_16_all_reduces_without_the_colours_libtpu_aborts_on():
    """The pool cut of every slice users rent keeps the compiler's defaults, but the chips with x = 1 of a
    v5p-16 (2x2x2), where libtpu's multi-colour all-reduce aborts: there it compiles as a 2-colour ring."""
    import re
    from jax.sharding import NamedSharding
    from atgrpo_jax.plan.targets import parse_target
    from atgrpo_jax.sharding import NO_MULTI_COLOR_ALL_REDUCE, pool_compiler_options

    for name in ("v5p:2x2x1", "v5p:2x2x4", "v5p:2x4x4", "v6e:2x4", "v6e:4x4", "v5e:2x4"):
        pools = sub_meshes(make_mesh({"data": 0, "fsdp": -1}, parse_target(name).devices()), 2)
        assert [pool_compiler_options(p) for p in pools] == [{}, {}], name
    assert pool_compiler_options(make_mesh()) == {}  # CPU devices
    first, second = sub_meshes(make_mesh({"data": 0, "fsdp": -1}, parse_target("v5p:2x2x2").devices()), 2)
    assert {tuple(d.coords)[0] for d in second.devices.flat} == {1} and pool_compiler_options(first) == {}
    assert pool_compiler_options(second) == NO_MULTI_COLOR_ALL_REDUCE
    axes = ("data", "fsdp", "tensor")
    x = jax.ShapeDtypeStruct((4, 1 << 20), np.float32, sharding=NamedSharding(second, P(axes)))
    psum = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, axes), mesh=second, in_specs=P(axes), out_specs=P()),
                   compiler_options=pool_compiler_options(second))
    text = psum.lower(x).compile().as_text()
    assert re.search(r"UniDirectionNDRingStrategy\{colors:2 ", text), text[-2000:]


def test_data_zero_is_one_row_per_host():
    """The default mesh (data 0) on a 4-host TPU topology: each host's chips form one data row."""
    from atgrpo_jax.plan.targets import parse_target

    devices = parse_target("v5p:2x2x4").devices()
    mesh = make_mesh(MeshSettings(), devices)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 4, "tensor": 1}
    assert all(len({d.process_index for d in row.flat}) == 1 for row in mesh.devices)


@pytest.mark.parametrize("config,pattern", [
    (dict(data=3, fsdp=-1), "not a multiple of 3"),
    (dict(data=2, fsdp=2, tensor=4), "but there are only 8 devices"),
    (dict(data=-1, fsdp=-1), "only one mesh axis may be -1"),
    (dict(data=-2), r"config.mesh.data: must be > 0 or -1 \(or 0: one row per host\), got -2"),
    ({"model": 8}, "unknown mesh axes"),
])
def test_bad_mesh_config(config, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_mesh(config)


def test_logical_rules_drop_axes_that_do_not_divide():
    mesh = make_mesh(MeshSettings(data=2, fsdp=2, tensor=2))
    assert logical_spec(("batch", "seq", "embed"), (8, 5, 64), mesh) == P(("data", "fsdp"), None, None)
    assert logical_spec(("embed", "heads", "head_dim"), (64, 4, 16), mesh) == P("fsdp", "tensor", None)
    assert logical_spec(("embed", "kv_heads", "head_dim"), (64, 1, 16), mesh) == P("fsdp", None, None)
    assert logical_spec(("batch",), (2,), mesh) == P("data")
    with pytest.raises(ValueError, match="unknown logical axis 'wat'"):
        logical_spec(("wat",), (2,), mesh)


def test_sub_meshes_are_disjoint_pools():
    mesh = make_mesh(MeshSettings(data=2, fsdp=2, tensor=2))
    pools = sub_meshes(mesh, 2)
    ids = [{d.id for d in p.devices.flat} for p in pools]
    assert len(ids[0]) == len(ids[1]) == 4 and not ids[0] & ids[1]
    assert dict(pools[0].shape) == {"data": 2, "fsdp": 1, "tensor": 2}  # each data row is cut in two
    assert [[d.id for d in p.devices.flat] for p in sub_meshes(make_mesh(MeshSettings(data=2, fsdp=4)), 2)] == [
        [0, 1, 4, 5], [2, 3, 6, 7]]  # devices without coordinates: halves of each row
    for pool in pools:  # a pool keeps each of its data rows inside one row of the mesh
        for r in range(2):
            assert {d.id for d in pool.devices[r].flat} <= {d.id for d in mesh.devices[r].flat}
    rows_only = sub_meshes(make_mesh(MeshSettings(data=8, fsdp=1, tensor=1)), 2)
    assert [sorted(d.id for d in p.devices.flat) for p in rows_only] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="cannot split a mesh of .* into 3 equal pools"):
        sub_meshes(mesh, 3)


def test_pools_over_several_hosts_each_hold_devices_on_every_host():
    """Every host samples its share of the tasks with every policy (distributed.local_mesh), so a pool of
    whole hosts is a layout one process can use and several cannot."""
    assert pool_sizes({"data": 3, "fsdp": 4, "tensor": 1}, 3) == {"data": 1, "fsdp": 4, "tensor": 1}
    with pytest.raises(ValueError, match=r"over 3 hosts into 3 pools with devices on every host .* fsdp\*tensor "
                                         r"\(4\) is not a multiple of 3"):
        pool_sizes({"data": 3, "fsdp": 4, "tensor": 1}, 3, hosts=3)
    assert pool_sizes({"data": 2, "fsdp": 4, "tensor": 1}, 4, hosts=2) == {"data": 2, "fsdp": 1, "tensor": 1}


def test_sharded_forward_equals_unsharded(tmp_path):
    cfg = get_preset("test-tiny", num_heads=4, num_kv_heads=2, hidden_size=64, intermediate_size=128)
    save_pretrained(Qwen3(cfg, rngs=nnx.Rngs(0)), str(tmp_path))
    mesh = make_mesh(MeshSettings(data=2, fsdp=2, tensor=2))
    plain = load_pretrained(str(tmp_path))
    sharded = load_pretrained(str(tmp_path), mesh=mesh)
    wq = sharded.layers.wq[...]
    assert wq.sharding.spec == P(None, "fsdp", "tensor", None)
    assert len({s.device for s in wq.addressable_shards}) == 8
    assert wq.addressable_shards[0].data.shape == (2, 32, 2, 24)  # each device holds a block
    tokens, mask, positions = (jnp.asarray(a) for a in
                               left_padded_batch(np.random.RandomState(0), cfg.vocab_size, [7, 5, 3, 7]))
    expected, _ = plain(tokens, positions, mask)
    graphdef, state = nnx.split(sharded)

    @jax.jit
    def forward(state, tokens, positions, mask):
        return nnx.merge(graphdef, state)(tokens, positions, mask)[0]

    with jax.set_mesh(mesh):
        got = forward(state, tokens, positions, mask)
    assert not got.sharding.is_fully_replicated
    np.testing.assert_allclose(np.asarray(got)[np.asarray(mask)], np.asarray(expected)[np.asarray(mask)],
                               atol=1e-5)
