"""The tool registry: names to tool factories (``reasonrl.registry``). The built-in tool's module is imported on the
first lookup and registers itself; this module imports nothing of the tools, so registering never goes round a
circle. ``reasonrl.tools.make_tool`` builds a tool from it."""
from __future__ import annotations

from typing import Callable

from reasonrl.registry import Registry

from .base import Tool

TOOLS = Registry("tool", config_key="tool.name", builtins=("reasonrl.tools.python",))
"""Registered tool factories (a class or function taking the ``tool`` config section) by name (``tool.name``)."""


def register_tool(name: str) -> Callable[[Callable[..., Tool]], Callable[..., Tool]]:
    """Decorator that adds a tool factory under ``name``."""
    return TOOLS.register(name)
