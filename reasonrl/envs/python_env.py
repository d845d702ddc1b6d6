"""The ``python`` environment: the loop's tool (``reasonrl.tools``, by default the sandboxed Python tool) as an
environment, in its own format (``fenced_python``: a ```python block, its output shown as a ```output block).

Every trajectory gets its own tool session (interpreter state kept across its calls); the tool object itself (its
sandbox backend) is shared by the loop's environments (``EnvContext.shared("tool")``). ``task=math_tool`` rows name
no environment and run this one as the run's default (``env.default``).
"""
from __future__ import annotations

from typing import Any, Dict, List

from .base import EnvContext, Environment, StepResult, ToolCall, check_arguments
from .registry import register_environment


def context_tool(context: EnvContext) -> Any:
    """The loop's tool: the one handed to the loop, else built from the ``tool`` config section."""
    def build():
        from reasonrl.tools import make_tool

        if context.tool_cfg is None:  # the loop always hands its ``tool`` section over (rollout/multiturn.py)
            raise ValueError("the python environment needs the run's tool section: EnvContext(tool_cfg=cfg.tool)")
        return make_tool(context.tool_cfg)

    return context.shared("tool", build)


@register_environment("python")
class PythonEnvironment(Environment):
    """One session of the loop's tool per trajectory; the single tool takes ``{"code": str}``."""

    parser = "fenced_python"

    def __init__(self, context: EnvContext = None) -> None:
        super().__init__(context)
        self.tool = context_tool(self.context)
        self.session = None

    def tools(self) -> List[Dict[str, Any]]:
        return [{"type": "function", "function": {
            "name": self.tool.name, "description": "Run Python code; what it prints is shown. State persists.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]

    def step(self, call: ToolCall) -> StepResult:
        if call.name != self.tool.name:
            return StepResult(f"Error: unknown tool {call.name[:60]!r}; available: {self.tool.name}", error=True)
        why = check_arguments(self.tools()[0]["function"]["parameters"], call.arguments)
        if why is not None:
            return StepResult(f"Error: bad call to {call.name}: {why}", error=True)
        if self.session is None:
            self.session = self.tool.open_session()
        result = self.session.call(call.arguments["code"])
        return StepResult(result.output, error=result.error, timed_out=result.timed_out)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
