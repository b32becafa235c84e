"""A checkpoint's proof of integrity: `manifest.json` in its step folder, the size and SHA-256 of every
file orbax wrote there (the state, the meta record and `extra/`) and the step it holds.

It is written last: from the save's background thread once every file is written and finalized,
before orbax renames the temporary folder into place, so a step folder without one is a save that
did not finish. A restore verifies it before any array is read (`verify`: each file streamed once,
1 MiB at a time), so a flipped byte, a truncated or missing file, or a folder renamed to another
step is found before the run trains on it.

Left out: orbax's step bookkeeping that it rewrites while committing (the commit time in
`_CHECKPOINT_METADATA`, the commit marker), which holds no array and none of the run's meta.
"""
from __future__ import annotations

import hashlib
import json
import os

from atgrpo_jax import workdir as wd

MANIFEST = "manifest.json"
UNLISTED = frozenset({MANIFEST, "_CHECKPOINT_METADATA", "commit_success.txt"})  # top level only
CHUNK = 1 << 20


class CheckpointDamaged(Exception):
    """A checkpoint whose files are not those its manifest lists; the message names the file."""


def _files(step_dir: str) -> dict[str, object]:
    """{path relative to `step_dir`: epath.Path} of every file under it (orbax's bookkeeping left out)."""
    root = wd.as_epath(step_dir)
    out, folders = {}, [root]
    while folders:  # (epath has no recursive glob on object stores)
        for p in folders.pop().iterdir():
            rel = str(p.relative_to(root))
            if p.is_dir():
                folders.append(p)
            elif rel not in UNLISTED:
                out[rel] = p
    return out


def digest(path) -> str:
    """The SHA-256 of a file, read in chunks (a read, never a copy in memory)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def describe(step_dir: str, step: int) -> dict:
    """The manifest of the files now in `step_dir` for `step`."""
    files = _files(step_dir)
    return {"step": int(step),
            "files": {rel: {"size": p.stat().length, "sha256": digest(p)} for rel, p in sorted(files.items())}}


def write(step_dir: str, step: int) -> None:
    """Write `step_dir`'s manifest (after every other file of the step is written)."""
    text = json.dumps(describe(step_dir, step), indent=1)
    if wd.is_remote(step_dir):
        wd.write_text(wd.join(step_dir, MANIFEST), text)  # an object is written whole or not at all
        return
    tmp = os.path.join(step_dir, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(step_dir, MANIFEST))


def read(step_dir: str) -> dict:
    """The manifest of `step_dir`; CheckpointDamaged when there is none or it is not one."""
    path = wd.as_epath(wd.join(step_dir, MANIFEST))
    if not path.exists():
        raise CheckpointDamaged(f"no {MANIFEST}: its save did not finish")
    try:
        record = json.loads(path.read_text())
        return {"step": int(record["step"]), "files": {str(k): (int(v["size"]), str(v["sha256"]))
                                                        for k, v in record["files"].items()}}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointDamaged(f"{MANIFEST} is damaged (not a manifest)") from None


def verify(step_dir: str, step: int) -> None:
    """CheckpointDamaged, naming the first file that differs, unless `step_dir` holds exactly the files
    its manifest lists, with their sizes and contents, and the manifest is of `step`. Sizes are checked
    for every file before any content is read, so a truncated file is found without hashing the rest."""
    record = read(step_dir)
    if record["step"] != int(step):
        raise CheckpointDamaged(f"the folder {step} holds step {record['step']} (its {MANIFEST} says so)")
    files = _files(step_dir)
    for rel, (size, _) in record["files"].items():
        if rel not in files:
            raise CheckpointDamaged(f"{rel} is missing")
        actual = files[rel].stat().length
        if actual != size:
            raise CheckpointDamaged(f"{rel} has {actual} bytes, its manifest says {size}")
    for rel in files:
        if rel not in record["files"]:
            raise CheckpointDamaged(f"{rel} is not in its {MANIFEST}")
    for rel, (_, sha) in record["files"].items():
        if digest(files[rel]) != sha:
            raise CheckpointDamaged(f"{rel} differs from its manifest (content hash)")
