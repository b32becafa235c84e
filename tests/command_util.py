"""A workdir command (`train`, `sft`) run in this process: the main its command line runs, under the same
one-line error handler (`cli.fail`), without a new start of python and jax. A test keeps one case of a
command through a real process (its flag parsing and exit status) and sends the rest through this."""
import types

import pytest

from atgrpo_jax import cli


def exit_and_stderr(main, argv, capsys) -> tuple[int, list[str]]:
    """(exit status, stderr lines) of `main` given a command line (`--config=`, `--workdir=`, `--config.KEY=V`)
    that fails as a user's mistake does."""
    overrides, rest = cli.pop_overrides(["command", *argv])
    values = dict(arg[2:].split("=", 1) for arg in rest[1:])
    flag = lambda name, default=None: types.SimpleNamespace(value=values.get(name, default))  # noqa: E731
    f = types.SimpleNamespace(config=flag("config"), workdir=flag("workdir"),
                              allow_config_change=flag("allow_config_change", False),
                              fresh_if_unreadable=flag("fresh_if_unreadable", False),
                              new_history=flag("new_history", False))
    with pytest.raises(SystemExit) as stop:
        with cli.fail():
            main(f, overrides)
    return stop.value.code, capsys.readouterr().err.strip().splitlines()
