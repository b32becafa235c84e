"""Every error a command turns into one line (`cli.fail`), in one place at the bottom of the package:
any module may raise them without importing anything above it.

A `UsageError` (and its kin) is something a user can fix, reported before anything is written or
compiled (exit 2); a `RunStopped` is a run that ends early on purpose, with its own line and exit code.
"""
from __future__ import annotations


class UsageError(ValueError):
    """A command line, file or checkpoint a user can fix; the message says what and where."""


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key."""


class CheckpointError(ValueError):
    """A checkpoint that does not match what the model expects, or one that cannot be found."""


class DataError(ValueError):
    """A data source that cannot be read as asked (one line, no traceback)."""


class NotWritable(ValueError):
    """An output path this process cannot write (found before any work is done)."""


class OutputExists(UsageError, FileExistsError):
    """An output directory that exists and is not empty, with no leave to replace it."""


class RewardError(UsageError):
    """A reward (a workflow's, or the user's reward function's) that is not a finite number; the message
    names the value and where it came from."""


class WorkdirBusy(UsageError):
    """A workdir another run writes to (one writer per workdir)."""


class LogWriteError(Exception):
    """A metrics, episodes or TensorBoard file that could not be written (disk full, read-only); names it
    and the cause in one line."""


class UnknownName(KeyError):
    """A name no variant is registered under; the message names the config key and the choices."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class StageTimeout(RuntimeError):
    """A stage ran longer than its limit (system.stage_timeout_s): a hung device call or sandbox wait."""


class RunStopped(Exception):
    """A run that ends early on purpose: `message` is printed as is (one line), the process exits with `code`.
    `hard`: exit at once after printing (a thread is stuck in a device or sandbox call, which the
    interpreter's shutdown would abort on)."""

    def __init__(self, message: str, code: int, hard: bool = False):
        super().__init__(message)
        self.code = code
        self.hard = hard

    @staticmethod
    def by_signal(signal_name: str, code: int, done: int, kept: int | None) -> "RunStopped":
        """A run stopped by a signal after step `done`, its newest checkpoint `kept`."""
        what = f"checkpoint {kept} saved" if kept == done and done else \
            (f"last checkpoint {kept}" if kept else "no checkpoint yet")
        return RunStopped(f"stopped by {signal_name} at step {done}; {what}; run the same command to resume", code)
