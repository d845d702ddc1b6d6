"""Environments in Ray actors (``env.placement=ray``): the steps run in a pool of actors, on whichever nodes have
the CPUs (and the ``env.resources``) they ask for, instead of in the rollout worker's own threads.

``EnvActorPool`` starts ``env.num_actors`` actors of ``EnvHost`` (``env.num_cpus_per_actor`` CPUs each, the Ray
custom resources ``env.resources``: a node started with ``--resources='{"env_node": 8}'`` takes the actors that ask
for ``env_node``), each running up to ``tool.concurrency`` steps at once in threads. ``pool.make(name)`` gives a
``RemoteEnvironment``: the ``Environment`` interface the loop (``reasonrl.rollout.multiturn``) already drives, whose
``reset``/``step``/``close`` are calls to the trajectory's actor (the least busy one when it starts). So the limits
and the failure handling are the loop's own: every step still runs under ``env.step_timeout_s`` in the loop's step
runner (``steps.py``), and a call that fails there (the environment raised, the actor died, the node went away)
fails that trajectory only (``env_failed``), counted like a local one. A dead actor is restarted by Ray
(``max_restarts=-1``), so later trajectories get a fresh process; the trajectories it held fail.

The environment class is resolved here (the registry of this process) and sent to the actor with the call, so an
actor runs the same class as the loop would locally; a plugin must be importable on the actors' nodes too.
Ray is imported only when a pool starts (``import reasonrl.envs`` stays free of it).
"""
from __future__ import annotations

import itertools
import os
import socket
import threading
from typing import Any, Dict, List, Optional

from .base import EnvContext, Environment, Reset, StepResult, ToolCall
from .registry import get_environment_class


class EnvHost:
    """What runs inside one environment actor: the open environments by trajectory key, one shared
    ``EnvContext`` (the shared resources of the actor's environments, e.g. the python tool's sandbox)."""

    def __init__(self, tool_cfg: Any, env_cfg: Any) -> None:
        self.context = EnvContext(tool_cfg, env_cfg)
        self.envs: Dict[int, Environment] = {}
        self._lock = threading.Lock()

    def where(self) -> Dict[str, Any]:
        """Where this actor runs: its Ray node id, host name and process id."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
                "pid": os.getpid()}

    def reset(self, key: int, cls: type, row: Dict[str, Any]) -> Reset:
        env = cls(self.context)
        with self._lock:
            self.envs[key] = env
        return env.reset(row)

    def step(self, key: int, call: ToolCall) -> StepResult:
        with self._lock:
            env = self.envs.get(key)
        if env is None:  # the actor was restarted since the trajectory started: its environment is gone
            raise RuntimeError(f"trajectory {key} has no environment in this actor (pid {os.getpid()}): the actor "
                               f"was restarted")
        return env.step(call)

    def close(self, key: int) -> None:
        with self._lock:
            env = self.envs.pop(key, None)
        if env is not None:
            env.close()

    def open_count(self) -> int:
        """Environments open in this actor (trajectories that have not ended)."""
        with self._lock:
            return len(self.envs)

    def shutdown(self) -> None:
        with self._lock:
            envs, self.envs = list(self.envs.values()), {}
        for env in envs:
            try:
                env.close()
            except Exception:
                pass
        self.context.close()


class RemoteEnvironment(Environment):
    """One trajectory's environment in an actor of the pool: each call waits at most ``timeout_s`` (the loop's
    step runner has the same limit and reports the timeout; this only frees the waiting thread)."""

    def __init__(self, pool: "EnvActorPool", slot: int, cls: type, key: int) -> None:
        super().__init__(None)
        self.pool, self.slot, self.cls, self.key = pool, slot, cls, key
        self.name, self.parser = cls.name, cls.parser
        self._open = False

    def reset(self, row: Dict[str, Any]) -> Reset:
        self.row = row
        self._open = True
        return self.pool.get(self.pool.actors[self.slot].reset.remote(self.key, self.cls, row))

    def step(self, call: ToolCall) -> StepResult:
        return self.pool.get(self.pool.actors[self.slot].step.remote(self.key, call))

    def close(self) -> None:
        if self._open:
            self._open = False
            self.pool.release(self.slot, self.key)


class EnvActorPool:
    """``env.num_actors`` environment actors, started on first use (see the module docstring)."""

    def __init__(self, tool_cfg: Any, env_cfg: Any) -> None:
        self.tool_cfg, self.env_cfg = tool_cfg, env_cfg
        self.actors: List[Any] = []
        self.busy: List[int] = []  # open trajectories per actor (this loop's count)
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._closing: List[Any] = []  # close calls in flight (waited for, errors ignored, before the next start)

    @property
    def timeout_s(self) -> float:
        return float(getattr(self.env_cfg, "step_timeout_s", 60.0))

    def options(self) -> Dict[str, Any]:
        """The actors' Ray options."""
        e = self.env_cfg
        return {"num_cpus": float(e.num_cpus_per_actor), "resources": dict(e.resources or {}),
                "max_restarts": -1, "max_task_retries": 0,
                "max_concurrency": max(1, int(getattr(self.tool_cfg, "concurrency", 8))),
                "scheduling_strategy": "DEFAULT"}  # not the calling worker's placement group: a node of their own

    def start(self) -> None:
        """Start the actors (once): refused at once, naming the keys, when no live node of the cluster has what one
        actor asks for; waits until every actor answers (``where``)."""
        if self.actors:
            return
        import ray

        if not ray.is_initialized():
            raise RuntimeError("env.placement=ray runs environments in Ray actors, but this process is not connected "
                               "to a Ray cluster (set env.placement=local to run them in this process)")
        opts = self.options()
        need = {"CPU": opts["num_cpus"], **opts["resources"]}
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        if not any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
            raise RuntimeError(f"env.num_cpus_per_actor / env.resources: an environment actor needs {need}, which no "
                               f"node of the Ray cluster has (nodes: {nodes})")
        remote = ray.remote(EnvHost)
        actors = [remote.options(**opts).remote(self.tool_cfg, self.env_cfg)
                  for _ in range(int(self.env_cfg.num_actors))]
        ray.get([a.where.remote() for a in actors], timeout=max(60.0, self.timeout_s))
        self.actors, self.busy = actors, [0] * len(actors)

    def where(self) -> List[Dict[str, Any]]:
        """Each actor's node id, host name and process id."""
        self.start()
        return [self.get(a.where.remote()) for a in self.actors]

    def get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=self.timeout_s)

    def make(self, name: str) -> RemoteEnvironment:
        """A new ``name`` environment on the least busy actor (the class resolved here: KeyError if unknown)."""
        cls = get_environment_class(name)
        self.start()
        with self._lock:
            slot = min(range(len(self.actors)), key=lambda i: self.busy[i])
            self.busy[slot] += 1
            key = next(self._keys)
        return RemoteEnvironment(self, slot, cls, key)

    def release(self, slot: int, key: int) -> None:
        """The trajectory ``key`` ended: its environment is closed in its actor (not waited for)."""
        with self._lock:
            self.busy[slot] = max(0, self.busy[slot] - 1)
            self._closing.append(self.actors[slot].close.remote(key))
            if len(self._closing) > 256:
                self._settle()

    def _settle(self) -> None:
        """Drop the close calls that have finished (their errors, e.g. from a dead actor, are not needed)."""
        import ray

        done, self._closing = ray.wait(self._closing, num_returns=len(self._closing), timeout=0)
        for ref in done:
            try:
                ray.get(ref)
            except Exception:
                pass

    def close(self) -> None:
        """Close every environment and end the actors."""
        if not self.actors:
            return
        import ray

        actors, self.actors, self.busy = self.actors, [], []
        refs, self._closing = [a.shutdown.remote() for a in actors] + self._closing, []
        ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)  # a dead or hung actor is killed below anyway
        for a in actors:
            ray.kill(a, no_restart=True)


def make_pool(tool_cfg: Any, env_cfg: Any) -> Optional[EnvActorPool]:
    """The actor pool of ``env.placement=ray``; None for ``local``."""
    if getattr(env_cfg, "placement", "local") != "ray":
        return None
    return EnvActorPool(tool_cfg, env_cfg)
