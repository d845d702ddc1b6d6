"""Which engine replica of a rollout fleet serves a request: pure bookkeeping, no I/O, no clock.

Two policies:

- ``least_outstanding`` (the fleet's): a request of a multi-turn trajectory whose last turn was served by a replica
  that still takes work goes to that replica (its prefix cache holds the conversation so far); else a request of a
  prompt group (the ``n`` samples of one prompt) that has a replica goes there (its prefix cache holds the prompt
  once); else the replica with the least outstanding work (tokens or requests, ``load=``), the earliest added on a
  tie. A slower replica finishes its requests later, so its outstanding work stays higher and it gets less new work.
  A key whose replica was drained or removed moves, once, to the replica chosen for it then, and stays there.
- ``round_robin`` (the comparison: what a careless router does): the replicas taking work in turn, keys ignored.

A replica is ``add``-ed, ``drain``-ed (takes no new work; its requests in flight still complete) and ``remove``-d
(its requests in flight are returned, for the caller to issue again; a result that arrives for one of them later is
not the router's any more: ``complete`` says False).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Tuple

POLICIES = ("least_outstanding", "round_robin")
LOADS = ("tokens", "requests")


class NoReplicaError(RuntimeError):
    """No replica takes work (none added, or all drained or removed)."""


@dataclass(frozen=True)
class RouteRequest:
    """One request to the fleet, as the router sees it."""

    request_id: str
    """Unique among the requests in flight."""
    group: Optional[str] = None
    """The prompt group (one prompt's ``n`` samples share it): its requests go to one replica."""
    trajectory: Optional[str] = None
    """The multi-turn trajectory: each turn goes to the replica that served the last one."""
    prompt_tokens: int = 0
    """Tokens of the prompt (or of the conversation so far)."""
    max_new_tokens: int = 0
    """Tokens the request may generate, per sample."""
    n: int = 1
    """Samples the request asks for."""

    @property
    def tokens(self) -> int:
        """The work the request adds to its replica in tokens: its prompt once and ``n`` responses at most."""
        return self.prompt_tokens + self.n * self.max_new_tokens


@dataclass
class _Replica:
    name: str
    order: int
    accepting: bool = True
    outstanding_tokens: int = 0
    outstanding_requests: int = 0
    assigned: int = 0


class Router:
    """Assigns requests to replicas under one of ``POLICIES`` (see the module docstring)."""

    def __init__(self, policy: str = "least_outstanding", load: str = "tokens") -> None:
        if policy not in POLICIES:
            raise ValueError(f"router policy {policy!r}: expected one of {POLICIES}")
        if load not in LOADS:
            raise ValueError(f"router load {load!r}: expected one of {LOADS}")
        self.policy, self.load = policy, load
        self._replicas: Dict[str, _Replica] = {}
        self._added = 0
        self._turn = 0  # round_robin: the index among the accepting replicas of the next assignment
        self._in_flight: Dict[str, Tuple[str, RouteRequest]] = {}  # request id -> (replica, request)
        self._trajectory_at: Dict[str, str] = {}
        self._group_at: Dict[str, str] = {}
        self.moved_keys = 0
        """Sticky keys (trajectories, groups) moved off a drained or removed replica."""

    # ------------------------------------------------------------------ replicas

    def add(self, name: str) -> None:
        if name in self._replicas:
            raise ValueError(f"replica {name!r} is already in the router")
        self._replicas[name] = _Replica(name, self._added)
        self._added += 1

    def drain(self, name: str) -> None:
        """``name`` takes no new work; what it has in flight completes as usual."""
        self._replica(name).accepting = False

    def remove(self, name: str) -> List[RouteRequest]:
        """Forget ``name``; its requests in flight, in the order they were assigned, for the caller to issue again."""
        self._replica(name)
        lost = [req for replica, req in self._in_flight.values() if replica == name]
        for req in lost:
            del self._in_flight[req.request_id]
        del self._replicas[name]
        return lost

    def replicas(self) -> List[str]:
        return list(self._replicas)

    def accepting(self) -> List[str]:
        return [r.name for r in self._replicas.values() if r.accepting]

    def outstanding(self, name: str) -> int:
        """The replica's outstanding work in the router's ``load`` unit."""
        replica = self._replica(name)
        return replica.outstanding_tokens if self.load == "tokens" else replica.outstanding_requests

    def assigned(self, name: str) -> int:
        """Requests ever assigned to ``name``."""
        return self._replica(name).assigned

    # ------------------------------------------------------------------ requests

    def assign(self, request: RouteRequest, avoid: Optional[str] = None,
               among: Optional[Collection[str]] = None) -> str:
        """The replica that serves ``request``; it counts as outstanding there until ``complete``. ``avoid``: a
        replica not to choose (nor stick to) when another takes work (a prompt that just raised there). ``among``:
        choose from these replicas when any of them takes work (the continuous dispatcher's idle ones), else from
        all; a request that sticks to a replica still goes there."""
        if request.request_id in self._in_flight:
            raise ValueError(f"request {request.request_id!r} is already in flight")
        open_replicas = [r for r in self._replicas.values() if r.accepting]
        if not open_replicas:
            raise NoReplicaError(f"no replica takes work (replicas: {sorted(self._replicas) or 'none'})")
        if avoid is not None and any(r.name != avoid for r in open_replicas):
            open_replicas = [r for r in open_replicas if r.name != avoid]
            for key, table in ((request.trajectory, self._trajectory_at), (request.group, self._group_at)):
                if key is not None and table.get(key) == avoid:
                    del table[key]  # the prompt moves off the replica it raised on
        narrowed = [r for r in open_replicas if among is not None and r.name in among]
        if narrowed:
            open_replicas = narrowed
        if self.policy == "round_robin":
            chosen = open_replicas[self._turn % len(open_replicas)]
            self._turn += 1
        else:
            chosen = self._sticky(request) or min(open_replicas, key=lambda r: (self._load_of(r), r.order))
            self._remember(request, chosen.name)
        chosen.assigned += 1
        chosen.outstanding_tokens += request.tokens
        chosen.outstanding_requests += 1
        self._in_flight[request.request_id] = (chosen.name, request)
        return chosen.name

    def complete(self, request_id: str) -> bool:
        """The request's answer arrived: its work leaves its replica. False when the request is not in flight (its
        replica was removed and the request handed back, or it completed already): drop such an answer."""
        entry = self._in_flight.pop(request_id, None)
        if entry is None:
            return False
        replica = self._replicas[entry[0]]
        replica.outstanding_tokens -= entry[1].tokens
        replica.outstanding_requests -= 1
        return True

    def forget(self, group: Optional[str] = None, trajectory: Optional[str] = None) -> None:
        """A group or trajectory is finished: its replica need not be remembered."""
        if group is not None:
            self._group_at.pop(group, None)
        if trajectory is not None:
            self._trajectory_at.pop(trajectory, None)

    # ------------------------------------------------------------------ internals

    def _replica(self, name: str) -> _Replica:
        if name not in self._replicas:
            raise KeyError(f"no replica {name!r} in the router (replicas: {sorted(self._replicas) or 'none'})")
        return self._replicas[name]

    def _load_of(self, replica: _Replica) -> int:
        return replica.outstanding_tokens if self.load == "tokens" else replica.outstanding_requests

    def _sticky(self, request: RouteRequest) -> Optional[_Replica]:
        """The replica the request's trajectory, else its group, was on, if that replica still takes work."""
        for key, table in ((request.trajectory, self._trajectory_at), (request.group, self._group_at)):
            if key is None or key not in table:
                continue
            replica = self._replicas.get(table[key])
            if replica is not None and replica.accepting:
                return replica
            self.moved_keys += 1
            del table[key]
        return None

    def _remember(self, request: RouteRequest, name: str) -> None:
        if request.trajectory is not None:
            self._trajectory_at[request.trajectory] = name
        if request.group is not None:
            self._group_at.setdefault(request.group, name)
