"""reasonrl.tools — tools the model calls while it solves (multi-turn rollout, ``docs/tools.md``).

``python``: fenced ```python blocks run in the sandbox (``reasonrl.sandboxes``), state kept across a trajectory's
calls. Add a tool with ``@register_tool("name")`` on a class following ``Tool``; build one with ``make_tool``.
Imports neither torch nor ray.
"""
from typing import Any

from .base import Tool, ToolResult, ToolSession
from .registry import TOOLS, register_tool


def make_tool(cfg: Any) -> Tool:
    """The tool named by ``cfg.name`` (the ``tool`` config section), built from that section."""
    return TOOLS.build(cfg.name, cfg)


__all__ = ["TOOLS", "Tool", "ToolResult", "ToolSession", "make_tool", "register_tool"]
