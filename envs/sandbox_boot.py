"""Child-side bootstrap of the sandbox: runs before the untrusted program.

`sandbox.run_python` starts `python -I -c <sandbox_fs.py + this file> <config json>`
in a fresh working directory holding `main.py` (the program), so the functions
of `sandbox_fs` are defined here. It is never imported by the trainer (except
for its constants). In order, it:

1. enters new user, PID, network and mount namespaces when the kernel allows
   it: through a user namespace that maps the caller's uid to itself (for
   root too, so the program holds no capability over the machine: no device
   nodes, no kernel memory, no remounting), else, as root, directly. In a PID
   namespace the program runs as PID 2 under a tiny init (PID 1); when
   anything ends the init, the kernel kills every process in the namespace,
   so nothing forked can outlive the run, and the trainer's PID is not even
   visible. The network namespace has only a down loopback: sockets reach
   nothing;
2. in the mount namespace, replaces the root by one holding only the Python
   install, the shared libraries it loads, three devices, a fresh /proc and
   the working directory (`sandbox_fs.enter_private_root`; isolation
   "mount-namespace"). When the kernel refuses any of it, the audit hook's
   read check below is the only file-system layer (isolation "audit-hook").
   The layer in force is written to the trainer's report pipe, which is then
   closed before the program starts;
3. sets resource limits (CPU seconds, address space, file size, processes,
   no core files);
4. installs an audit hook (PEP 578) that refuses sockets, fork/exec/spawn,
   signals to other processes, writes outside the working directory, reads
   outside the working directory and the files of the plan (resolving
   symlinks), reads of other processes' /proc entries, raising limits,
   foreign-function calls and the modules that read files or start processes
   in C, past the hook (BLOCKED_MODULES). Audit hooks are not a security
   boundary on their own; they are the layer that makes ordinary attempts fail
   fast, with a clear error, and the one left when namespaces are unavailable;
5. runs `main.py` as `__main__`.

Exit statuses are relayed from the program to the process the trainer waits
for: the same exit code, or death by the same signal. MemoryError exits with
MEMORY_EXIT_CODE.
"""
MEMORY_EXIT_CODE = 99
CLONE_NEWNS = 0x00020000
# C code that reads files (shadow passwords, the user database, history files) or runs a Tcl
# interpreter (files, exec) without raising audit events.
BLOCKED_MODULES = ("spwd", "pwd", "grp", "readline", "_tkinter", "nis", "_dbm", "_gdbm")


def _enter_namespaces(os, mount):
    """unshare(PID|NET, and NS when `mount`) inside a new user namespace, or, as root without
    user namespaces, directly; without NS if that fails. The flags entered (0: none)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:
        return 0
    new_user, new_pid, new_net, new_ns = 0x10000000, 0x20000000, 0x40000000, CLONE_NEWNS
    uid, gid = os.geteuid(), os.getegid()
    for flags in ((new_pid | new_net | new_ns, new_pid | new_net) if mount else (new_pid | new_net,)):
        if libc.unshare(new_user | flags) == 0:
            try:
                for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                                   ("gid_map", f"{gid} {gid} 1")):
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
            except OSError:
                pass  # (no setgroups control: the run goes on unmapped, it cannot undo the unshare)
            return flags
        if uid == 0 and libc.unshare(flags) == 0:
            return flags
    return 0


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


def _fork_under_init(os, signal, report_fd):
    """In a fresh PID namespace: P0 (here) -> init (PID 1) -> program (PID 2).

    Returns only in the program process; the other two wait and relay (and close `report_fd`,
    which only the program writes).
    """
    read_fd, write_fd = os.pipe()
    init_pid = os.fork()
    if init_pid:  # P0, outside the namespace: wait for init, relay the program's status
        os.close(report_fd)
        os.close(write_fd)
        os.waitpid(init_pid, 0)
        text = os.read(read_fd, 64).decode() or "E1"
        _relay_status(os, signal, text)
    os.close(read_fd)
    _set_death_signal(os)
    program_pid = os.fork()
    if program_pid:  # init: reap everything, report the program's status, end the namespace
        os.close(report_fd)
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


def _path_rules(os, workdir, plan):
    """(inside, readable, other_process_entry): the path checks of the audit hook, closures over what they
    read captured now, so that the program rebinding module attributes changes nothing in them."""
    import posixpath

    join, normpath, realpath, getcwd, getpid, fsdecode = (
        posixpath.join, posixpath.normpath, posixpath.realpath, os.getcwd, os.getpid, os.fsdecode)
    prefix = workdir.rstrip("/") + "/"
    own_proc = realpath("/proc/self")  # /proc/<pid> as this process's /proc numbers it
    readable_files = frozenset([*plan["files"], *plan["devices"], *plan["dirs"], own_proc, workdir])
    readable_dirs = tuple(d.rstrip("/") + "/" for d in [*plan["dirs"], own_proc, workdir])

    def absolute(path):
        return normpath(join(getcwd(), fsdecode(path)))

    def inside(path):
        if isinstance(path, int):
            return True  # an already-open descriptor
        full = absolute(path)
        return full + "/" == prefix or full.startswith(prefix)

    def readable(path):
        """The working directory (the program cannot make symlinks) or, symlinks resolved, it, a
        file of the plan or this process's own /proc entries."""
        if inside(path):
            return True
        real = realpath(absolute(path))
        return real in readable_files or real.startswith(readable_dirs)

    def other_process_entry(path):
        parts = absolute(path).split("/")
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and int(parts[2]) != getpid()

    return inside, readable, other_process_entry


def _install_audit_hook(sys, os, workdir, plan):
    # Captured now, so that the program rebinding module attributes changes nothing here.
    getpid, getpgrp, fsdecode, isdir = os.getpid, os.getpgrp, os.fsdecode, os.path.isdir
    inside, readable, other_process_entry = _path_rules(os, workdir, plan)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    blocked = frozenset(BLOCKED_MODULES)
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
            if not writing and not readable(path):
                deny(f"reading outside the working directory and the Python install ({path!r})")
            if not inside(path) and isdir(path):  # a directory fd + dir_fd= would reach outside
                deny("opening a directory outside the working directory")
        elif event in ("os.listdir", "os.scandir"):
            if not readable("." if args[0] is None else args[0]):
                deny(f"listing a directory outside the working directory and the Python install ({args[0]!r})")
        elif event == "sqlite3.connect":  # sqlite opens its files in C
            database = fsdecode(args[0])
            if database not in ("", ":memory:") and (database.startswith("file:") or not inside(database)):
                deny("a database outside the working directory")
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
        elif event == "import" and args[0] in blocked:
            raise ImportError(f"sandbox: {args[0]} is disabled (its C code reads files past this hook)")

    sys.addaudithook(hook)


def _disarm_process_primitives(os):
    """Remove entry points that raise no audit event (spawn without Popen, pidfd kill, mknod:
    a device node in the working directory would let root read a disk)."""
    def refuse(*_args, **_kwargs):
        raise PermissionError("sandbox: starting processes is not allowed")

    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = refuse  # `subprocess` imports this name at import time
    except ImportError:
        pass
    import posix
    import signal

    for module, name in ((os, "pidfd_open"), (posix, "pidfd_open"), (signal, "pidfd_send_signal"),
                         (os, "mknod"), (posix, "mknod")):
        try:
            delattr(module, name)
        except AttributeError:
            pass


def _isolate_filesystem(cfg, namespaces):
    """Enter the private root when the mount namespace was entered: (layer, why not)."""
    if not namespaces & CLONE_NEWNS:
        return "audit-hook", ("no mount namespace" if cfg["filesystem_isolation"] else "not asked for")
    try:
        enter_private_root(cfg["filesystem"], cfg["workdir"], cfg["max_disk_mb"])  # noqa: F821 - sandbox_fs.py
    except Exception as exc:  # noqa: BLE001 - any refusal of the kernel: the hook alone guards reads
        return "audit-hook", repr(exc)
    return "mount-namespace", ""


def _boot():
    import json
    import os
    import resource
    import signal
    import sys

    cfg = json.loads(sys.argv[1])
    report_fd = cfg["report_fd"]
    with open("main.py", encoding="utf-8", errors="replace") as f:
        source = f.read()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    namespaces = _enter_namespaces(os, mount=cfg["filesystem_isolation"]) if cfg["namespaces"] else 0
    if namespaces:
        _fork_under_init(os, signal, report_fd)
    layer, reason = _isolate_filesystem(cfg, namespaces)
    os.write(report_fd, f"{layer}\n{reason}"[:512].encode())
    os.close(report_fd)
    _set_limits(resource, cfg)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead
    _disarm_process_primitives(os)
    _install_audit_hook(sys, os, cfg["workdir"], cfg["filesystem"])
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
