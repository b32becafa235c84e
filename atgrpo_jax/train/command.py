"""The shape of a command that trains in a workdir (`train`, `sft`): its flags and its main.

The config is read and checked first, then the (slow) training module is imported, so a bad key is
refused in about a second.
"""
from __future__ import annotations

import importlib
import types

from absl import flags

from atgrpo_jax import cli
from atgrpo_jax.train.progress import say


def workdir_main(name: str, runner: str, not_read: dict[str, str] | None = None):
    """`main(f, overrides)` of the command `name`; `runner` ("module:function") takes (config, workdir,
    allow_config_change=, fresh_if_unreadable=, new_history=). not_read: a key (or a "section." prefix) the command
    ignores -> what it reads instead; giving one is an error saying so, before any work."""
    def main(f, overrides=()):
        """The command (run by `cli.command`: flags parsed, errors as one line)."""
        if not f.workdir.value:
            raise cli.UsageError("--workdir is required")
        for key, _ in overrides:
            instead = next((v for k, v in (not_read or {}).items() if key == k or (k.endswith(".") and
                                                                                   key.startswith(k))), None)
            if instead:
                raise cli.UsageError(f"--config.{key}: `{name}` does not read it; {instead}")
        config = cli.config_from_args(f.config.value, overrides)
        say(f"{name} {f.config.value} in {f.workdir.value}: loading jax and the trainer")
        module, function = runner.split(":")
        run = getattr(importlib.import_module(module), function)
        run(config, f.workdir.value, allow_config_change=f.allow_config_change.value,
            fresh_if_unreadable=f.fresh_if_unreadable.value, new_history=f.new_history.value)
    return main


def workdir_flags(config_help: str = ""):
    """The command's flags function (defined when it runs, so importing a module defines none)."""
    def define() -> types.SimpleNamespace:
        return types.SimpleNamespace(
            config=flags.DEFINE_string("config", None, "config file configs/X.py[:ARG]; set its keys with "
                                       "--config.KEY=VALUE" + config_help),
            workdir=flags.DEFINE_string("workdir", None, "directory or gs:// URL for checkpoints, metrics and "
                                        "TensorBoard"),
            allow_config_change=flags.DEFINE_bool("allow_config_change", False, "resume a run with a config that "
                                                  "differs from its own (its config.json is kept as "
                                                  "config.step<N>.json)"),
            fresh_if_unreadable=flags.DEFINE_bool("fresh_if_unreadable", False, "when no checkpoint of the workdir "
                                                  "restores, start again from step 0 (they are moved to "
                                                  "checkpoints.unreadable/) instead of stopping"),
            new_history=flags.DEFINE_bool("new_history", False, "resume even when metrics.jsonl is missing or "
                                          "damaged: start a new one (the damaged one kept beside it, with a note "
                                          "saying where the new one begins) instead of stopping"))
    return define
