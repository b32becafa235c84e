"""The Hugging Face Hub cache and its downloads, for models (`org/name[@rev]`) and data (`hf:...`).

The cache and the offline switch are read from the environment at each call, not once at import as
`huggingface_hub.constants` does, so a process that sets `HF_HUB_OFFLINE` or `HF_HUB_CACHE` after
importing transformers is still obeyed. A snapshot that cannot be had is one `HubError` line saying
why and what to run; callers put what they were resolving in front of it.
"""
from __future__ import annotations

import os

_TRUE = ("1", "true", "yes", "on")


class HubError(ValueError):
    """A hub repository that cannot be had: the message says why and what to run."""


def offline() -> bool:
    """HF_HUB_OFFLINE, as set now (or as huggingface_hub read it at import)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return True
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    """$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub (read now)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    return os.path.join(os.path.expanduser(os.environ.get("HF_HOME", "~/.cache/huggingface")), "hub")


def download_command(repo: str, revision: str | None = None, repo_type: str = "model") -> str:
    kind = "" if repo_type == "model" else f"--repo-type {repo_type} "
    return f"hf download {kind}{repo}" + (f" --revision {revision}" if revision else "")


def snapshot(repo: str, patterns: list[str], revision: str | None = None, repo_type: str = "model",
             command: str | None = None) -> str:
    """A local snapshot directory of `repo` holding the files that match `patterns`: downloaded into
    the cache when online, else found there. `command` is what to tell the user to run when it is
    missing (by default the hf download)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    cache, is_offline = cache_dir(), offline()
    try:
        return snapshot_download(repo, repo_type=repo_type, revision=revision, allow_patterns=list(patterns),
                                 cache_dir=cache, local_files_only=is_offline)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise HubError(f"{type(e).__name__} on the Hugging Face Hub (a private or gated repository needs "
                       "`hf auth login`)") from None
    except (LocalEntryNotFoundError, FileNotFoundError):
        why = "HF_HUB_OFFLINE=1" if is_offline else "the Hub cannot be reached"
        run = command or download_command(repo, revision, repo_type)
        raise HubError(f"not in the Hugging Face cache {cache} and {why}: run `{run}` where the machine is online "
                       "(with the same HF_HUB_CACHE, or copy the cache here)") from None
    except (HfHubHTTPError, OSError) as e:
        raise HubError(f"the Hugging Face Hub refused: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
