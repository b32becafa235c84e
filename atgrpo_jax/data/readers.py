"""Rows of a local data source: a JSONL/JSON/CSV file, a parquet file, a Hugging Face `save_to_disk`
directory (arrow files); hub data sets are hf_sets.py's, and `atgrpo_jax.data` reads either.

Every reader returns a list of plain dicts (column -> Python value). Errors a user can fix are
`DataError`s with one line that names the source and what is wrong.
"""
from __future__ import annotations

import csv
import json
import os
import re
from typing import Any, Iterable, Iterator, Mapping, Sequence

from atgrpo_jax.errors import DataError  # noqa: F401  (raised here; also importable from here)

TABLE_EXTENSIONS = (".jsonl", ".json", ".parquet", ".arrow", ".csv")


def pyarrow():
    """pyarrow, or a DataError naming the extra that installs it."""
    try:
        import pyarrow as pa
        import pyarrow.csv  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DataError('reading parquet/arrow needs pyarrow: pip install -e ".[data]"') from None
    return pa


def _utf8_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of a text file; a line that is not UTF-8 is a DataError naming file and line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                                "save the file as UTF-8") from None


def iter_jsonl(path: str) -> Iterator[dict]:
    """Records of a JSONL file, one per non-empty line (an error names the line)."""
    for n, line in _utf8_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{n}: a record must be a JSON object, got {type(record).__name__}")
        yield record


def read_json(path: str) -> list[dict]:
    """A .json file: a list of records, or {"data"/"rows": [...]}, or JSON lines."""
    text = "".join(line for _, line in _utf8_lines(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return list(iter_jsonl(path))  # JSON lines saved as .json (the hub's json builder reads both)
    if isinstance(data, dict):
        data = data.get("data", data.get("rows", [data]))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{path}: expected a list of JSON objects")
    return data


def iter_parquet(path: str, columns: Sequence[str] | None = None, batch_rows: int = 256) -> Iterator[dict]:
    """Rows of a parquet file in batches (a big shard never sits in memory whole)."""
    pa = pyarrow()
    try:
        f = pa.parquet.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a parquet file ({e})") from None
    if columns is not None:
        columns = [c for c in columns if c in f.schema_arrow.names]
    for batch in f.iter_batches(batch_size=batch_rows, columns=columns):
        yield from batch.to_pylist()


def read_arrow(path: str) -> list[dict]:
    """An arrow file as `datasets` writes it (IPC stream), or an IPC file."""
    pa = pyarrow()
    try:
        with pa.memory_map(path) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not an arrow file ({e})") from None
    return table.to_pylist()


def read_saved_dataset(path: str) -> list[dict]:
    """A directory written by `datasets`' `Dataset.save_to_disk` (state.json + arrow files)."""
    dict_file = os.path.join(path, "dataset_dict.json")
    if os.path.isfile(dict_file):
        with open(dict_file, encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        raise DataError(f"{path} holds the splits {', '.join(splits)} (a DatasetDict): name one, e.g. "
                        f"{os.path.join(path, splits[0] if splits else 'train')}")
    state_file = os.path.join(path, "state.json")
    if not os.path.isfile(state_file):
        raise DataError(f"{path} is a directory but not a saved data set (no state.json or dataset_dict.json)")
    with open(state_file, encoding="utf-8") as f:
        files = [d["filename"] for d in json.load(f).get("_data_files", [])]
    if not files:
        raise DataError(f"{state_file} lists no data files")
    return [row for name in files for row in read_arrow(os.path.join(path, name))]


def read_file(path: str) -> list[dict]:
    """All rows of one local file or saved-data-set directory, by its kind."""
    if os.path.isdir(path):
        return read_saved_dataset(path)
    if not os.path.isfile(path):
        hub = " (a hub data set is written hf:org/name)" if re.fullmatch(r"[\w.-]+/[\w.-]+", path) else ""
        raise DataError(f"data file {path!r} does not exist{hub}")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".jsonl":
        return list(iter_jsonl(path))
    if ext == ".json":
        return read_json(path)
    if ext == ".parquet":
        return list(iter_parquet(path))
    if ext == ".arrow":
        return read_arrow(path)
    if ext == ".csv":  # every column as text, as a CSV file has no types
        pa = pyarrow()
        names = next(csv.reader(line for _, line in _utf8_lines(path)), [])
        try:
            options = pa.csv.ConvertOptions(column_types={n: pa.string() for n in names})
            return pa.csv.read_csv(path, convert_options=options).to_pylist()
        except pa.ArrowException as e:
            raise DataError(f"{path}: not a CSV file ({e})") from None
    raise DataError(f"{path}: unknown data format {ext or '(no extension)'!r}; use .jsonl, .json, .parquet, .arrow, "
                    ".csv, a save_to_disk directory or hf:org/name")


def is_source(name: str) -> bool:
    """Whether a data-set name is a source to read (a path or hf: name) rather than a registered name."""
    return (name.startswith("hf:") or os.sep in name or "/" in name
            or os.path.splitext(name)[1].lower() in TABLE_EXTENSIONS)


def map_fields(rows: Iterable[Mapping[str, Any]], source: str, required: Sequence[str],
               fields: Mapping[str, str] | None = None) -> list[dict]:
    """Rows with each required field under its own name: `fields` maps a field to the source's column
    (e.g. {"question": "problem"}). A missing column is one error naming it and the columns there are."""
    fields = dict(fields or {})
    out = []
    for n, row in enumerate(rows):
        record = dict(row)
        for name in required:
            column = fields.get(name, name)
            if column not in row:
                hint = f" (env.kwargs.fields maps {name!r} to {column!r})" if column != name else \
                    f"; map it with env.kwargs.fields={{{name!r}: COLUMN}}"
                raise DataError(f"{source}: record {n + 1} has no field {column!r}{hint}; its fields: "
                                f"{', '.join(map(str, row)) or '(none)'}")
            record[name] = row[column]
        out.append(record)
    if not out:
        raise DataError(f"{source}: no records")
    return out
