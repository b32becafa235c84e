"""Orbax's noise, kept from the user's console: the logs it writes for every save and restore, and
the leftovers of a failed save or restore (tracebacks from tensorstore's native threads calling into
orbax's closed event loop, coroutines never awaited). Each failure itself is reported in one line
by checkpoint.py; installed by its Checkpointer."""
from __future__ import annotations

import logging
import os
import sys
import warnings

# orbax's coroutines that a failed save or restore was seen to leave unawaited until interpreter exit,
# when only a coroutine's name is left to tell whose it is (its restore's array reads, its metadata
# reads, its fragment writes); before exit each is told apart by where its code lives
ORBAX_EXIT_LEFTOVERS = ("_read_array_index_and_device_put", "_get_array_metadatas", "write_fragment")


def _orbax_coroutine(coro) -> bool:
    """Whether a coroutine object is orbax's own (its code lives in the orbax package)."""
    return f"{os.sep}orbax{os.sep}" in getattr(getattr(coro, "cr_code", None), "co_filename", "")


class _QuietOrbax(logging.Filter):
    """Drops orbax's log records that repeat an error this module raises as one line (a failed
    background save logs its traceback from every thread it passes through) and its warning
    that a save has no tracked metric (most steps are not evaluated)."""

    def filter(self, record):
        if "orbax" not in record.pathname:
            return True
        if record.levelno >= logging.ERROR and (record.exc_info or "raised an exception" in record.getMessage()
                                                 or "failed" in record.getMessage().lower()):
            return False
        message = record.getMessage()  # and what a read-only manager (evaluate, export) says it is, every time
        return not any(m in message for m in ("did not provide metrics", "read_only=True", "directory is read only"))


_QUIET = _QuietOrbax()


def quiet_orbax():
    for name in ("absl", "orbax"):
        if _QUIET not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_QUIET)


def _called_from_c(tb) -> bool:
    """Whether a traceback starts in asyncio's call_soon_threadsafe: a call from another library's
    native thread (tensorstore completing orbax's I/O), not from any Python code."""
    return tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe"


def orbax_leftover(u) -> bool:
    """Whether an unraisable exception (sys.unraisablehook's argument) is one of a failed orbax
    save's or restore's leftovers: a coroutine of orbax never awaited, or a late call into its
    closed event loop from a native thread."""
    coroutine = _orbax_coroutine(u.object)
    closed = (isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"
              and _called_from_c(u.exc_traceback))
    return coroutine or closed


def quiet_orbax_leftovers() -> None:
    """When a save or a restore fails, orbax closes its event loop while tensorstore still completes
    its other reads and writes from native threads: each prints a traceback ('Event loop is closed'
    through sys.excepthook, a coroutine never awaited, a task exception never retrieved), after the
    failure was reported in one line. Drop exactly those, from the first Checkpointer on (they can
    come before the error reaches the caller)."""
    if getattr(sys.excepthook, "quiet_orbax", False):
        return
    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

    def quiet_excepthook(kind, value, tb):
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed" and _called_from_c(tb)):
            excepthook(kind, value, tb)

    def quiet_unraisablehook(u):
        if not orbax_leftover(u):
            unraisablehook(u)

    quiet_excepthook.quiet_orbax = True
    sys.excepthook, sys.unraisablehook = quiet_excepthook, quiet_unraisablehook
    # the same leftover as a RuntimeWarning ("coroutine '...' was never awaited"): Python hands each
    # such coroutine to warnings._warn_unawaited_coroutine, where orbax's own are dropped by where
    # their code lives; at interpreter exit ("sys:1: ...") that hook is gone and only the name is left
    warn = getattr(warnings, "_warn_unawaited_coroutine", None)
    if warn is not None and not getattr(warn, "quiet_orbax", False):
        def quiet_warn(coro):
            if not _orbax_coroutine(coro):
                warn(coro)

        quiet_warn.quiet_orbax = True
        warnings._warn_unawaited_coroutine = quiet_warn
    warnings.filterwarnings("ignore", category=RuntimeWarning, message=(
        rf"coroutine '(?:[\w.<>]+\.)?(?:{'|'.join(ORBAX_EXIT_LEFTOVERS)})' was never awaited"))
    logging.getLogger("asyncio").addFilter(lambda r: "exception was never retrieved" not in r.getMessage())
