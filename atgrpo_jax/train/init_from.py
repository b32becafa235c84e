"""model.init_from: the weights of another run's newest checkpoint as a new run's starting model
(an sft warm start, docs/guides/sft.md, or any run of one full policy).

Only the params of that run's policy are read (orbax's partial restore: its optimizer state stays on
disk), each into the new model's dtype and sharding, so a float32-master run starts a bfloat16 one.
"""
from __future__ import annotations

from atgrpo_jax import workdir as wd
from atgrpo_jax.errors import ConfigError
from atgrpo_jax.train import manifest
from atgrpo_jax.train.checkpoint import Checkpointer, _abstract, short_cause
from atgrpo_jax.train.orbax_quiet import quiet_orbax

KEY = "config.model.init_from"


def source_checkpoint(source: str, key: str = KEY) -> tuple[str, int, str]:
    """(checkpoint directory, newest step, policy name) of the run in `source`; a ConfigError naming `key`
    (where `source` was given: config.model.init_from, or a role's) says why not."""
    from absl import logging as absl_logging


    directory = wd.checkpoint_dir(source)
    if not wd.isdir(source) or not wd.exists(directory):
        raise ConfigError(f"{key}: {source} is not a run's workdir (no checkpoints/ in it): give the --workdir "
                          "of an sft or train run")
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax warns of the items a listing of names does not read
    reader = Checkpointer(directory, keep_last=0, best_metric=None, read_only=True)
    try:
        step = reader.latest_step()
        if step is None:
            raise ConfigError(f"{key}: {source} holds no complete checkpoint yet")
        names = reader.saved_names(step)
    finally:
        reader.close()
        absl_logging.set_verbosity(verbosity)
    full = [n for n in names if not n.startswith("lora_")]
    if len(full) != 1:
        what = "LoRA adapters only (their base is that run's model.hf_path)" if not full else \
            f"{len(full)} policies ({', '.join(full)})"
        raise ConfigError(f"{key}: {source} holds {what}, not one full model: export the one to start from "
                          "(python -m atgrpo_jax.export --policy=NAME) and set model.hf_path to it")
    return directory, step, full[0]


def load_weights(model, source: str, key: str = KEY):
    """`model` (a Qwen3 on its mesh) with the weights of the newest checkpoint of the run in `source`
    (errors name `key`)."""
    import orbax.checkpoint as ocp
    from flax import nnx


    directory, step, name = source_checkpoint(source, key)
    graphdef, state = nnx.split(model)
    target = {name: {"params": _abstract(state)}}  # a TrainState's params, saved under the policy's name
    try:
        manifest.verify(wd.join(directory, str(step)), step)
    except manifest.CheckpointDamaged as e:
        raise ConfigError(f"{key}: checkpoint {step} of {source} is damaged ({e})") from None
    quiet_orbax()
    reader = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())  # the step's "state" item alone
    try:
        restored = reader.restore(wd.join(directory, str(step), "state"), args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
        raise ConfigError(f"{key}: checkpoint {step} of {source} does not fit this model ({short_cause(e)}): "
                          "model.preset, model.hf_path and model.vocab_size must be the run's") from None
    finally:
        reader.close()
    return nnx.merge(graphdef, restored[name]["params"])
