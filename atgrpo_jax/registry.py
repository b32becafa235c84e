"""Named variants (advantage estimators, loss aggregations, workflows, games): one decorated
function each, looked up by the name a config gives.

    ADVANTAGES = Registry("algo.advantage")

    @ADVANTAGES.register("grpo")
    def grpo(rewards, mask): ...

    ADVANTAGES["grpo"]      # the function; an unknown name is a KeyError naming the close ones
    ADVANTAGES.names()      # what config validation checks against, so lists cannot drift
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

from atgrpo_jax.errors import UnknownName  # noqa: F401  (raised here; also importable from here)

T = TypeVar("T")


def closest(name: str, choices) -> str:
    """' (did you mean X?)' for the closest of `choices`, or ''."""
    match = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


class Registry(Generic[T]):
    def __init__(self, key: str):
        self.key = key  # the config key whose value names a variant (for error messages)
        self._items: dict[str, T] = {}

    def register(self, name: str, value: T | None = None):
        """Register `value` under `name`, or use as a decorator: `@REGISTRY.register(name)`."""
        def add(v: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.key}: {name!r} is registered twice")
            self._items[name] = v
            return v
        return add if value is None else add(value)

    def __getitem__(self, name: str) -> T:
        if name not in self._items:
            raise UnknownName(f"{self.key}: unknown {name!r}{closest(name, self._items)}; "
                              f"known: {', '.join(sorted(self._items))}")
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def items(self):
        return self._items.items()


# Objects handed to the Python API (`atgrpo_jax.Trainer`: reward functions, data sets, workflows), under
# `py:` names that stand in the config (config.json holds the name, so a resumed run finds the same one).
OBJECTS: dict[str, Any] = {}


def register_object(obj: Any, kind: str) -> str:
    """A `py:` name for `obj`, stable across processes: a function's module and qualified name, another
    object's kind and the digest of its repr (a data set's records)."""
    import hashlib

    qualname = getattr(obj, "__qualname__", None)
    if callable(obj) and qualname and "<" not in qualname:
        name = f"py:{kind}:{getattr(obj, '__module__', '?')}.{qualname}"
    else:
        name = f"py:{kind}:{hashlib.sha1(repr(obj).encode()).hexdigest()[:12]}"
    OBJECTS[name] = obj
    return name


def registered(name: str, key: str) -> Any:
    """The object behind a `py:` name; a ValueError naming the config `key` when this process has none."""
    if name not in OBJECTS:
        raise ValueError(f"{key}={name!r}: no such object in this process (a `py:` name stands for an object "
                         f"handed to atgrpo_jax.Trainer): {how_to_pass(name, key)}")
    return OBJECTS[name]


def how_to_pass(name: str, key: str) -> str:
    """What a command run outside that Python process can be given instead of the `py:` name."""
    kind, _, where = name[len("py:"):].partition(":")
    module, _, qualname = where.rpartition(".")
    if module and module not in ("__main__", "?") and "." not in qualname:
        return f"pass it by import path, --config.{key}={module}:{qualname}"
    if module == "__main__":
        return (f"the {kind} {qualname!r} was defined in a script: move it into a module and pass "
                f"--config.{key}=module:{qualname}, or run through the same Python API")
    return "run through the same Python API (this object has no import path)"


def import_function(spec: str, key: str) -> Callable[..., Any]:
    """`package.module:function` (or a `py:` name of the Python API) -> the function (a user's workflow
    factory or reward); a bad spec is a ValueError naming the config `key`."""
    if str(spec).startswith("py:"):
        return registered(str(spec), key)
    module_name, colon, attr = str(spec).partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"{key}={spec!r}: give it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{key}={spec!r}: cannot import {module_name!r}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{key}={spec!r}: {module_name} has no callable {attr!r}")
    return fn
