"""Run untrusted, model-written Python in a separate, limited process.

`run_python(code, stdin, limits) -> RunResult` never raises: every failure
(timeout, memory, output flood, a crash of the sandbox itself) is a field of
the result. `run_many` runs programs concurrently in a bounded thread pool
(each thread waits on one child process) and returns results in input order.

Layers, outermost first:
- the trainer side: a fresh temporary working directory (removed afterwards),
  an empty environment (only PATH, LANG, HOME=TMPDIR=workdir and thread caps),
  `python -I` (isolated mode), stdin from a file, its own session so the whole
  process group is SIGKILLed at the wall-clock limit or when output passes the
  byte cap, and always once the run ends (stragglers);
- the child side (`sandbox_boot.py`): user, PID, network and mount namespaces
  when available; a private root holding only the Python install, its shared
  libraries and the working directory (`sandbox_fs.py`); rlimits (CPU,
  address space, file size, processes, no core); an audit hook that refuses
  sockets, fork/exec, signals to others, writes outside the working directory
  and reads outside it and the Python install. Root is not bound by
  RLIMIT_NPROC, so fork bombs are stopped by the hook (fork/exec refused) and,
  failing that, by the PID namespace (its init's death kills everything in it)
  and the group kill.

What the program may read is listed once per trainer process
(`filesystem_plan`, by a probe child). `RunResult.isolation` says which layer
kept the rest of the machine out of reach: "mount-namespace" (it does not
exist for the program) or "audit-hook" (the kernel refused the namespaces, or
`Limits.filesystem_isolation` is off: the hook refuses reads outside the plan).

Compared with the reference system (a subprocess with a timeout), a runaway
program cannot keep children alive, flood memory or output, touch the network,
read the machine's files (credentials, the repository) or the trainer's
environment, or signal the trainer.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from atgrpo_jax.envs.sandbox_boot import BLOCKED_MODULES, MEMORY_EXIT_CODE

_FS_SOURCE = (Path(__file__).parent / "sandbox_fs.py").read_text()
_BOOT_SOURCE = _FS_SOURCE + "\n\n" + (Path(__file__).parent / "sandbox_boot.py").read_text()
_PROBE_SOURCE = _FS_SOURCE + f"\n\nimport json\nprint(json.dumps(filesystem_plan(skip={BLOCKED_MODULES!r})))\n"
_READ_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-run limits. wall_s is the paper's tool-agent timeout (20 s)."""

    wall_s: float = 20.0  # wall clock, measured from process start
    cpu_s: float = 20.0  # RLIMIT_CPU (rounded up to whole seconds)
    memory_mb: int = 1024  # RLIMIT_AS, address space of the program
    max_output_bytes: int = 1 << 20  # cap on stdout (and on stderr); the run is killed past it
    # RLIMIT_NPROC: binds non-root users only and counts all their processes and threads (the
    # trainer's too), so it is a coarse backstop; fork/exec are refused by the audit hook anyway.
    max_processes: int = 512
    max_file_mb: int = 16  # RLIMIT_FSIZE, largest file the program may write
    # all files of the working directory together (a tmpfs of this size in the private root; the
    # audit-hook fallback has only max_file_mb per file); 0 = no total limit
    max_disk_mb: int = 64
    stderr_tail_bytes: int = 4096  # how much of the end of stderr is kept
    namespaces: bool = True  # try user/PID/network namespaces (falls back silently)
    # a private root (mount namespace) holding only Python and the working directory; when off or
    # refused by the kernel, the audit hook alone refuses reads elsewhere (RunResult.isolation)
    filesystem_isolation: bool = True


@dataclasses.dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr_tail: str
    exit_code: int | None  # None when killed by a signal or never started
    timed_out: bool  # wall clock or CPU limit reached
    memory_exceeded: bool
    output_truncated: bool  # stdout or stderr passed max_output_bytes (the run was killed)
    killed_signal: int | None
    wall_s: float
    sandbox_error: str = ""  # the sandbox itself failed (e.g. could not start a process)
    # what kept the machine's files out of reach: "mount-namespace" (a private root) or
    # "audit-hook" (reads outside the working directory and Python refused); "" if never known
    isolation: str = ""

    @property
    def ok(self) -> bool:
        """The program ran to completion and exited with status 0."""
        return self.exit_code == 0 and not (self.timed_out or self.output_truncated or self.sandbox_error)

    @property
    def as_reference_reports(self) -> str:
        """The run's output as the reference system hands it to its parsers: "timeout", or with
        anything on stderr (a warning too) "error: STDERR\n\nSTDOUT:\nSTDOUT", else stdout."""
        if self.timed_out:
            return "timeout"
        if self.stderr_tail.strip():
            return f"error: {self.stderr_tail}\n\nSTDOUT:\n{self.stdout}"
        return self.stdout


def _child_env(workdir: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    env.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _live_members(pgid: int) -> bool:
    """Any process of the group that is not a zombie (zombies hold no resources)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError, OSError):
        return False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """SIGKILL is asynchronous: wait (bounded) until no live member of the group is left.

    An orphaned member killed with the group becomes a zombie of PID 1; it is not ours to reap.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _live_members(pgid):
        time.sleep(0.002)


def _has_exited(pid: int) -> bool:
    """True once `pid` is a zombie; does not reap it (the group stays addressable)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _open_pidfd(pid: int):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class _Output:
    """stdout up to a cap; the last bytes of stderr."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.stdout = bytearray()
        self.stderr_tail = bytearray()
        self.stderr_total = 0
        self.truncated = False

    def add(self, stream: str, chunk: bytes) -> None:
        cap = self.limits.max_output_bytes
        if stream == "stdout":
            room = cap - len(self.stdout)
            self.stdout += chunk[:max(room, 0)]
            self.truncated |= len(chunk) > room
        else:
            self.stderr_total += len(chunk)
            self.stderr_tail = (self.stderr_tail + chunk)[-self.limits.stderr_tail_bytes:]
            self.truncated |= self.stderr_total > cap


def _collect(proc: subprocess.Popen, limits: Limits, started: float) -> RunResult:
    """Read both pipes until the program ends, the deadline passes or output overflows."""
    out = _Output(limits)
    deadline = started + limits.wall_s
    pidfd = _open_pidfd(proc.pid)
    exited = False
    timed_out = False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        open_streams = 2
        while open_streams and not out.truncated:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            wait = remaining if pidfd is not None else min(remaining, 0.02)
            for key, _ in sel.select(timeout=wait):
                if key.data == "exit":
                    sel.unregister(key.fileobj)
                    exited = True
                    continue
                chunk = os.read(key.fileobj.fileno(), _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                else:
                    out.add(key.data, chunk)
            if not exited and pidfd is None:
                exited = _has_exited(proc.pid)
            if exited and open_streams:
                _kill_group(proc.pid)  # the leader is gone: whatever still holds a pipe goes too
        # Pipes closed: give the leader until the deadline to exit.
        while not timed_out and not out.truncated and not _has_exited(proc.pid):
            if time.monotonic() >= deadline:
                timed_out = True
            else:
                time.sleep(0.002)
    if pidfd is not None:
        os.close(pidfd)
    _kill_group(proc.pid)  # before reaping, so the group id cannot have been reused
    returncode, cpu_used = _reap(proc)
    _wait_group_gone(proc.pid, timeout_s=1.0)
    proc.stdout.close()
    proc.stderr.close()
    killed = -returncode if returncode < 0 else None
    exit_code = returncode if returncode >= 0 else None
    stderr_tail = out.stderr_tail.decode("utf-8", errors="replace")
    return RunResult(
        stdout=out.stdout.decode("utf-8", errors="replace"),
        stderr_tail=stderr_tail,
        exit_code=exit_code,
        # SIGXCPU at the soft CPU limit, or SIGKILL at the hard one if SIGXCPU was ignored.
        timed_out=timed_out or killed == signal.SIGXCPU or (killed is not None and cpu_used >= limits.cpu_s),
        memory_exceeded=exit_code == MEMORY_EXIT_CODE and "MemoryError" in stderr_tail,
        output_truncated=out.truncated,
        killed_signal=killed,
        wall_s=time.monotonic() - started,
    )


def _reap(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for the child; its return code (negative: signal) and CPU seconds (with reaped descendants)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(func, failed_path, _exc):
        try:
            os.chmod(os.path.dirname(failed_path), 0o700)
            os.chmod(failed_path, 0o700)
            func(failed_path)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)


def _failure(message: str, started: float) -> RunResult:
    return RunResult("", "", None, False, False, False, None, time.monotonic() - started, sandbox_error=message)


_PLAN_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _probe_plan() -> dict:
    probe_dir = os.path.realpath(tempfile.mkdtemp(prefix="atgrpo-sandbox-probe-"))
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _PROBE_SOURCE], cwd=probe_dir, env=_child_env(probe_dir),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    finally:
        _remove_tree(probe_dir)
    if done.returncode != 0:
        raise RuntimeError(f"the probe exited with {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
    return json.loads(done.stdout)


def filesystem_plan() -> dict:
    """What a sandboxed program may read: {"dirs", "files", "links", "devices"}
    (`sandbox_fs.filesystem_plan`). Listed once per process, by a probe child started like a
    sandboxed run (about a second: it imports numpy, sympy and every standard extension module).
    Shared: do not modify."""
    with _PLAN_LOCK:
        return _probe_plan()


def _read_isolation(report_fd: int, limits: Limits) -> str:
    """The layer the child reported ("" if it never got that far); a warning if a private root
    was asked for and refused."""
    os.set_blocking(report_fd, False)
    try:
        report = os.read(report_fd, 1024).decode("utf-8", errors="replace")
    except BlockingIOError:  # a killed straggler still holds the pipe
        report = ""
    layer, _, reason = report.partition("\n")
    if layer == "audit-hook" and limits.namespaces and limits.filesystem_isolation:
        warnings.warn(f"sandbox: no private root for model-written code ({reason}); only the audit hook "
                      "refuses reads outside the working directory and Python", RuntimeWarning, stacklevel=3)
    return layer if layer in ("mount-namespace", "audit-hook") else ""


def run_python(code: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Run `code` as a Python program with `stdin`; never raises."""
    limits = limits or Limits()
    try:
        plan = filesystem_plan()  # (the first call's probe does not count against the wall clock)
    except Exception as exc:  # noqa: BLE001
        return _failure(f"sandbox failure: cannot list the files Python needs: {exc!r}", time.monotonic())
    started = time.monotonic()
    try:
        workdir = os.path.realpath(tempfile.mkdtemp(prefix="atgrpo-sandbox-"))
    except Exception as exc:  # noqa: BLE001 - anything becomes a result
        return _failure(f"cannot create a working directory: {exc!r}", started)
    report_read = report_write = -1
    try:
        Path(workdir, "main.py").write_text(str(code), encoding="utf-8", errors="replace")
        stdin_path = Path(workdir, ".stdin")
        stdin_path.write_text(str(stdin), encoding="utf-8", errors="replace")
        report_read, report_write = os.pipe()  # the child writes the isolation layer here, then closes it
        config = json.dumps({**dataclasses.asdict(limits), "workdir": workdir, "filesystem": plan,
                             "report_fd": report_write})
        argv = [sys.executable, "-I", "-c", _BOOT_SOURCE, config]
        with open(stdin_path, "rb") as stdin_file:
            proc = subprocess.Popen(
                argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir,
                env=_child_env(workdir), start_new_session=True, close_fds=True, pass_fds=(report_write,))
        os.close(report_write)
        report_write = -1
        try:
            result = _collect(proc, limits, started)
        except BaseException:
            _kill_group(proc.pid)
            _reap(proc)
            raise
        return dataclasses.replace(result, isolation=_read_isolation(report_read, limits))
    except Exception as exc:  # noqa: BLE001
        return _failure(f"sandbox failure: {exc!r}", started)
    finally:
        for fd in (report_read, report_write):
            if fd >= 0:
                os.close(fd)
        _remove_tree(workdir)


def run_many(
    codes: Sequence[str],
    stdins: Sequence[str] | None = None,
    limits: Limits | None = None,
    max_workers: int | None = None,
) -> list[RunResult]:
    """run_python over many programs, at most max_workers at a time, in input order."""
    codes = list(codes)
    stdins = [""] * len(codes) if stdins is None else list(stdins)
    if len(stdins) != len(codes):
        raise ValueError(f"run_many: {len(codes)} programs but {len(stdins)} stdins")
    if not codes:
        return []
    workers = max(1, min(len(codes), max_workers or (os.cpu_count() or 1)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda pair: run_python(pair[0], pair[1], limits), zip(codes, stdins)))
