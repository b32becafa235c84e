"""Download one of the paper's data sets from the hub and write it as the project's records."""
from __future__ import annotations

import datetime
import gzip
import itertools
import json
import os
from typing import Iterator

from atgrpo_jax.data import data_dir, prepare_command
from atgrpo_jax.data.hf_sets import local_files, snapshot
from atgrpo_jax.data.paper_sets import PAPER_SETS, PaperSet
from atgrpo_jax.data.readers import DataError, iter_jsonl, iter_parquet, read_arrow, read_json


def _rows(root: str, files: list[str], spec: PaperSet) -> Iterator[dict]:
    for rel in files:
        path = os.path.join(root, rel)
        ext = os.path.splitext(rel)[1].lower()
        if ext == ".jsonl":
            yield from iter_jsonl(path)
        elif rel.lower().endswith(".jsonl.gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                yield from (json.loads(line) for line in f if line.strip())
        elif ext == ".parquet":
            yield from iter_parquet(path, spec.columns)
        elif ext == ".arrow":
            yield from read_arrow(path)
        elif ext == ".json":
            yield from read_json(path)


def prepare(name: str, out: str = "", revision: str | None = None, limit: int | None = None) -> tuple[str, int]:
    """Write OUT/NAME.jsonl (and NAME.source.json: where it came from); returns (path, records)."""
    if name not in PAPER_SETS:
        raise DataError(f"unknown data set {name!r}; prepare one of {', '.join(PAPER_SETS)}")
    spec, out = PAPER_SETS[name], data_dir(out)
    root = snapshot(spec.repo, list(spec.patterns), revision, command=prepare_command(name, out))
    files = local_files(root, list(spec.patterns))
    if not files:
        raise DataError(f"{spec.repo}: the snapshot {root} has no file matching {', '.join(spec.patterns)}")
    records = itertools.islice(spec.convert(_rows(root, files, spec)), limit)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.jsonl")
    count = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    if not count:
        os.remove(path + ".tmp")
        raise DataError(f"{spec.repo}: no usable records in {', '.join(files)}")
    os.replace(path + ".tmp", path)  # a half-written file never passes for a prepared set
    source = {"name": name, "repo": spec.repo, "revision": os.path.basename(root), "files": files,
              "records": count, "license": spec.license, "about": spec.about,
              "prepared": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open(os.path.join(out, f"{name}.source.json"), "w", encoding="utf-8") as f:
        json.dump(source, f, indent=1)
    return path, count
