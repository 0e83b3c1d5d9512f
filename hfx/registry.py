"""A registry of named plugins that imports each one on first use; lazy package exports.

The CLI lists names and validates a configuration against them on every start; importing every
policy and planner (and numpy with them) for that cost half a second. A registry here
holds ``name → "module:Class"`` and resolves the class only when it is looked up.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


def lazy_exports(package: str, exports: dict[str, str]) -> Any:
    """A module ``__getattr__`` (PEP 562) for ``package``: ``name → module`` re-exports imported
    on first access and then kept, so importing a light submodule does not pull in the rest."""

    def __getattr__(name: str) -> Any:
        try:
            module = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def load(path: str) -> object:
    """The object at ``"package.module:Name"``."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry(Mapping[str, T], Generic[T]):
    """``name → class`` with the import deferred to the first ``registry[name]``."""

    def __init__(self, kind: str, entries: dict[str, str]) -> None:
        self.kind = kind
        self._paths = dict(entries)
        self._loaded: dict[str, T] = {}

    def __getitem__(self, name: str) -> T:
        try:
            return self._loaded[name]
        except KeyError:
            pass
        try:
            path = self._paths[name]
        except KeyError:
            raise KeyError(name) from None
        obj = self._loaded[name] = cast(T, load(path))  # the entry names a T
        return obj

    def get_or_raise(self, name: str) -> T:
        """The plugin, or a ValueError that lists the choices (for user input)."""
        if name not in self._paths:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self)}")
        return self[name]

    def __contains__(self, name: object) -> bool:
        return name in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._paths)})"
