"""Hugging Face hub data sets: `hf:org/name[@revision][:config][:split]`.

Files come through `huggingface_hub` into the standard cache (atgrpo_jax/hf_cache.py: `$HF_HUB_CACHE`,
else `$HF_HOME/hub`, else ~/.cache/huggingface/hub, laid out `datasets--org--name/snapshots/REV/...`):
downloaded when the hub can be reached, read from the cache when it cannot or when
`HF_HUB_OFFLINE=1`; a data set in neither place is one error naming what to download.

Which files hold a config's split: the data card's `configs:` (its YAML `data_files`) when it has
them, else the hub's conventions (`data/test-00000-of-00001.parquet`, `test.jsonl`,
`CONFIG/test/0000.parquet`, ...). Parquet, JSON (lines), CSV and arrow files are read here; a data
set in another form (a loading script, ...) goes through the `datasets` library if installed.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import re

from atgrpo_jax import hf_cache
from atgrpo_jax.data.readers import TABLE_EXTENSIONS, DataError, read_file

@dataclasses.dataclass(frozen=True)
class HfSpec:
    name: str  # org/name
    revision: str | None = None
    config: str | None = None
    split: str | None = None


def parse_hf(source: str) -> HfSpec:
    """`hf:org/name[@revision][:config][:split]` -> HfSpec (an error names the expected form)."""
    body = source[3:] if source.startswith("hf:") else source
    parts = body.split(":")
    name, _, revision = parts[0].partition("@")
    if len(parts) > 3 or not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        raise DataError(f"{source!r}: expected hf:org/name[@revision][:config][:split]")
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else None
    return HfSpec(name, revision or None, config, split)


def snapshot(repo: str, patterns: list[str], revision: str | None = None, command: str | None = None) -> str:
    """A local snapshot directory of dataset `repo` holding (at least) the files matching `patterns`;
    `command` is what to run where it is missing (by default the hf download)."""
    try:
        return hf_cache.snapshot(repo, patterns, revision, repo_type="dataset", command=command)
    except hf_cache.HubError as e:
        raise DataError(f"{repo}: {e}") from None


def local_files(root: str, patterns: list[str]) -> list[str]:
    """Files under a snapshot whose repository path matches one of `patterns` (fnmatch, as the hub's
    allow_patterns: `*` also matches `/`), sorted so that shards come in order."""
    found = []
    for base, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), root).replace(os.sep, "/")
            if any(fnmatch.fnmatch(rel, p) for p in patterns):
                found.append(rel)
    return sorted(found)


def _card_configs(root: str) -> list[dict]:
    """The `configs:` list of a data card's YAML header ([] when it has none)."""
    path = os.path.join(root, "README.md")
    if not os.path.isfile(path):
        return []
    text = open(path, encoding="utf-8").read()
    match = re.match(r"---\s*\n(.*?)\n---", text, re.S)
    if not match:
        return []
    import yaml

    try:
        header = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError:
        return []
    configs = header.get("configs") or []
    return [c for c in configs if isinstance(c, dict)]


def _card_patterns(configs: list[dict], spec: HfSpec, source: str) -> tuple[list[str], str] | str | None:
    """(file patterns, split) for spec from the card's configs; a config that names only a `data_dir`
    gives that directory (its files named by convention); None when the card has no configs."""
    if not configs:
        return None
    names = [c.get("config_name", "default") for c in configs]
    if spec.config:
        if spec.config not in names:
            raise DataError(f"{source}: no config {spec.config!r}; the data card has {', '.join(names)}")
        config = configs[names.index(spec.config)]
    else:
        config = next((c for c in configs if c.get("default")), None) or \
            (configs[names.index("default")] if "default" in names else configs[0])
    data_files = config.get("data_files", [])
    if not data_files and config.get("data_dir"):
        return str(config["data_dir"]).strip("/")
    if isinstance(data_files, (str, list)) and not (isinstance(data_files, list) and data_files
                                                    and isinstance(data_files[0], dict)):
        by_split = {"train": [data_files] if isinstance(data_files, str) else list(data_files)}
    else:
        by_split = {d["split"]: [d["path"]] if isinstance(d["path"], str) else list(d["path"]) for d in data_files}
    split = _pick_split(spec.split, list(by_split), source)
    return by_split[split], split


def _pick_split(split: str | None, splits: list[str], source: str) -> str:
    if split is None:
        if "train" in splits or len(splits) == 1:
            return "train" if "train" in splits else splits[0]
        raise DataError(f"{source}: name a split (hf:org/name:config:split); it has {', '.join(splits)}")
    if split not in splits:
        raise DataError(f"{source}: no split {split!r}; it has {', '.join(splits) or 'none'}")
    return split


def _conventional_split(files: list[str], spec: HfSpec, source: str) -> list[str]:
    """The files of a split by the hub's naming conventions (`[CONFIG/][data/]SPLIT[-*].ext`,
    `CONFIG/SPLIT/*.ext`); a repository of one unnamed file is its train split."""
    if spec.config:
        files = [f for f in files if f.startswith(spec.config + "/")]
    by_split: dict[str, list[str]] = {}
    for f in files:
        parts = f.split("/")
        stem = re.split(r"[-_.]", parts[-1])[0]
        split = parts[-2] if len(parts) >= 2 and re.fullmatch(r"\d+\.\w+", parts[-1]) else stem
        by_split.setdefault(split, []).append(f)
    known = {s: fs for s, fs in by_split.items() if s in ("train", "test", "validation", "valid", "dev")
             or s == spec.split}
    if not known:
        if len(files) == 1 or spec.split is None:
            return files
        raise DataError(f"{source}: cannot tell which files hold split {spec.split!r} among {', '.join(files)}")
    return known[_pick_split(spec.split, sorted(known), source)]


def hf_files(source: str) -> list[str]:
    """Local paths of the data files that hold `source`'s config and split."""
    spec = parse_hf(source)
    root = snapshot(spec.name, ["README.md"], spec.revision)
    picked = _card_patterns(_card_configs(root), spec, source)
    if isinstance(picked, str):  # a config that is a directory: conventions inside it
        spec, picked = dataclasses.replace(spec, config=picked), None
    if picked:
        tries = [picked[0]]
    else:  # by name: the split's files first (a big repository's other splits stay on the hub), then all
        base = f"{spec.config}/" if spec.config else ""
        split = spec.split or "train"
        tries = [[f"{base}*{split}*{ext}" for ext in TABLE_EXTENSIONS] + [f"{base}*{split}/*"],
                 [f"{base}*{ext}" for ext in TABLE_EXTENSIONS]]
    for patterns in tries:
        root = snapshot(spec.name, patterns, spec.revision)
        files = [f for f in local_files(root, patterns) if os.path.splitext(f)[1].lower() in TABLE_EXTENSIONS]
        if files:
            break
    if not picked:
        files = _conventional_split(files, spec, source)
    return [os.path.join(root, f) for f in files]


def _with_datasets(source: str) -> list[dict]:
    spec = parse_hf(source)
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source} has no parquet, JSON, CSV or arrow files; reading it needs the `datasets` library: "
                        'pip install -e ".[data]"') from None
    try:
        data = datasets.load_dataset(spec.name, spec.config, split=spec.split or "train", revision=spec.revision)
    except Exception as e:  # the library's own errors are many; one line names it
        raise DataError(f"{source}: datasets.load_dataset failed ({str(e).splitlines()[0] if str(e) else e!r})") \
            from None
    return data.to_list()


def read_hf(source: str) -> list[dict]:
    """All rows of a hub data set's config and split (see the module docstring)."""
    files = hf_files(source)
    if not files:
        return _with_datasets(source)
    return [row for path in files for row in read_file(path)]
