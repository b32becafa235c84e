"""One writer per workdir: a second `train` on a workdir another run is writing to is refused in one
line that names the holder; evaluate and export only read, and take no lock.

A local workdir is locked with the OS (`fcntl.flock` on WORKDIR/train.lock, which holds the holder's
host, pid and start time): a killed process frees it with its file descriptors, and the next run
takes it over with a notice naming the run that left it. An object-store workdir (gs://, s3://) has
no such lock, so it gets a lease: WORKDIR/train.lock holds the holder and a heartbeat a thread
renews; a lease whose heartbeat is older than LEASE_S is stale and is taken over, with a notice.
Two runs that start within a moment of each other on a store both write the lease; each reads it
back after SETTLE_S and the one that does not find itself there stops.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import threading
import time

from atgrpo_jax import workdir as wd
from atgrpo_jax.errors import NotWritable, WorkdirBusy

LOCK_FILE = "train.lock"
HEARTBEAT_S = 30.0  # a store lease's renewal period
LEASE_S = 120.0  # a store lease older than this is a dead run's
SETTLE_S = 2.0  # how long two runs starting at once wait to see whose lease stands


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "heartbeat": time.time()}


def _describe(h: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("started", 0)))
    return f"pid {h.get('pid')} on {h.get('host')} (since {when})"


class WorkdirLock:
    """Held from `acquire` to `release` (also a context manager). `notice` is the line to print when a
    dead run's lock was taken over ("" otherwise)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = wd.join(workdir, LOCK_FILE)
        self.notice = ""
        self._created = False
        self._fd: int | None = None
        self._me: dict | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> "WorkdirLock":
        self._created = not wd.exists(self.workdir)  # a run that fails before writing leaves no folder behind
        try:
            wd.makedirs(self.workdir)
            if wd.is_remote(self.workdir):
                self._lease()
            else:
                self._flock()
        except OSError as e:  # a full disk, a read-only one: one line, the workdir as it was
            self.release()
            if self._created and os.path.isdir(self.workdir) and os.listdir(self.workdir) in ([], [LOCK_FILE]):
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise NotWritable(f"--workdir {self.workdir}: cannot write its lock {LOCK_FILE} "
                              f"({e.strerror or e})") from None
        return self

    def _flock(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fd = fd  # (released by acquire if what follows fails)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            self._fd = None
            raise WorkdirBusy(f"--workdir {self.workdir} is in use by another run: {_describe(holder)}. "
                              "Wait for it to end (or stop it), or give another --workdir") from None
        before = _read(fd)
        if before:
            self.notice = f"took over {self.path} from {_describe(before)}, which is no longer running"
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def _lease(self):
        before = _read_lease(self.path)
        if before and time.time() - before.get("heartbeat", 0) < LEASE_S:
            raise WorkdirBusy(f"--workdir {self.workdir} is in use by another run: {_describe(before)} (its lease "
                              f"was renewed {time.time() - before['heartbeat']:.0f} s ago). Wait for it to end "
                              "(or stop it), or give another --workdir")
        if before:
            self.notice = (f"took over {self.path} from {_describe(before)}, whose lease ran out "
                           f"{time.time() - before.get('heartbeat', 0):.0f} s ago")
        self._me = _holder()
        wd.write_text(self.path, json.dumps(self._me))
        time.sleep(SETTLE_S)
        now = _read_lease(self.path)
        if now != self._me:
            raise WorkdirBusy(f"--workdir {self.workdir}: another run ({_describe(now or {})}) started on it at the "
                              "same time and holds it; give another --workdir")
        self._beat = threading.Thread(target=self._renew, name="workdir-lease", daemon=True)
        self._beat.start()

    def _renew(self):
        while not self._stop.wait(HEARTBEAT_S):
            self._me = dict(self._me, heartbeat=time.time())
            try:
                wd.write_text(self.path, json.dumps(self._me))
            except OSError:  # a store hiccup: the next beat tries again, well within LEASE_S
                pass

    def release(self):
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # nobody holds it now: the next run needs no notice
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            if self._created and os.listdir(self.workdir) == [LOCK_FILE]:  # nothing else was written: as before
                os.remove(self.path)
                os.rmdir(self.workdir)
        if self._beat is not None:
            self._stop.set()
            self._beat.join(timeout=5)
            self._beat = None
            try:
                if _read_lease(self.path) == self._me:
                    wd.as_epath(self.path).unlink()
            except OSError:
                pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _read(fd: int) -> dict:
    try:
        data = os.pread(fd, 4096, 0)
        return json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?"}


def _read_lease(path: str) -> dict | None:
    try:
        return json.loads(wd.as_epath(path).read_text()) if wd.exists(path) else None
    except (OSError, ValueError):
        return None
