"""File-system isolation of the sandbox: which files Python needs, and a root holding only those.

Child-side code (standard library only, no project imports): the trainer runs it as
`python -I -c <this file><sandbox_boot.py>`, so `sandbox_boot` calls these functions by name.

- `filesystem_plan()` runs once per trainer process, in a probe child started like a sandboxed
  run (`sandbox.filesystem_plan`). It lists what a program needs: the import roots of `sys.path`
  that belong to the interpreter (its prefixes, site-packages; not editable checkouts), the
  shared libraries mapped once the standard library's extension modules and the tool agent's
  packages are imported (read from /proc/self/maps, so no distribution's paths are assumed),
  /etc/ld.so.cache for the loader, the symlinks through which these are reached (/lib -> usr/lib,
  libffi.so.8 -> libffi.so.8.1.2, bin/python -> python3.11), and /dev/null, /dev/zero,
  /dev/urandom.
- `enter_private_root(plan, workdir)` runs in every sandboxed run, in the program's process,
  inside new user, PID and mount namespaces: mounts propagate nowhere (private), a tmpfs gets
  read-only bind mounts of the plan, the three devices, a fresh /proc (of the PID namespace)
  and the working directory (writable, no device files; with a disk quota a size-limited tmpfs
  holding copies of its files, so the program's files together stay under it), then `pivot_root` makes it the root,
  the old root is detached and the new one made read-only. Everything else of the machine
  (/etc, /root, /home, credentials, the repository) does not exist for the program.
"""
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PIVOT_ROOT_SYSCALL = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")


def _under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _resolve(path, links):
    """The real path of `path`, adding each symlink met on the way (the last component's too)
    to `links` as (link, target)."""
    import os

    current, parts, hops = "/", [p for p in path.split("/") if p], 0
    while parts:
        part = parts.pop(0)
        candidate = os.path.join(current, part)
        if part == "..":
            current = os.path.dirname(current)
        elif part != "." and os.path.islink(candidate) and hops < 40:
            hops += 1
            target = os.readlink(candidate)
            links.add((candidate, target))
            parts = [p for p in target.split("/") if p] + parts
            current = "/" if target.startswith("/") else current
        elif part != ".":
            current = candidate
    return current


def _import_everything(skip, modules):
    """Import the standard library's extension modules and `modules`, so their libraries get mapped."""
    import importlib
    import os
    import sys

    names = list(modules)
    for folder in [p for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)]:
        names += sorted({f.split(".")[0] for f in os.listdir(folder) if f.endswith(".so")})
    for name in names:
        if name.split(".")[0] not in skip:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - not installed or not loadable here: not loadable there either
                pass


def _mapped_files():
    import os

    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/") and not path.startswith(("/proc/", "/dev/", "/sys/")) and os.path.isfile(path):
                found.add(os.path.realpath(path))
    return found


def filesystem_plan(skip=(), modules=("numpy", "sympy")):
    """{"dirs", "files", "links", "devices"}: what a sandboxed Python reads (real paths; links as
    [path, target]). `skip`: extension modules the sandbox refuses to import (not probed)."""
    import os
    import sys

    links = set()
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)}
    roots = []
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            real = os.path.realpath(entry)
            if any(_under(real, p) for p in prefixes) or os.path.basename(real) in ("site-packages", "dist-packages"):
                roots.append(_resolve(entry, links))
    dirs = [d for d in sorted(set(roots)) if not any(d != r and _under(d, r) for r in roots)]
    _resolve(sys.executable, links)
    _import_everything(set(skip), modules)
    files = _mapped_files()
    if os.path.isfile("/etc/ld.so.cache"):
        files.add(_resolve("/etc/ld.so.cache", links))
    files = sorted(f for f in files if not any(_under(f, d) for d in dirs))
    # Names the loader looks up: top-level symlinks (/lib -> usr/lib) and sonames next to each library.
    links.update((e.path, os.readlink(e.path)) for e in os.scandir("/") if e.is_symlink())
    wanted = set(files)
    for folder in sorted({os.path.dirname(f) for f in files}):
        for e in os.scandir(folder):
            if e.is_symlink() and os.path.realpath(e.path) in wanted:
                links.add((e.path, os.readlink(e.path)))
    links = sorted(pair for pair in links if not any(_under(pair[0], d) for d in dirs) and pair[0] not in wanted)
    return {"dirs": dirs, "files": files, "links": [list(pair) for pair in links],
            "devices": [d for d in DEVICES if os.path.exists(d)]}


def _copy_files(src, dst):
    """The regular files directly in `src` (the program and its stdin), copied to `dst`."""
    import os
    import shutil

    for name in os.listdir(src):
        if os.path.isfile(os.path.join(src, name)) and not os.path.islink(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def enter_private_root(plan, workdir, disk_mb=0):
    """Make a root holding only `plan` and `workdir` (see the module docstring); cwd = workdir.

    disk_mb > 0: the working directory is a tmpfs of that size holding copies of its files, so
    all the files a program writes together (not only each one: RLIMIT_FSIZE) stay under it.
    Call inside new mount and PID namespaces. Raises OSError when the kernel refuses a step.
    """
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, fstype, flags, data=None):
        args = [None if a is None else os.fsencode(a) for a in (source, target, fstype, data)]
        if libc.mount(args[0], args[1], args[2], flags, args[3]) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"mount {target}: {os.strerror(errno)}")

    def bind(source, target, read_only):
        mount(source, target, None, MS_BIND)
        # Flags the source mount holds (locked in a user namespace) must be kept in the remount.
        held = os.statvfs(target).f_flag
        flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only or held & os.ST_RDONLY else 0)
        for st_flag, ms_flag in ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME),
                                 (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
            flags |= ms_flag if held & st_flag else 0
        mount(None, target, None, flags)

    def placeholder(path, is_dir):
        os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
        if not is_dir:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))

    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates to the machine
    # The new root is a tmpfs over the working directory (a leaf: no source lies below it);
    # the directory itself stays reachable through this descriptor.
    work = os.open(workdir, os.O_PATH | os.O_DIRECTORY)
    root = workdir
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    try:
        for path in [*plan["dirs"], workdir, "/proc"]:
            placeholder(root + path, True)
        for path in [*plan["files"], *plan["devices"]]:
            placeholder(root + path, False)
        for link, target in plan["links"]:
            os.makedirs(os.path.dirname(root + link), exist_ok=True)
            os.symlink(target, root + link)
        for path in [*plan["dirs"], *plan["files"]]:
            bind(path, root + path, read_only=True)
        for path in plan["devices"]:
            mount(path, root + path, None, MS_BIND)
        if disk_mb > 0:
            mount("tmpfs", root + workdir, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={int(disk_mb)}m,nr_inodes={64 * int(disk_mb) + 64},mode=0700,"
                  f"uid={os.getuid()},gid={os.getgid()}")
            _copy_files(f"/proc/self/fd/{work}", root + workdir)
        else:
            bind(f"/proc/self/fd/{work}", root + workdir, read_only=False)
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        number = PIVOT_ROOT_SYSCALL.get(os.uname().machine)
        if number is None:
            raise OSError(f"pivot_root: no system call number known for {os.uname().machine}")
        os.chdir(root)
        if libc.syscall(number, b".", b".") != 0:  # the old root ends up stacked on the new one ...
            raise OSError(ctypes.get_errno(), "pivot_root")
    except BaseException:
        libc.umount2(os.fsencode(root), MNT_DETACH)  # back to the machine's view, for the fallback
        os.chdir(workdir)
        raise
    finally:
        os.close(work)
    if libc.umount2(b".", MNT_DETACH) != 0:  # ... and is detached from it here
        errno = ctypes.get_errno()
        os.chdir(workdir)  # (through the old root, still on top) for the fallback
        raise OSError(errno, "umount of the old root")
    os.chdir("/")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(workdir)
