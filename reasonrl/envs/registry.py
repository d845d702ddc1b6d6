"""The environment registry: names to ``Environment`` classes, the built-in ones and third-party ones from the
``reasonrl.environments`` entry-point group (as verifiers do with ``reasonrl.verifiers``)."""
from __future__ import annotations

from importlib import metadata
from typing import Callable, Dict, Type

from .base import EnvContext, Environment

ENTRY_POINT_GROUP = "reasonrl.environments"
ENVIRONMENTS: Dict[str, Type[Environment]] = {}
"""Registered environment classes by name (a dataset row's ``environment`` column)."""
_ENTRY_POINTS_LOADED = False


def register_environment(name: str) -> Callable[[Type[Environment]], Type[Environment]]:
    """Class decorator: ``@register_environment("name")`` on an ``Environment`` subclass."""

    def decorator(cls: Type[Environment]) -> Type[Environment]:
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise TypeError(f"@register_environment({name!r}) needs an Environment subclass, got {cls!r}")
        if ENVIRONMENTS.get(name, cls) is not cls:
            raise ValueError(f"environment {name!r} is already registered ({ENVIRONMENTS[name].__qualname__})")
        ENVIRONMENTS[name] = cls
        cls.name = name
        return cls

    return decorator


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in ENVIRONMENTS:
            continue
        obj = ep.load()  # a module that registers on import, or an Environment class
        if isinstance(obj, type) and issubclass(obj, Environment) and ep.name not in ENVIRONMENTS:
            register_environment(ep.name)(obj)


def available_environments() -> list:
    """Every environment name: built-in and from installed plugins."""
    _load_entry_points()
    return sorted(ENVIRONMENTS)


def get_environment_class(name: str) -> Type[Environment]:
    """The class registered as ``name``; a KeyError naming the known ones otherwise."""
    if name not in ENVIRONMENTS:
        _load_entry_points()
    if name not in ENVIRONMENTS:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVIRONMENTS)) or '(none)'}. "
                       f"Third-party environments register through the {ENTRY_POINT_GROUP!r} entry-point group.")
    return ENVIRONMENTS[name]


def make_environment(name: str, context: EnvContext) -> Environment:
    """A new ``name`` environment (one per trajectory) sharing ``context``."""
    return get_environment_class(name)(context)
