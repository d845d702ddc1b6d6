"""An example environment plugin for reasonrl: a key-value store the model reads and writes with two tools.

Each dataset row naming ``environment: kv_store`` starts with the store in ``extra_info["store"]``; the model
calls ``get(key)`` and ``put(key, value)`` in the hermes format (``<tool_call>{"name": "get", "arguments":
{"key": "a"}}</tool_call>``). The environment gives reward 1.0 once the store holds ``extra_info["goal"]``
(every key set to its goal value) and ends the trajectory then.
"""
from __future__ import annotations

from reasonrl.envs import Environment, StepResult, tool

KEY = {"type": "string", "description": "the key"}


class KeyValueEnvironment(Environment):
    """A per-trajectory copy of the row's store; done when the store matches the row's goal."""

    parser = "hermes"

    def reset(self, row):
        info = row.get("extra_info") or {}
        self.store = dict(info.get("store") or {})
        self.goal = dict(info.get("goal") or {})
        return super().reset(row)  # keeps the row, offers the @tool methods below

    @tool("Read the value stored under a key.", {"type": "object", "properties": {"key": KEY}, "required": ["key"]})
    def get(self, key):
        if key not in self.store:
            return StepResult(f"Error: no key {key!r}; keys: {', '.join(sorted(self.store)) or 'none'}", error=True)
        return self.store[key]

    @tool("Store a value under a key.", {"type": "object", "properties": {"key": KEY, "value": {"type": "string"}},
                                         "required": ["key", "value"]})
    def put(self, key, value):
        self.store[key] = value
        done = all(self.store.get(k) == v for k, v in self.goal.items())
        return StepResult(f"stored {key}", reward=float(done), done=done)
