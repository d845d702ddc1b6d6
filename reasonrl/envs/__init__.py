"""reasonrl.envs — environments for multi-turn rollouts (``docs/environments.md``).

An ``Environment`` (``base.py``) is reset with a dataset row and stepped with the model's tool calls; it is
registered by name (``registry.py``; plugins through the ``reasonrl.environments`` entry-point group) and a row
names its environment in its ``environment`` column. The call formats are in ``parsers.py``, the tool turns'
tokens and the drift check in ``chat.py``, the loop that drives them in ``reasonrl.rollout.multiturn``.
Imports neither torch nor ray.
"""
from .base import EnvContext, Environment, Reset, StepResult, ToolCall, check_arguments, tool
from .registry import (ENTRY_POINT_GROUP, ENVIRONMENTS, available_environments, get_environment_class,
                       make_environment, register_environment)

__all__ = ["ENTRY_POINT_GROUP", "ENVIRONMENTS", "EnvContext", "Environment", "Reset", "StepResult", "ToolCall",
           "available_environments", "check_arguments", "get_environment_class", "make_environment",
           "register_environment", "tool"]
