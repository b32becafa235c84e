"""Typed config sections: frozen dataclasses whose fields carry their documentation, what they must
be, and whether a resumed run may change them.

Each section is defined next to the code that reads it (`models/section.py`, `rollout/section.py`,
...) and checks itself when it is built; `train/config.py` assembles them into the run's `Config`.
The ml-collections `ConfigDict` stays the file format and the command line's edge: `base_config()`
is made from these defaults, and `Config.from_mapping` converts a ConfigDict once.

    @dataclasses.dataclass(frozen=True)
    class LoraSettings(Section):
        PATH = "lora"
        rank: int = key(16, "adapter rank r", check=positive)
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, Callable, ClassVar

from atgrpo_jax.errors import ConfigError
from atgrpo_jax.registry import closest

# A field's check: (predicate, message); the message is formatted with the value (`{value!r}`).
Check = tuple[Callable[[Any], bool], str]
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max

positive: Check = (lambda v: v > 0, "must be > 0, got {value!r}")
non_negative: Check = (lambda v: v >= 0, "must be >= 0, got {value!r}")


def at_least(low) -> Check:
    return (lambda v: v >= low, f"must be >= {low}, got {{value!r}}")


def within(low, high, *, high_open: bool = False) -> Check:
    """low <= v <= high (v < high when high_open)."""
    closing = ")" if high_open else "]"
    return ((lambda v: low <= v < high) if high_open else (lambda v: low <= v <= high),
            f"must be in [{low}, {high}{closing}, got {{value!r}}")


def key(default, doc: str, *, check: Check | None = None, choices=None, resumable: bool = False):
    """A section's field: its default, its documentation (its row of the config reference), a check
    and/or the values it may take (a collection, or a function returning one, for registries filled at
    import), and whether a resumed run may change it (how long, how often, where: never the math)."""
    meta = {"doc": doc, "check": check, "choices": choices, "resumable": resumable}
    if isinstance(default, dict):  # an open section: keys of the user's choosing
        return dataclasses.field(default_factory=dict, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def sub(section: type, doc: str, *, resumable: bool = False):
    """A nested section (with `resumable`: every key of it may change on resume)."""
    return dataclasses.field(default_factory=section, metadata={"doc": doc, "section": True,
                                                                "resumable": resumable})


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section: typed fields from `key`/`sub`, each checked on construction (its type, its
    choices, its check), then `check()` for the rules between the section's own fields."""

    PATH: ClassVar[str] = ""  # where the section sits in the config ("rollout"); errors name config.PATH.KEY

    def __post_init__(self):
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, self._checked(f, hints[f.name], getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Rules between this section's fields (a subclass's); `fail` names the key."""

    def fail(self, name: str, msg: str):
        raise ConfigError(f"config.{self.PATH + '.' if self.PATH else ''}{name}: {msg}")

    def require(self, ok: bool, name: str, msg: str) -> None:
        if not ok:
            self.fail(name, msg)

    @classmethod
    def from_mapping(cls, values, path: str = ""):
        """The section from a mapping (a ConfigDict, a saved config.json's dict); a key it does not
        have is an error naming the closest one."""
        names = [f.name for f in dataclasses.fields(cls)]
        where = f"config.{path or cls.PATH}"
        for name in values.keys():
            if name not in names:
                raise ConfigError(f"{where}.{name}: not a key of this version{closest(name, names)}")
        hints = _hints(cls)
        kwargs = {}
        for name in values.keys():
            value = values[name]
            kind = hints[name]
            if isinstance(kind, type) and issubclass(kind, Section) and not isinstance(value, kind):
                value = kind.from_mapping(value)
            kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict:
        """Plain values (tuples as lists, as JSON has them), sections as dicts."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to_dict() if isinstance(v, Section) else _plain(v)
        return out

    def replace(self, **changes):
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)

    def replace_at(self, dotted: str, value):
        """A copy with the key at `dotted` (e.g. "rollout.k") set to `value`."""
        head, _, rest = dotted.partition(".")
        return self.replace(**{head: getattr(self, head).replace_at(rest, value) if rest else value})

    def _checked(self, f: dataclasses.Field, kind, value):
        if isinstance(kind, type) and issubclass(kind, Section):
            if isinstance(value, kind):
                return value
            if not hasattr(value, "keys"):
                self.fail(f.name, f"must be a section of keys, got {value!r}")
            return kind.from_mapping(value)
        value = self._typed(f.name, kind, value)
        choices = f.metadata.get("choices")
        if callable(choices):
            choices = choices()
        if choices is not None and value not in choices:
            self.fail(f.name, f"unknown {value!r}{closest(value, choices)}; known: {', '.join(map(str, choices))}")
        check = f.metadata.get("check")
        if check is not None and not check[0](value):
            self.fail(f.name, check[1].format(value=value))
        return value

    def _typed(self, name: str, kind, value):
        """`value` as the field's type (a list as a tuple, a mapping as a plain dict), or an error."""
        if kind is bool or kind == (bool | None):
            ok = isinstance(value, bool) or (value is None and kind != bool)
            self.require(ok, name, f"must be True{', False or None' if kind != bool else ' or False'}, got {value!r}")
        elif kind is int:
            self.require(isinstance(value, int) and not isinstance(value, bool), name,
                         f"must be an int, got {value!r}")
        elif kind is float:
            self.require(isinstance(value, (int, float)) and not isinstance(value, bool), name,
                         f"must be a number, got {value!r}")
            self.require(math.isfinite(value), name, f"must be a finite number, got {value}")
            self.require(abs(value) <= FLOAT32_MAX, name, f"must be a finite float32 number (at most "
                         f"{FLOAT32_MAX:.4g} in size: the arrays it meets are float32), got {value:g}")
            return float(value)
        elif kind is str:
            self.require(isinstance(value, str), name, f"must be a string, got {value!r}")
        elif kind is tuple:
            self.require(isinstance(value, (tuple, list)), name, f"must be a tuple, got {value!r}")
            return tuple(value)
        elif kind is dict:
            self.require(hasattr(value, "keys"), name, f"must be a section of keys, got {value!r}")
            return _plain(value)
        return value


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _plain(v):
    """Nested mappings (ConfigDicts) as dicts, tuples as lists: JSON's kinds."""
    if hasattr(v, "keys") and not isinstance(v, Section):
        return {k: _plain(v[k]) for k in v.keys()}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def rows(cls, prefix: str = ""):
    """(key, default, meaning) of every key of section `cls` and its sections, in order: the
    config reference (a section's own row has no default)."""
    for f in dataclasses.fields(cls):
        name = prefix + f.name
        if f.metadata.get("section"):
            yield name, "", f.metadata["doc"]
            yield from rows(f.default_factory, name + ".")
        else:
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            yield name, "" if isinstance(default, dict) else shown(default), f.metadata["doc"]


def shown(value) -> str:
    """A default as a config file writes it."""
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, tuple):
        return "(" + ", ".join(shown(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def resumable(cls, prefix: str = "") -> tuple[str, ...]:
    """The keys (a whole section as "name.") of `cls` that a resumed run may change."""
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("section"):
            out += [prefix + f.name + "."] if f.metadata["resumable"] else list(
                resumable(f.default_factory, prefix + f.name + "."))
        elif f.metadata["resumable"]:
            out.append(prefix + f.name)
    return tuple(out)
