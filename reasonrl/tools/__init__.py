"""reasonrl.tools — tools the model calls while it solves (multi-turn rollout, ``docs/tools.md``).

``python``: fenced ```python blocks run in the sandbox (``reasonrl.sandboxes``), state kept across a trajectory's
calls. Add a tool with ``@register_tool("name")`` on a class following ``Tool``. Imports neither torch nor ray.
"""
from .base import TOOLS, Tool, ToolResult, ToolSession, make_tool, register_tool

__all__ = ["TOOLS", "Tool", "ToolResult", "ToolSession", "make_tool", "register_tool"]
