"""Models by Hugging Face Hub id: `org/name[@revision]` wherever a checkpoint directory is taken.

`local_model_dir(spec)` returns a local directory for `spec`: a .gguf file or a short name of one
(`smollm2-135m-instruct`) its dequantized copy (models/gguf.py); an existing directory (or a gs://
URL) as it is; a hub id through `huggingface_hub.snapshot_download` into the standard cache
(`HF_HUB_CACHE`, by default ~/.cache/huggingface/hub), the weights, config and tokenizer files only
(atgrpo_jax/hf_cache.py). Offline (`HF_HUB_OFFLINE=1`) the cache must hold the revision already; otherwise
the error is one line saying what to download. Anything else is returned unchanged (a missing directory is then
reported by whoever reads it).
"""
from __future__ import annotations

import functools
import os
import re

from atgrpo_jax import hf_cache
from atgrpo_jax.models import gguf
from atgrpo_jax.errors import CheckpointError  # noqa: F401  (raised here; also importable from here)


# What a Qwen3 checkpoint needs: config, safetensors (+ index), tokenizer and generation config.
PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+(@[A-Za-z0-9_./-]+)?$")


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when `spec` is a hub id and no local path; else None."""
    spec = str(spec)
    if not spec or os.path.exists(spec) or "://" in spec or spec.startswith((".", "/", "~")):
        return None
    if not _HUB_ID.match(spec):
        return None
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def is_repo_id(name: str) -> bool:
    """`org/name` (no revision): where a model may be pushed."""
    return bool(_HUB_ID.match(str(name))) and "@" not in str(name)


def local_model_dir(spec: str, what: str = "model.hf_path") -> str:
    """A local directory for `spec` (see the module docstring; a .gguf file or a short name of one: its
    dequantized copy, models/gguf.py); errors are CheckpointError naming `what`."""
    if gguf.is_gguf(spec):
        return gguf.gguf_checkpoint_dir(str(spec), what)
    parsed = parse_hub_id(spec)
    if parsed is None:
        return spec
    return _download(parsed[0], parsed[1], hf_cache.cache_dir(), hf_cache.offline(), what)


@functools.lru_cache(maxsize=None)  # one look-up per process and model, however many callers
def _download(repo: str, revision: str | None, cache_dir: str, is_offline: bool, what: str) -> str:
    # cache_dir and is_offline are read again by hf_cache.snapshot; here they only key the memo, so a
    # process that changes HF_HUB_CACHE or HF_HUB_OFFLINE looks the model up afresh
    spec = repo + (f"@{revision}" if revision else "")
    try:
        path = hf_cache.snapshot(repo, list(PATTERNS), revision)
    except hf_cache.HubError as e:
        raise CheckpointError(f"{what}={spec!r}: no such directory, and as a hub id: {e}") from None
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise CheckpointError(f"{what}={spec!r}: {path} has no config.json: not a Hugging Face model checkpoint")
    return path
