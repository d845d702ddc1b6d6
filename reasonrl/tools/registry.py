"""The tool registry: names to tool factories. Imports nothing of the tools themselves (they import it), so
registering never goes round a circle; ``reasonrl.tools.make_tool`` builds a tool from it."""
from __future__ import annotations

from typing import Callable, Dict

from .base import Tool

TOOLS: Dict[str, Callable[..., Tool]] = {}
"""Registered tool factories by name (``tool.name``)."""


def register_tool(name: str) -> Callable[[Callable[..., Tool]], Callable[..., Tool]]:
    """Decorator that adds a tool factory (a class or function taking the ``tool`` config section) under ``name``."""

    def decorator(factory: Callable[..., Tool]) -> Callable[..., Tool]:
        if name in TOOLS:
            raise ValueError(f"tool {name!r} is already registered")
        TOOLS[name] = factory
        return factory

    return decorator
