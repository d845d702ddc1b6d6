"""Names to implementations: the one idiom every pluggable part uses.

Algorithms (advantage estimators, policy losses, KL estimators and controllers, loss aggregations), verifiers,
tools, environments, sandboxes, rollout engines, loggers, tool-call parsers and dataset recipes each keep one
``Registry``. An implementation joins it in one of three ways:

- ``@REG.register("name")`` on a class or function, in the module that defines it (built-ins import their modules
  once, the first time the registry is asked: ``builtins=``);
- ``REG.register_lazy("name", "package.module:attr")`` where importing the implementation is costly or needs an
  optional dependency (vLLM, Docker): nothing is imported until the name is asked for;
- an installed package's entry point in the registry's group (``entry_point_group=``, e.g. ``reasonrl.verifiers``),
  read once, the first time a name is not found.

A registry is a read-only ``Mapping`` (``name in REG``, ``REG[name]``, ``sorted(REG)``), so a config check and a
docs table read it like a dict. An unknown name raises ``UnknownName``, which is both a ``KeyError`` and a
``ValueError``, and names the kind, the known names and where plugins register. Imports nothing of reasonrl, torch
or ray: the verifiers' and sandboxes' small processes use it too.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib import metadata
from typing import Any, Callable, Dict, Iterator, Optional, Sequence

__all__ = ["Registry", "UnknownName", "named_subclass"]


class UnknownName(KeyError, ValueError):
    """A name no implementation is registered under (a KeyError for lookups, a ValueError for config checks)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


class Registry(Mapping):
    """Names to implementations of one kind (``kind`` names it in errors, e.g. "verifier")."""

    def __init__(self, kind: str, *, config_key: Optional[str] = None, entry_point_group: Optional[str] = None,
                 builtins: Sequence[str] = (), check: Optional[Callable[[str, Any], Any]] = None) -> None:
        """``config_key``: the config key that names one (said in errors); ``entry_point_group``: where installed
        plugins register; ``builtins``: modules imported once, on the first lookup, whose definitions register
        themselves; ``check(name, obj)``: raises TypeError for an object that is not of this kind, and may return
        the object to store (e.g. after setting its ``name``)."""
        self.kind = kind
        self.config_key = config_key
        self.entry_point_group = entry_point_group
        self._builtins = tuple(builtins)
        self._check = check
        self._items: Dict[str, Any] = {}
        self._lazy: Dict[str, str] = {}
        self._builtins_loaded = not self._builtins
        self._entry_points_loaded = entry_point_group is None

    # -- registering ---------------------------------------------------------------------------------------------
    def register(self, name: str, obj: Any = None) -> Any:
        """``@REG.register("name")`` as a decorator, or ``REG.register("name", obj)``. A taken name is an error,
        except for the same definition from a module imported a second time under another name (a twin)."""
        if obj is None:
            return lambda target: self.register(name, target)
        if self._check is not None:
            obj = self._check(name, obj) or obj
        existing = self._items.get(name)
        if existing is not None and (existing is obj or not _same_definition(existing, obj)):
            raise ValueError(f"{self.kind} {name!r} is already registered ({_describe(existing)})")
        self._items[name] = obj
        self._lazy.pop(name, None)
        return obj

    def register_lazy(self, name: str, target: str) -> None:
        """Registers ``"package.module:attr"`` (or a module, ``"package.module"``) under ``name``, imported on first use."""
        if name in self._items or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._lazy[name] = target

    def unregister(self, name: str) -> None:
        """Removes ``name`` (a test's temporary entry); a name not registered is ignored."""
        self._items.pop(name, None)
        self._lazy.pop(name, None)

    # -- looking up ----------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        self._load_builtins()
        if name not in self._items and name not in self._lazy:
            self._load_entry_points()
        if name in self._lazy:
            self.register(name, _import(self._lazy[name]))
        if name not in self._items:
            raise UnknownName(self._unknown(name))
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        if name not in self._items and name not in self._lazy:
            self._load_entry_points()
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def names(self) -> list:
        """Every registered name, built-in, lazy and from installed plugins, sorted."""
        self._load_builtins()
        self._load_entry_points()
        return sorted(set(self._items) | set(self._lazy))

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``REG[name](*args, **kwargs)``: an instance of the class (or the factory's result) registered as ``name``."""
        return self[name](*args, **kwargs)

    def rescan_entry_points(self) -> None:
        """Reads the entry-point group again on the next miss (a plugin installed after the first lookup)."""
        self._entry_points_loaded = self.entry_point_group is None

    # -- loading -------------------------------------------------------------------------------------------------
    def _load_builtins(self) -> None:
        if not self._builtins_loaded:
            self._builtins_loaded = True
            for module in self._builtins:
                importlib.import_module(module)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in metadata.entry_points(group=self.entry_point_group):
            if ep.name in self._items or ep.name in self._lazy:
                continue
            obj = ep.load()  # a module that registers on import, or the implementation itself
            if ep.name not in self._items and not isinstance(obj, type(importlib)):
                self.register(ep.name, obj)

    def _unknown(self, name: str) -> str:
        where = f" ({self.config_key})" if self.config_key else ""
        known = ", ".join(sorted(set(self._items) | set(self._lazy))) or "(none)"
        msg = f"unknown {self.kind} {name!r}{where}; known: {known}"
        if self.entry_point_group:
            msg += f". Third-party ones register through the {self.entry_point_group!r} entry-point group"
        return msg + "."


def named_subclass(base: type, decorator: str, article: str = "a") -> Callable[[str, Any], Any]:
    """A registry's ``check`` for classes of one kind: ``obj`` must subclass ``base`` (TypeError naming
    ``@<decorator>(name)`` otherwise), and gets ``name`` as its ``name`` attribute."""
    def check(name: str, obj: Any) -> Any:
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise TypeError(f"@{decorator}({name!r}) needs {article} {base.__name__} subclass, got {obj!r}")
        obj.name = name
        return obj
    return check


def _same_definition(a: Any, b: Any) -> bool:
    """A module imported twice under two names (a source checkout's symlinks) defines equal-named twins."""
    return (getattr(a, "__qualname__", None) is not None and a.__qualname__ == getattr(b, "__qualname__", None)
            and getattr(a, "__module__", "").rsplit(".", 1)[-1] == getattr(b, "__module__", "").rsplit(".", 1)[-1])


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
