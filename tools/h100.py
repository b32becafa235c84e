"""An H100 SXM 80GB, for tools/triton_preflight.py (it also runs in a venv without jax): the limits come
from atgrpo_jax/plan/gpu_target.py, the one place that describes the GPUs the project compiles for,
read as a file so that the package (and jax) is not imported."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "gpu_target", os.path.join(os.path.dirname(__file__), "..", "atgrpo_jax", "plan", "gpu_target.py"))
_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gpu)

SMS, SMEM_PER_SM, REGS_PER_SM, MAX_WARPS_PER_SM = _gpu.SMS, _gpu.SMEM_PER_SM, _gpu.REGS_PER_SM, _gpu.MAX_WARPS_PER_SM
