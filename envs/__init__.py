"""Environments and multi-agent workflows (installed as `atgrpo_jax.envs`).

Grid games are pure-functional JAX steppers; math and code tasks are graded on
the host, with model-written code run in `sandbox`. A `Workflow` (see
`workflow.py`) binds a task to agents: who speaks, what each sees, how each
answer is parsed and rewarded.
"""
