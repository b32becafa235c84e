"""What every command shares: a config file plus `--config.KEY=VALUE` overrides, and one-line errors.

    python -m atgrpo_jax.train --config=configs/demo.py[:ARG] --workdir=runs/x --config.rollout.k=4

`--config.*` overrides are taken out of argv before absl parses the other flags, so a
misspelt key is one line naming it and the closest valid key, not a traceback. A value
is read as the type of the key's default (bool: true/false/1/0/yes/no; tuples and lists as
Python literals); keys under `env.kwargs` may be new (a Python literal, else a string), and
`--config.env.kwargs={}` replaces the whole section.
Every absl command (`python -m atgrpo_jax.{train,sft,evaluate,export,ablate}`) has the same shape:
its module defines `_flags()` (run only when the command runs, so importing the module defines no
flag) and `main(f, overrides)`, and ends with `cli.command(main, _flags)`.
`fail` turns the errors a user can fix (a bad config, file or checkpoint) into one line on
stderr and exit status 2, before anything is written or compiled; a run that stops on
purpose (a signal, divergence, a failed save: `RunStopped`) prints its line and exits with its code.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import math
import os
import sys
from typing import Iterator, Sequence

import ml_collections

from atgrpo_jax.errors import (CheckpointError, ConfigError, DataError, NotWritable, RunStopped, StageTimeout,
                               UnknownName, UsageError)
from atgrpo_jax.registry import closest

EXIT_USAGE = 2
OPEN_SECTIONS = ("env.kwargs", "rollout.agents", "algo.role_advantage", "policy.role_optim",
                 "policy.role_models")  # sections whose keys the user chooses




def finite_json(obj):
    """A copy of `obj` with every NaN or inf float (numpy ones too) replaced by None: JSON has no NaN."""
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy / jax scalars
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj, **kwargs) -> str:
    """json.dumps that never writes NaN (non-finite numbers become null)."""
    return json.dumps(finite_json(obj), allow_nan=False, **kwargs)


def pop_overrides(argv: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(overrides [(key, value)], the rest of argv) from `--config.KEY=VALUE` / `--config.KEY VALUE`."""
    overrides, rest, args = [], [], list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--config.") and arg != "--config.":
            key, eq, value = arg[len("--config."):].partition("=")
            if not eq:
                if i + 1 >= len(args):
                    raise UsageError(f"--config.{key} needs a value (--config.{key}=VALUE)")
                i, value = i + 1, args[i + 1]
            overrides.append((key, value))
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def packaged_config(path: str) -> str | None:
    """The installed copy of `configs/NAME.py` (atgrpo_jax.configs: setup.py installs the folder, a
    namespace package), for a working directory without a configs/ of its own; None if there is none."""
    head, name = os.path.split(os.path.normpath(path))
    if os.path.basename(head) != "configs":
        return None
    try:
        spec = importlib.util.find_spec("atgrpo_jax.configs")
    except ModuleNotFoundError:
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def load_config(spec: str) -> ml_collections.ConfigDict:
    """The ConfigDict of `path.py` (its get_config()) or `path.py:ARG` (get_config(ARG))."""
    if not spec:
        raise UsageError("--config=configs/X.py is required")
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        path = packaged_config(path) or path
    if not os.path.isfile(path):
        raise UsageError(f"--config: no such file {path!r}")
    module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3] or "config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise UsageError(f"--config: {path} has no get_config()")
    config = module.get_config(arg) if arg else module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise UsageError(f"--config: {path}:get_config() returned {type(config).__name__}, not a ConfigDict")
    return config


def leaf_keys(c: ml_collections.ConfigDict, prefix: str = "") -> Iterator[str]:
    for key, value in c.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _parse_value(key: str, text: str, default):
    """`text` as the type of `default` (the key's current value)."""
    if isinstance(default, bool):
        low = text.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise UsageError(f"--config.{key}={text}: not a bool (true/false)")
    if isinstance(default, (int, float)):
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"--config.{key}={text}: not a number") from None
        if isinstance(default, int):
            if not value.is_integer():
                raise UsageError(f"--config.{key}={text}: must be an integer")
            return int(value)
        return value
    if isinstance(default, str):
        return text
    if isinstance(default, (tuple, list)):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = tuple(x.strip() for x in text.split(",") if x.strip())
        if not isinstance(value, (tuple, list)):
            value = (value,)
        return type(default)(value)
    return _literal(text)


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[tuple[str, str]]):
    """Set each dotted key; an unknown key is a UsageError naming the closest valid one."""
    known = list(leaf_keys(config))
    for key, text in overrides:
        *parents, leaf = key.split(".")
        node = config
        for i, name in enumerate(parents):
            if isinstance(node, ml_collections.ConfigDict) and name not in node and \
                    ".".join(parents[:i]) in OPEN_SECTIONS:  # a new entry of an open section: rollout.agents.NAME
                with node.unlocked():
                    node[name] = ml_collections.ConfigDict()
            if not isinstance(node, ml_collections.ConfigDict) or name not in node:
                node = None
                break
            node = node[name]
        section = ".".join(parents)
        in_open = any(section == s or section.startswith(s + ".") for s in OPEN_SECTIONS)
        if isinstance(node, ml_collections.ConfigDict) and in_open and leaf not in node:
            with node.unlocked():
                node[leaf] = _literal(text)
            continue
        if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
            raise UsageError(f"--config.{key}: no such key{closest(key, known)}")
        if key in OPEN_SECTIONS and isinstance(_literal(text), dict):  # a whole open section: --config.env.kwargs={}
            with node.unlocked():
                node[leaf] = ml_collections.ConfigDict(_literal(text))
            continue
        if isinstance(node[leaf], ml_collections.ConfigDict):
            raise UsageError(f"--config.{key} is a section; set one of its keys: "
                             f"{', '.join(f'{key}.{k}' for k in node[leaf])}")
        value = _parse_value(key, text, node[leaf])
        with node.unlocked():
            node[leaf] = value
    return config


def config_from_args(spec: str, overrides: Sequence[tuple[str, str]]) -> ml_collections.ConfigDict:
    config = apply_overrides(load_config(spec), overrides)
    config.lock()
    return config


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl's flags of a command (app.run's flags_parser): an unknown flag, a bad value or an extra
    argument is one line and exit 2, as a bad config key is (not absl's two-line FATAL and exit 1)."""
    from absl import flags

    try:
        rest = flags.FLAGS(list(argv))
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if len(rest) > 1:
        print(f"error: unexpected arguments: {' '.join(rest[1:])}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return rest


def command(main, define_flags, log_level: str = "warning"):
    """Run an absl command: define its flags, take the `--config.*` overrides out of argv, then
    main(flags, overrides) under `fail`; extra positional arguments are a usage error. The log
    level is warning: orbax logs every save and restore at info."""
    from absl import app, logging

    f = define_flags()
    with fail():
        overrides, argv = pop_overrides(sys.argv)

    def run(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        logging.set_verbosity(log_level)
        with fail():
            return main(f, overrides)

    app.run(run, argv=argv, flags_parser=parse_flags)


@contextlib.contextmanager
def fail():
    """Errors a user can fix -> one line on stderr and exit status 2 (no traceback)."""
    try:
        yield
    except RunStopped as e:
        print(str(e), file=sys.stderr, flush=True)
        if e.hard:
            sys.stdout.flush()
            os._exit(e.code)
        raise SystemExit(e.code) from None
    except StageTimeout as e:  # (evaluate; the trainer says more) a thread is stuck: exit without waiting on it
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    except (UsageError, ConfigError, CheckpointError, DataError, UnknownName, FileNotFoundError, NotADirectoryError,
            FileExistsError, ImportError, NotWritable) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
