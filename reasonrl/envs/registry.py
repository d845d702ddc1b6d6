"""The environment registry: names to ``Environment`` classes, the shipped ones (``builtins.py``, imported on the
first lookup) and third-party ones from the ``reasonrl.environments`` entry-point group (``reasonrl.registry``)."""
from __future__ import annotations

from typing import Callable, Type

from reasonrl.registry import Registry, named_subclass

from .base import EnvContext, Environment

ENTRY_POINT_GROUP = "reasonrl.environments"


ENVIRONMENTS = Registry("environment", config_key="a row's environment column or env.default",
                        entry_point_group=ENTRY_POINT_GROUP, builtins=("reasonrl.envs.builtins",),
                        check=named_subclass(Environment, "register_environment", "an"))
"""Registered environment classes by name (a dataset row's ``environment`` column)."""


def register_environment(name: str) -> Callable[[Type[Environment]], Type[Environment]]:
    """Class decorator: ``@register_environment("name")`` on an ``Environment`` subclass."""
    return ENVIRONMENTS.register(name)


def available_environments() -> list:
    """Every environment name: built-in and from installed plugins."""
    return ENVIRONMENTS.names()


def get_environment_class(name: str) -> Type[Environment]:
    """The class registered as ``name``; ``UnknownName`` (a KeyError) naming the known ones otherwise."""
    return ENVIRONMENTS[name]


def make_environment(name: str, context: EnvContext) -> Environment:
    """A new ``name`` environment (one per trajectory) sharing ``context``."""
    return ENVIRONMENTS.build(name, context)
