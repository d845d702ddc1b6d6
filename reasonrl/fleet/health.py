"""Per-replica health of a rollout fleet and the run's restart budget: pure bookkeeping, the clock passed in.

A replica is to be replaced when it

- died: its process exited (the caller saw it and says ``died``);
- hung: it has requests outstanding and has answered none for ``watchdog_s``, counted from its last answer, from
  when it last went from idle to busy, or from when its engine was last seen to have run more steps
  (``progressed``: a long call that moves is not hung), whichever is latest (an idle replica is never hung);
- keeps failing: ``max_consecutive_failures`` requests in a row answered with an error (a success resets the count).

``verdicts`` lists such replicas with their cause; ``restart`` books the replacement of one under the same name (its
record starts afresh). The run may restart ``restart_budget`` replicas in all; the restart after that raises
``RestartBudgetSpent``, whose one-line message names the replica and the cause, and whose ``exit_status`` is the
run's (``EXIT_FLEET_SPENT``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

EXIT_FLEET_SPENT = 6
"""Exit status of a run stopped because a replica needed a restart and the restart budget was spent."""

DIED, HUNG, FAILING = "died", "hung", "failing"
SLOW_CALL = "raise fleet.watchdog_s if one engine step, or a call's work after its last step, can take longer"
"""Said with every hung verdict. A replica answers when a whole call ends, and one call may hold several batches (a
continuous fleet's first call holds the first k + 1), so its engine's steps (``progressed``) keep a long call from
counting as hung; what runs between two counted steps (a huge prefill, the hf engine's log-prob pass after the
decoding) must fit in the watchdog."""


class RestartBudgetSpent(RuntimeError):
    """A replica needs replacing and the run's restarts are used up (see the module docstring)."""

    exit_status = EXIT_FLEET_SPENT

    def __init__(self, replica: str, cause: str, budget: int) -> None:
        self.replica, self.cause, self.budget = replica, cause, budget
        super().__init__(f"fleet: replica {replica} must be replaced ({cause}) but the run's restart budget of "
                         f"{budget} is spent")


@dataclass(frozen=True)
class HealthPolicy:
    max_consecutive_failures: int = 3
    """Failed requests in a row after which a replica is replaced."""
    watchdog_s: float = 300.0
    """Seconds a replica with requests outstanding may go without answering (or, told through ``progressed``,
    without an engine step) before it counts as hung."""
    restart_budget: int = 2
    """Replicas the run may replace in all; one more stops the run."""

    def __post_init__(self) -> None:
        problems = []
        if self.max_consecutive_failures < 1:
            problems.append(f"max_consecutive_failures={self.max_consecutive_failures} (at least 1)")
        if not self.watchdog_s > 0:
            problems.append(f"watchdog_s={self.watchdog_s} (above 0)")
        if self.restart_budget < 0:
            problems.append(f"restart_budget={self.restart_budget} (0 or more)")
        if problems:
            raise ValueError("fleet health policy: " + "; ".join(problems))


@dataclass
class ReplicaHealth:
    outstanding: int = 0
    consecutive_failures: int = 0
    last_error: Optional[str] = None
    watched_since: Optional[float] = None
    """The later of its last answer and when it last became busy (None: idle)."""
    died: Optional[str] = None
    """What ended its process, when it did."""
    restarts: int = 0
    engine_steps: int = 0
    """Its engine's steps in all when last seen (``progressed``); a new replica's engine starts at 0."""


@dataclass
class FleetHealth:
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    replicas: Dict[str, ReplicaHealth] = field(default_factory=dict)
    restarts: int = 0
    """Replicas replaced so far in the run."""

    def add(self, name: str) -> None:
        if name in self.replicas:
            raise ValueError(f"replica {name!r} is already watched")
        self.replicas[name] = ReplicaHealth()

    def remove(self, name: str) -> None:
        self._replica(name)
        del self.replicas[name]

    def sent(self, name: str, now: float) -> None:
        """A request went to ``name``."""
        replica = self._replica(name)
        if replica.outstanding == 0:
            replica.watched_since = now
        replica.outstanding += 1

    def answered(self, name: str, now: float, error: Optional[str] = None) -> None:
        """``name`` answered one request: a result, or ``error``."""
        replica = self._replica(name)
        if replica.outstanding == 0:
            raise ValueError(f"replica {name!r} answered with no request outstanding")
        replica.outstanding -= 1
        replica.watched_since = now if replica.outstanding else None
        if error is None:
            replica.consecutive_failures = 0
        else:
            replica.consecutive_failures += 1
            replica.last_error = str(error)

    def progressed(self, name: str, engine_steps: int, now: float) -> None:
        """``name``'s engine has run ``engine_steps`` steps in all (its heartbeat). More than last seen restarts the
        watchdog of a replica with requests outstanding: its call is long, not stuck. So a replica whose engine
        stops is found hung between ``watchdog_s`` and twice that after its last step, as the caller looks each
        time the watchdog would fire."""
        replica = self._replica(name)
        if engine_steps > replica.engine_steps:
            replica.engine_steps = engine_steps
            if replica.watched_since is not None:
                replica.watched_since = now

    def died(self, name: str, cause: str) -> None:
        """``name``'s process is gone (``cause``: e.g. its exit status or signal)."""
        self._replica(name).died = str(cause)

    def verdicts(self, now: float) -> List[Tuple[str, str]]:
        """(replica, cause) of every replica to be replaced now, in the order they were added."""
        out = []
        for name, replica in self.replicas.items():
            if replica.died is not None:
                out.append((name, f"{DIED}: {replica.died}"))
            elif replica.consecutive_failures >= self.policy.max_consecutive_failures:
                out.append((name, f"{FAILING}: {replica.consecutive_failures} failed requests in a row, the last: "
                                  f"{replica.last_error}"))
            elif replica.watched_since is not None and now - replica.watched_since >= self.policy.watchdog_s:
                out.append((name, f"{HUNG}: {replica.outstanding} request(s) outstanding, no answer and no engine "
                                  f"step seen for {now - replica.watched_since:.0f} s (watchdog "
                                  f"{self.policy.watchdog_s:g} s; {SLOW_CALL})"))
        return out

    def restart(self, name: str, cause: str) -> None:
        """Book the replacement of ``name`` (its requests in flight are the caller's to issue again): its record
        starts afresh. Raises RestartBudgetSpent when the run's budget is used up."""
        replica = self._replica(name)
        if self.restarts >= self.policy.restart_budget:
            raise RestartBudgetSpent(name, cause, self.policy.restart_budget)
        self.restarts += 1
        self.replicas[name] = ReplicaHealth(restarts=replica.restarts + 1)

    def metrics(self) -> Dict[str, float]:
        out = {"fleet/replicas": float(len(self.replicas)),
               "fleet/replicas_alive": float(sum(r.died is None for r in self.replicas.values())),
               "fleet/restarts": float(self.restarts)}
        for name, replica in self.replicas.items():
            out[f"fleet/outstanding/{name}"] = float(replica.outstanding)
        return out

    def _replica(self, name: str) -> ReplicaHealth:
        if name not in self.replicas:
            raise KeyError(f"no replica {name!r} is watched (watched: {sorted(self.replicas) or 'none'})")
        return self.replicas[name]
