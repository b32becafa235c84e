"""Data sources for the text workflows, and the paper's data sets.

- `load_records(source, required, fields)`: the records of a JSONL/JSON file, a parquet file, a
  Hugging Face `save_to_disk` directory or `hf:org/name[@revision][:config][:split]`, with each
  required field under its own name (`fields` maps a field to the source's column).
- `python -m atgrpo_jax.data prepare NAME --out=DIR`: download one of the paper's data sets from the
  hub and convert it to the project's records (paper_sets.py); `list` names them.
- Prepared sets live in a data directory: `env.kwargs.data_dir`, else `$ATGRPO_DATA`, else `data/`.
"""
from __future__ import annotations

import functools
import os
from typing import Mapping, Sequence

from atgrpo_jax.data.hf_sets import parse_hf, read_hf
from atgrpo_jax.data.paper_sets import PAPER_SETS
from atgrpo_jax.data.readers import TABLE_EXTENSIONS, DataError, is_source, map_fields, read_file  # noqa: F401
from atgrpo_jax.registry import registered

DEFAULT_DATA_DIR = "data"


def data_dir(given: str = "") -> str:
    """Where prepared data sets are: the config's choice, else $ATGRPO_DATA, else ./data."""
    return given or os.environ.get("ATGRPO_DATA") or DEFAULT_DATA_DIR


def prepare_command(name: str, directory: str) -> str:
    return f"python -m atgrpo_jax.data prepare {name} --out={directory}"


def prepared_path(name: str, given_dir: str = "") -> str:
    """The file of a prepared data set; a missing one is one error naming the command that makes it."""
    directory = data_dir(given_dir)
    path = os.path.join(directory, f"{name}.jsonl")
    if not os.path.isfile(path):
        hint = f"run `{prepare_command(name, directory)}`" if name in PAPER_SETS else \
            f"prepared sets are {', '.join(sorted(PAPER_SETS))}"
        raise DataError(f"data set {name!r} is missing: no {path} ({hint})")
    return path


def require_prepared(names, given_dir: str = "", task: str = "") -> None:
    """Every prepared set among `names` is in the data directory, else one error naming the command
    that prepares all the missing ones (a shipped name or a source of one's own is not checked here)."""
    directory = data_dir(given_dir)
    missing = [n for n in dict.fromkeys(names) if n in PAPER_SETS and task in ("", PAPER_SETS[n].task)
               and not os.path.isfile(os.path.join(directory, f"{n}.jsonl"))]
    if missing:
        raise DataError(f"data set{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing from {directory}/: "
                        f"run `{prepare_command(' '.join(missing), directory)}` (or set $ATGRPO_DATA or "
                        "env.kwargs.data_dir to where they are)")


def is_prepared_name(name: str, task: str = "") -> bool:
    """Whether `name` is one of the sets prepare writes (for `task`, "math", "code", "search", ..., when given)."""
    return name in PAPER_SETS and task in ("", PAPER_SETS[name].task)


def read_rows(source: str) -> list[dict]:
    """All rows of a source: a local file or directory (readers.py), hf:org/name (hf_sets.py), or the `py:`
    name of records handed to the Python API (a list of dicts or a `datasets.Dataset`)."""
    if source.startswith("py:"):
        rows = registered(source, "data source")
        return list(rows.to_list() if hasattr(rows, "to_list") else rows)
    if source.startswith("hf:"):
        return read_hf(source)
    return read_file(os.path.expanduser(source))


def source_name(source: str) -> str:
    """The split name a source is evaluated as: a file's stem, a directory's name, an hf name's last parts."""
    if source.startswith("hf:"):
        spec = parse_hf(source)
        return "_".join(p for p in (spec.name.split("/")[-1], spec.config, spec.split) if p)
    if not is_source(source):
        return source
    stem = os.path.basename(os.path.normpath(source))
    return os.path.splitext(stem)[0] if os.path.splitext(stem)[1].lower() in TABLE_EXTENSIONS else stem


@functools.lru_cache(maxsize=None)
def _cached(source: str, required: tuple, fields: tuple) -> tuple:
    return tuple(map_fields(read_rows(source), source, required, dict(fields)))


def load_records(source: str, required: Sequence[str], fields: Mapping[str, str] | None = None) -> tuple[dict, ...]:
    """The records of `source` with `required` fields (mapped by `fields`), cached per process."""
    return _cached(source, tuple(required), tuple(sorted((fields or {}).items())))
