"""Environments for tests/unit/envs/test_env_actors.py, in a module of their own so the environment actors (other processes,
on another Ray node) can import them: ``where`` reports the process and Ray node it runs in, ``die`` ends that
process, ``hang`` never returns. Imports only reasonrl.envs (no torch)."""
from __future__ import annotations

import json
import os
import threading

from reasonrl.envs import Environment, StepResult, register_environment, tool


@register_environment("test_where")
class WhereEnvironment(Environment):
    @tool("Where the environment runs.")
    def where(self):
        import ray

        info = {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "answer": self.row.get("extra_info", {}).get("answer")}
        return StepResult(json.dumps(info), reward=1.0)

    @tool("End the environment's process.")
    def die(self):
        os._exit(1)

    @tool("Never return.")
    def hang(self):
        threading.Event().wait()
