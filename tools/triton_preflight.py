"""Compile the Pallas decode attention for an H100 on a machine without a GPU.

Device time is scarce (docs/device.md), so a kernel that Triton refuses, or that spills registers,
should be found before it. Two steps, run by `tools/triton_preflight.sh`:

  lower    (the project's Python): lower `kernel_shared_prefix_attention` for CUDA under an abstract
           H100 at the device check's shapes. Pallas emits Triton IR at lowering time, so no GPU is
           needed; each kernel's IR is written as text (`*.ttir`).
  compile  (a venv with pip's `triton`, no jax): compile each `*.ttir` for sm_90a the way
           `triton.compile` does (TTIR -> TTGIR -> LLVM -> PTX), then assemble the PTX with the
           wheel's `ptxas -v`. Prints shared memory, registers, spills and the CTAs per SM those allow.

XLA compiles the same IR with the Triton it bundles, not pip's, so a pass here is strong evidence
that the kernel compiles there, not proof; the timings still need the device.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys

import h100  # (tools/, this script's directory)

# (name, prompts, branches, prompt slots, own slots): Qwen3-1.7B's heads (8 kv x 2, head_dim 128)
SHAPES = (("check_b64_k1", 64, 1, 512, 512),  # bench device's decode part: 64 rows, each its own prompt
          ("tree_b16_k4", 16, 4, 512, 256))  # tree sampling: 16 prompts x 4 branches
KV_HEADS, GROUPS, HEAD_DIM = 8, 2, 128


def lower(out_dir: str, block: int, warps: int, stages: int) -> None:
    import jax
    import jax.numpy as jnp
    from jax._src.lib.mlir import ir
    from jax.sharding import AbstractMesh
    from jaxlib.triton import dialect

    from atgrpo_jax.models import decode_kernel
    try:
        from jax.sharding import AbstractDevice
    except ImportError:  # jax 0.10
        from jax._src.mesh import AbstractDevice

    decode_kernel.MAX_BLOCK, decode_kernel.NUM_WARPS, decode_kernel.NUM_STAGES = block, warps, stages
    os.makedirs(out_dir, exist_ok=True)
    sd, bf = jax.ShapeDtypeStruct, jnp.bfloat16
    h100 = AbstractMesh((1,), ("data",), abstract_device=AbstractDevice("NVIDIA H100", None, "gpu"))
    for name, b, k, p, s in SHAPES:
        n = b * k
        args = (sd((n, 1, KV_HEADS * GROUPS, HEAD_DIM), bf), sd((b, KV_HEADS, p, HEAD_DIM), bf),
                sd((b, KV_HEADS, p, HEAD_DIM), bf), sd((b, p), bool), sd((n, KV_HEADS, s, HEAD_DIM), bf),
                sd((n, KV_HEADS, s, HEAD_DIM), bf), sd((n, 1, s), bool))
        fn = jax.jit(lambda *a, k=k: decode_kernel.kernel_shared_prefix_attention(*a, branches=k, interpret=False))
        with jax.sharding.use_abstract_mesh(h100):
            module = fn.trace(*args).lower(lowering_platforms=("cuda",)).compiler_ir("stablehlo")
        calls = []

        def visit(op, calls=calls):
            if op.name == "stablehlo.custom_call" and "triton" in str(op.attributes["call_target_name"]):
                calls.append(op)
            return ir.WalkResult.ADVANCE
        module.operation.walk(visit)
        for i, call in enumerate(calls):
            config = call.attributes["mhlo.backend_config"]
            blob, grid = config["ir"].value_bytes, [config[f"grid_{a}"].value for a in "xyz"]
            with ir.Context() as ctx:
                dialect.register_dialect(ctx)
                text = ir.Module.parse(blob).operation.get_asm(enable_debug_info=False)
            stem = os.path.join(out_dir, f"{name}_{'prompt' if i == 0 else 'own'}")
            with open(stem + ".ttir", "w") as f:
                f.write(text)
            with open(stem + ".json", "w") as f:
                json.dump({"grid": grid, "block": block, "warps": warps, "stages": stages}, f)
        print(f"{name}: {len(calls)} Triton kernels lowered")


def compile_(out_dir: str) -> int:
    import triton
    from triton.backends.compiler import GPUTarget

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    failed = 0
    for path in sorted(glob.glob(os.path.join(out_dir, "*.ttir"))):
        meta = json.load(open(path[:-5] + ".json"))
        name = os.path.basename(path)[:-5]
        try:
            kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": meta["warps"], "num_stages": meta["stages"]})
        except Exception as e:  # the report names the kernel and Triton's reason
            failed += 1
            print(f"{name}: Triton FAILED: {type(e).__name__}: {str(e)[:1500]}")
            continue
        ptx = path[:-5] + ".ptx"
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        info = _ptxas(bin_dir, ptx)
        regs, spills, smem, warps = info["registers"], info["spill_bytes"], kernel.metadata.shared, meta["warps"]
        ctas = min(h100.SMEM_PER_SM // max(smem, 1), h100.REGS_PER_SM // (regs * 32 * warps),
                   h100.MAX_WARPS_PER_SM // warps)
        print(f"{name}: grid {meta['grid']}, block {meta['block']}, {warps} warps, {meta['stages']} stages: shared {smem / 1024:.1f} KiB, "
              f"{regs} registers, spills {spills} B -> {ctas} CTAs ({ctas * warps} warps) per SM")
    return failed


def _ptxas(bin_dir: str, ptx: str) -> dict:
    """Registers and spill bytes from `ptxas -v` (the wheel ships one per PTX generation: take the
    first that accepts this PTX's .version)."""
    for exe in sorted(glob.glob(os.path.join(bin_dir, "ptxas*")), key=len, reverse=True):
        proc = subprocess.run([exe, "-arch=sm_90a", "-v", "-o", os.devnull, ptx], capture_output=True, text=True)
        if proc.returncode == 0:
            log = proc.stdout + proc.stderr
            spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
            return {"registers": int(re.search(r"Used (\d+) registers", log).group(1)), "spill_bytes": spills}
    raise RuntimeError(f"no ptxas in {bin_dir} assembles {ptx}: {proc.stderr.strip()[-500:]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("lower", "compile"))
    parser.add_argument("--out", default=".triton/ir")
    parser.add_argument("--block", type=int, default=None, help="lower: most keys per block (default: the kernel's)")
    parser.add_argument("--warps", type=int, default=None, help="lower: num_warps (default: the kernel's)")
    parser.add_argument("--stages", type=int, default=None, help="lower: num_stages (default: the kernel's)")
    args = parser.parse_args(argv)
    if args.step == "compile":
        return 1 if compile_(args.out) else 0
    from atgrpo_jax.models import decode_kernel
    lower(args.out, args.block or decode_kernel.MAX_BLOCK, args.warps or decode_kernel.NUM_WARPS,
          args.stages or decode_kernel.NUM_STAGES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
