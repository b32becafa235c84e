"""Run directories that are local paths or object-store URLs (`gs://bucket/run`, `s3://...`).

Local paths are handled with `os` as before (relative ones made absolute
where orbax needs it). URLs go through `etils.epath` (the layer orbax uses)
and are never passed to `os.path.abspath`.

Object stores have no append, no fsync and no atomic rename, but writing a
whole object is atomic: a reader sees the old object or the new one, never a
mix, and an interrupted upload leaves the old object. So files that grow
(metrics.jsonl, TensorBoard event files) are kept in a local staging
directory and uploaded whole by `Mirror.push` (only the files that changed).

Packages: epath reaches `gs://` through fsspec's `gcsfs` (or through
TensorFlow when it is installed); orbax's `gs://` checkpoints also need
`google-cloud-storage` (it lists steps through it). `require_support` names
what is missing before anything is compiled.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile

from etils import epath

from atgrpo_jax.errors import NotWritable  # noqa: F401  (raised here; also importable from here)

# epath's URL schemes -> the fsspec protocol epath uses for each.
FSSPEC_PROTOCOLS = {"gs": "gcs", "s3": "s3", "az": "az", "hf": "hf"}


def scheme(path) -> str | None:
    """The URL scheme of `path` ("gs" for gs://bucket/x), None for a local path."""
    path = os.fspath(path)
    head, sep, _ = path.partition("://")
    return head if sep else None


def is_remote(path) -> bool:
    return scheme(path) is not None


def as_epath(path) -> epath.Path:
    """An epath.Path; a clear error for a URL scheme epath cannot open."""
    s = scheme(path)
    if s is not None and s not in FSSPEC_PROTOCOLS:
        raise ValueError(f"{os.fspath(path)!r}: unsupported URL scheme {s}:// "
                         f"(supported: {', '.join(k + '://' for k in FSSPEC_PROTOCOLS)} or a local path)")
    return epath.Path(path)


def absolute(path) -> str:
    """A local path made absolute (orbax wants one); a URL unchanged."""
    path = os.fspath(path)
    return path if is_remote(path) else os.path.abspath(path)


def join(path, *parts: str) -> str:
    path = os.fspath(path)
    return str(as_epath(path).joinpath(*parts)) if is_remote(path) else os.path.join(path, *parts)


def dirname(path) -> str:
    path = os.fspath(path)
    return str(as_epath(path).parent) if is_remote(path) else os.path.dirname(path)


def basename(path) -> str:
    return os.path.basename(os.fspath(path).rstrip("/"))


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a missing parent package (google.cloud)
        return False


def missing_packages(path, *, checkpoints: bool = False) -> list[str]:
    """Why `path` cannot be used from this Python environment (empty when it can)."""
    s = scheme(path)
    if s is None:
        return []
    as_epath(path)  # unsupported scheme: ValueError
    missing = []
    epath_uses_tf = (os.environ.get("EPATH_USE_TF", "").lower() not in ("false", "no", "f", "0")
                     and _module_available("tensorflow"))  # epath's rule: then tf.io.gfile, not fsspec
    if not epath_uses_tf:
        import fsspec

        try:
            fsspec.get_filesystem_class(FSSPEC_PROTOCOLS[s])
        except (ImportError, ValueError) as e:
            missing.append(f"fsspec has no {s}:// filesystem ({e})")
    if checkpoints and s == "gs" and not _module_available("google.cloud.storage"):
        missing.append("orbax lists gs:// checkpoints with google-cloud-storage, which is not installed")
    return missing


def require_support(path, *, checkpoints: bool = False):
    """Raise ImportError naming the packages `path` needs (gs://: `pip install gcsfs google-cloud-storage`)."""
    missing = missing_packages(path, checkpoints=checkpoints)
    if missing:
        hint = {"gs": "gcsfs google-cloud-storage", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}
        raise ImportError(f"cannot use {os.fspath(path)}: " + "; ".join(missing)
                          + f". Install: pip install {hint[scheme(path)]}")


def makedirs(path):
    as_epath(path).mkdir(parents=True, exist_ok=True)


def exists(path) -> bool:
    return as_epath(path).exists()


def isdir(path) -> bool:
    return as_epath(path).is_dir()


def write_text(path, text: str):
    """Write a whole file (one object on a store; local files as with open(path, "w"))."""
    as_epath(path).write_text(text, encoding="utf-8")


def write_bytes(path, data: bytes):
    as_epath(path).write_bytes(data)


CONFIG_FILE = "config.json"


def tree_bytes(path: str) -> int:
    """The bytes of the files under a local `path` (a file: its size)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def check_workdir(workdir: str):
    """A clear error for a workdir that cannot be one (checked before anything is written)."""
    if exists(workdir) and not isdir(workdir):
        raise NotADirectoryError(f"--workdir {workdir} is a file, not a directory: give a new or a run's directory")


def nearest_existing(path: str) -> str:
    """`path` itself if it exists, else its closest existing ancestor."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def check_writable(path: str, what: str) -> None:
    """Raise NotWritable (or NotADirectoryError) unless files can be created in `path` or where it
    would be created. Probes with a real file (permission bits say nothing for root or a read-only
    mount) and removes it. Object-store URLs are not probed (a write there costs a request)."""
    if is_remote(path):
        return
    where = nearest_existing(path)
    if not os.path.isdir(where):
        raise NotADirectoryError(f"{what} {path}: {where} is a file, not a directory")
    probe = None
    try:
        fd, probe = tempfile.mkstemp(prefix=".atgrpo-write-probe-", dir=where)
        try:
            os.write(fd, b"\n")  # a byte, so a full disk is found too (an empty file needs no block)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise NotWritable(f"{what} {path}: cannot write in {where} ({e.strerror or e})") from None
    finally:
        if probe is not None and os.path.exists(probe):
            os.remove(probe)


def saved_config(workdir: str) -> dict | None:
    """The config.json a run wrote in `workdir` (None if there is none)."""
    path = join(workdir, CONFIG_FILE)
    return json.loads(as_epath(path).read_text()) if exists(path) else None


def checkpoint_dir(workdir: str) -> str:
    return join(absolute(workdir), "checkpoints")  # orbax wants an absolute local path


def write_config(config, workdir: str, *, keep_as: str = ""):
    """Write the run's config.json (an existing one is first copied to `keep_as`, if given; to
    `keep_as` with -2, -3... added when that exists: a record of an earlier change is never overwritten)."""
    makedirs(workdir)
    path = join(workdir, CONFIG_FILE)
    if keep_as and exists(path):
        stem, dot, ext = keep_as.rpartition(".")
        name, n = keep_as, 2
        while exists(join(workdir, name)):
            name, n = f"{stem}-{n}{dot}{ext}", n + 1
        write_text(join(workdir, name), as_epath(path).read_text())
    text = json.dumps(config.to_dict(), indent=2, default=str)  # a Config or a ConfigDict
    if is_remote(path):
        write_text(path, text)  # an object is replaced whole
        return
    tmp = path + ".tmp"  # a full disk leaves the old config.json, never a cut one
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def locate_checkpoint(checkpoint: str) -> tuple[str, str, int | None]:
    """(workdir, checkpoint directory, step or None for the latest) of `WORKDIR` or `WORKDIR/checkpoints/STEP`."""
    path = absolute(checkpoint.rstrip("/"))
    parent, name = dirname(path), basename(path)
    if basename(parent) == "checkpoints" and name.isdigit():
        return dirname(parent), parent, int(name)
    return path, join(path, "checkpoints"), None


class Mirror:
    """A local staging directory whose files are uploaded whole to a remote directory.

    `pull` downloads remote files before local code edits them; `push` uploads
    every local file whose size or modification time changed since it was
    pulled or last pushed. `close` removes the staging directory.
    """

    def __init__(self, remote: str):
        self.remote = os.fspath(remote)
        self.local = tempfile.mkdtemp(prefix="atgrpo-workdir-")
        self._seen: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) on the remote
        self._made: set[str] = set()

    def _stamp(self, rel: str) -> tuple[int, int]:
        st = os.stat(os.path.join(self.local, rel))
        return st.st_size, st.st_mtime_ns

    def pull(self, rel: str) -> bool:
        """Download remote `rel` (a path under the remote directory); False if it does not exist."""
        src = as_epath(join(self.remote, rel))
        if not src.exists():
            return False
        dst = os.path.join(self.local, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(src.read_bytes())
        self._seen[rel] = self._stamp(rel)
        return True

    def pull_dir(self, rel_dir: str, prefix: str = "") -> int:
        """Download the files of remote `rel_dir` whose names start with `prefix`; returns how many."""
        src = as_epath(join(self.remote, rel_dir))
        if not src.is_dir():
            return 0
        names = sorted(p.name for p in src.iterdir() if p.name.startswith(prefix))
        return sum(self.pull(f"{rel_dir}/{name}") for name in names)

    def push(self) -> list[str]:
        """Upload the changed local files whole; returns their relative paths."""
        pushed = []
        for root, _, files in os.walk(self.local):
            for name in sorted(files):
                if name.endswith(".tmp"):  # a local atomic rewrite in progress
                    continue
                rel = os.path.relpath(os.path.join(root, name), self.local).replace(os.sep, "/")
                stamp = self._stamp(rel)
                if self._seen.get(rel) == stamp:
                    continue
                with open(os.path.join(self.local, rel), "rb") as f:
                    data = f.read()
                parent = dirname(join(self.remote, rel))
                if parent not in self._made:
                    makedirs(parent)
                    self._made.add(parent)
                write_bytes(join(self.remote, rel), data)
                self._seen[rel] = stamp
                pushed.append(rel)
        return pushed

    def close(self):
        shutil.rmtree(self.local, ignore_errors=True)
