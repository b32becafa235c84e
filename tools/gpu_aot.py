"""Compile the device check's update and decode step for an H100 on a machine without a GPU.

JAX can compile for a GPU it does not have (a "compile only" topology made from a target
description), if the CUDA plugin is installed. `tools/gpu_aot.sh` makes a venv with the device
image's jax (0.11.2 + jax-cuda13-plugin, ~5 GB) and runs this there. Nothing is executed, so no
timings; what a compile says without a device:
  update  XLA's buffer assignment for the trainer's bf16 update of Qwen3-1.7B at the check's
          4 x 1,024 tokens: peak = arguments + temporaries (the state is donated), against
          `python -m atgrpo_jax.plan`'s prediction; per attention backend, then the check's sweep
          (8,192 tokens, recompute off, layers rolled).
  decode  the sampler's per-layer decode segment at the check's shape (64 rows, 512 + 512 tokens),
          with the einsum attention and with the Pallas kernel (compiled by XLA's own Triton):
          whether it compiles, and the Triton calls and fusions of its program.

The model picks its GPU code paths (cuDNN attention, per-layer decode, Triton) from
`jax.default_backend()`, which is "cpu" here, so this script reports "gpu" to it.
Without a device XLA skips autotuning (its GEMMs default to Triton, not cuBLAS), so kernel choices
can differ from a real compile; buffer sizes matched: stop 32's update (commit 14d6b70) measured
43.9 GiB on an H100, and compiled here 43.8 GiB.
"""
from __future__ import annotations

import argparse
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec

import h100  # (tools/, this script's directory)

GiB = 2 ** 30


def h100_mesh():
    topology = topologies.get_topology_desc(platform="cuda", target_config=h100.TARGET_CONFIG, topology="1x1x1")
    return topologies.make_mesh(topo=topology, mesh_shape=(1,), axis_names=("x",))


def placed(mesh, tree):
    """Abstract arrays of `tree` (arrays or ShapeDtypeStructs), on the mesh's one device."""
    one = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), tree)


def update_variants():
    """(backend, log-prob chunk, rows, layer unroll, recompute) of the check's update part: each
    backend at the check's rows, then its sweep (`Shapes.update_sweep`) on cuDNN."""
    from atgrpo_jax.bench.device_parts import REAL
    from atgrpo_jax.bench.device_update import CHUNK

    rows = REAL.update_rows[0]
    main = [("cudnn", CHUNK, rows, 0, True), ("chunked", CHUNK, rows, 0, True)]  # unroll 0: the default, auto
    return main + [("cudnn", *v) for v in REAL.update_sweep]


def update(mesh, variants) -> None:
    from flax import nnx

    from atgrpo_jax.algo.loss import LossConfig
    from atgrpo_jax.bench.device_parts import REAL
    from atgrpo_jax.bench.device_update import CHUNK, planned_peak
    from atgrpo_jax.bench.train import bench_optimizer, jax_batch, make_batch, optim_config
    from atgrpo_jax.models import Qwen3, get_preset
    from atgrpo_jax.models.qwen3 import layer_unroll
    from atgrpo_jax.train.batch import rows_update
    from atgrpo_jax.train.update import TrainState, make_update_fns

    width = REAL.update_rows[1]
    for backend, chunk, rows, unroll, recompute in variants:
        cfg = get_preset(REAL.preset).replace(param_dtype="float32", compute_dtype="bfloat16", attention=backend,
                                              sequence_unroll=unroll, recompute_elementwise=recompute)
        graphdef, params = nnx.split(nnx.eval_shape(lambda cfg=cfg: Qwen3(cfg, rngs=nnx.Rngs(0))))
        tx = bench_optimizer(optim_config())
        update_fn = rows_update(make_update_fns(graphdef, nnx.State({}), tx, LossConfig(), chunk)[1])
        state = placed(mesh, TrainState(params, jax.eval_shape(tx.init, params), jax.ShapeDtypeStruct((), jnp.int32)))
        data = make_batch(cfg.vocab_size, rows, width)  # the check's rows, as arrays: only their form is used
        batch = placed(mesh, jax_batch(data, np.zeros(data["tokens"].shape, np.float32)))
        start = time.perf_counter()
        m = update_fn.lower(state, batch).compile().memory_analysis()
        peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        name = (f"update {backend}, {rows * width} tokens, chunk {chunk}, {layer_unroll(cfg, width)} layers per loop "
                f"iteration, recompute {'on' if recompute else 'off'}")
        line = (f"{name}: compiled in {time.perf_counter() - start:.0f} s; arguments {m.argument_size_in_bytes / GiB:.2f}"
                f" GiB + temporaries {m.temp_size_in_bytes / GiB:.2f} GiB = peak {peak / GiB:.2f} GiB")
        if chunk == CHUNK:  # what the planner models: the trainer's log-prob chunk
            plan = planned_peak(cfg, rows, width, backend)
            line += f"; planner {plan / GiB:.2f} GiB ({100 * (plan / peak - 1):+.1f}%)"
        print(line)


def decode(mesh, forms) -> None:
    from flax import nnx

    from atgrpo_jax.bench.device_parts import REAL
    from atgrpo_jax.models import Qwen3, get_preset
    from atgrpo_jax.sampling import decode as dec

    b, p, new = REAL.batch, REAL.prompt, REAL.new
    base = get_preset(REAL.preset).replace(param_dtype="bfloat16", compute_dtype="bfloat16")
    for form in forms:
        cfg = base.replace(decode_unroll=base.num_layers, decode_attention="pallas" if form == "kernel" else "xla")
        graphdef, weights = nnx.split(nnx.eval_shape(lambda cfg=cfg: Qwen3(cfg, rngs=nnx.Rngs(0))))
        weights = placed(mesh, weights)
        prompts = placed(mesh, (jax.ShapeDtypeStruct((b, p), jnp.int32), jax.ShapeDtypeStruct((b, p), bool)))
        pre = jax.eval_shape(lambda w, i, m: dec._prefill(graphdef, w, i, m), weights, *prompts)
        settings = dec.DecodeSettings(max_new_tokens=new)
        rows, full = jax.eval_shape(lambda w, pre: dec._start(graphdef, w, pre, None, None, None, settings, new),
                                    weights, pre)
        layers = jax.eval_shape(lambda w: dec._layer_weights(graphdef, w), weights)
        args = placed(mesh, (layers, rows, full, jax.ShapeDtypeStruct((b,), jnp.int32),
                             jax.ShapeDtypeStruct((), jnp.int32), jax.eval_shape(dec.sampling_params)))
        start = time.perf_counter()
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # Pallas asks it which GPU it lowers for
            text = dec.segment_jit.lower(graphdef, weights, *args, settings).compile().as_text()
        print(f"decode {form}: compiled in {time.perf_counter() - start:.0f} s; the segment program has "
              f"{text.count('__gpu$xla.gpu.triton')} Pallas Triton calls and {len(re.findall(r' fusion[(]', text))} "
              f"fusions (nearly all in the loop's step)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="update,decode")
    args = parser.parse_args(argv)
    jax.default_backend = lambda: "gpu"  # the model's GPU code paths (see the docstring)
    mesh = h100_mesh()
    parts = args.parts.split(",")
    if "update" in parts:
        update(mesh, update_variants())
    if "decode" in parts:
        decode(mesh, ("unrolled", "kernel"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
