"""Child-side bootstrap of the sandbox: runs before the untrusted program.

`sandbox.run_python` starts `python -I -c <this file's source> <config json>`
in a fresh working directory holding `main.py` (the program). It is never
imported by the trainer. In order, it:

1. enters new PID and network namespaces when the kernel allows it (as root
   directly, otherwise through a user namespace that maps the caller's uid to
   itself). In a PID namespace the program runs as PID 2 under a tiny init
   (PID 1); when anything ends the init, the kernel kills every process in the
   namespace, so nothing forked can outlive the run, and the trainer's PID is
   not even visible. The network namespace has only a down loopback: sockets
   reach nothing;
2. sets resource limits (CPU seconds, address space, file size, processes,
   no core files);
3. installs an audit hook (PEP 578) that refuses sockets, fork/exec/spawn,
   signals to other processes, writes outside the working directory, reads of
   other processes' /proc entries, raising limits and foreign-function calls.
   Audit hooks are not a security boundary on their own; they are the layer
   that makes ordinary attempts fail fast, with a clear error, when the
   namespaces are unavailable;
4. runs `main.py` as `__main__`.

Exit statuses are relayed from the program to the process the trainer waits
for: the same exit code, or death by the same signal. MemoryError exits with
MEMORY_EXIT_CODE.
"""
MEMORY_EXIT_CODE = 99


def _enter_namespaces(os):
    """unshare(PID|NET), through a user namespace when not root. True on success."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        new_user, new_pid, new_net = 0x10000000, 0x20000000, 0x40000000
        if os.geteuid() == 0:
            return libc.unshare(new_pid | new_net) == 0
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(new_user | new_pid | new_net) != 0:
            return False
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        return True
    except Exception:
        return False


def _set_death_signal(os):
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:
        pass


def _relay_status(os, signal, status_text):
    """Exit like the program did: same code, or killed by the same signal."""
    kind, value = status_text[:1], int(status_text[1:] or 1)
    if kind == "S":
        try:
            signal.signal(value, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), value)
    os._exit(value if kind == "E" else 1)


def _encode_status(os, status):
    if os.WIFSIGNALED(status):
        return f"S{os.WTERMSIG(status)}"
    return f"E{os.WEXITSTATUS(status)}"


def _fork_under_init(os, signal):
    """In a fresh PID namespace: P0 (here) -> init (PID 1) -> program (PID 2).

    Returns only in the program process; the other two wait and relay.
    """
    read_fd, write_fd = os.pipe()
    init_pid = os.fork()
    if init_pid:  # P0, outside the namespace: wait for init, relay the program's status
        os.close(write_fd)
        os.waitpid(init_pid, 0)
        text = os.read(read_fd, 64).decode() or "E1"
        _relay_status(os, signal, text)
    os.close(read_fd)
    _set_death_signal(os)
    program_pid = os.fork()
    if program_pid:  # init: reap everything, report the program's status, end the namespace
        status = None
        while status is None:
            try:
                pid, st = os.wait()
            except ChildProcessError:
                break
            if pid == program_pid:
                status = st
        os.write(write_fd, _encode_status(os, status if status is not None else 256).encode())
        os._exit(0)
    os.close(write_fd)


def _set_limits(resource, cfg):
    cpu = max(1, int(cfg["cpu_s"] + 0.999))
    memory = int(cfg["memory_mb"]) * 1024 * 1024
    file_size = int(cfg["max_file_mb"]) * 1024 * 1024
    for res, soft, hard in (
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_FSIZE, file_size, file_size),
        (resource.RLIMIT_NPROC, int(cfg["max_processes"]), int(cfg["max_processes"])),
    ):
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):
            pass


def _install_audit_hook(sys, os, workdir):
    import posixpath

    # Captured now, so that the program rebinding module attributes changes nothing here.
    join, normpath, getcwd, getpid, getpgrp, fsdecode, isdir = (
        posixpath.join, posixpath.normpath, os.getcwd, os.getpid, os.getpgrp, os.fsdecode, os.path.isdir)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    prefix = workdir.rstrip("/") + "/"
    denied = frozenset((
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "pty.spawn", "os.startfile", "os.symlink", "os.link",
        "resource.setrlimit", "resource.prlimit", "ctypes.dlsym", "ctypes.call_function",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.remote_exec",
    ))
    path_events = frozenset((
        "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
        "os.setxattr", "os.removexattr", "os.chflags", "shutil.rmtree", "shutil.chown",
    ))

    def absolute(path):
        return normpath(join(getcwd(), fsdecode(path)))

    def inside(path):
        if isinstance(path, int):
            return True  # an already-open descriptor
        full = absolute(path)
        return full + "/" == prefix or full.startswith(prefix)

    def other_process_entry(path):
        parts = absolute(path).split("/")
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and int(parts[2]) != getpid()

    def deny(event):
        raise PermissionError(f"sandbox: {event} is not allowed")

    def hook(event, args):
        if event in denied or event.startswith("socket."):
            deny(event)
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            if other_process_entry(path):
                deny("reading another process's /proc entry")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & write_flags)
            if writing and not inside(path):
                deny(f"writing outside the working directory ({path!r})")
            if not inside(path) and isdir(path):  # a directory fd + dir_fd= would reach outside
                deny("opening a directory outside the working directory")
        elif event == "os.fwalk":
            if not inside(args[0]):
                deny("os.fwalk outside the working directory")  # it yields directory fds
        elif event in path_events:
            if not inside(args[0]):
                deny(f"{event} outside the working directory")
        elif event == "os.rename":
            if not (inside(args[0]) and inside(args[1])):
                deny("os.rename outside the working directory")
        elif event == "os.kill":
            if args[0] not in (0, getpid()):
                deny("signalling another process")
        elif event == "os.killpg":
            if args[0] != getpgrp():
                deny("signalling another process group")
        elif event == "ctypes.dlopen":
            if args[0] is not None:
                deny("loading a shared library")
        elif event == "object.__setattr__":
            if len(args) > 1 and args[1] == "__code__":
                deny("rewriting a function's code")
        elif event == "import" and args[0] == "_posixsubprocess":
            raise ImportError("sandbox: _posixsubprocess is disabled")

    sys.addaudithook(hook)


def _disarm_process_primitives(os):
    """Remove entry points that raise no audit event (spawn without Popen, pidfd kill)."""
    def refuse(*_args, **_kwargs):
        raise PermissionError("sandbox: starting processes is not allowed")

    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = refuse  # `subprocess` imports this name at import time
    except ImportError:
        pass
    import posix
    import signal

    for module, name in ((os, "pidfd_open"), (posix, "pidfd_open"), (signal, "pidfd_send_signal")):
        try:
            delattr(module, name)
        except AttributeError:
            pass


def _boot():
    import json
    import os
    import resource
    import signal
    import sys

    cfg = json.loads(sys.argv[1])
    workdir = cfg["workdir"]
    with open("main.py", encoding="utf-8", errors="replace") as f:
        source = f.read()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg["namespaces"] and _enter_namespaces(os):
        _fork_under_init(os, signal)
    _set_limits(resource, cfg)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead
    _disarm_process_primitives(os)
    _install_audit_hook(sys, os, workdir)
    sys.argv = ["main.py"]
    return compile(source, "main.py", "exec")


def _run():
    import os
    import sys

    code = _boot()
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except MemoryError:
        namespace.clear()
        os.write(2, b"\nMemoryError: sandbox memory limit reached\n")
        os._exit(MEMORY_EXIT_CODE)
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass


if __name__ == "__main__":
    _run()
