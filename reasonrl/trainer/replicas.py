"""The fleet's replicas as both fleet sources drive them (``FleetSource``, by round; ``ContinuousSource``,
continuously): each rollout worker (rank r of the rollout group, on bundle r of its placement group) is one replica,
``replica<r>``; ``Replicas`` holds them with their router (``fleet.router``, least outstanding requests, a prompt
group sticky to one replica), their health and the run's restart budget (``fleet.health``), the object-store ref of
the newest published weights, and the ledger's folder (``fleet.ledger``: one journal per round under
``<output_dir>/fleet/``, copied into each checkpoint with the fleet's counters).

A replica is replaced (``book`` then ``respawn``; with work in flight ``replace_lost``, which revokes and issues it
again around them in one order for both sources): the restart counted against ``fleet.max_restarts``
(``RestartBudgetSpent``, naming it and the cause, past it), a new actor on its bundle that loads the current weights
before its first request. The ledger on disk and ``FleetRound``, one round's pure bookkeeping over the router and the
round's ledger, are ``fleet_journal``.

A ``generate`` call that raised while its replica lives is not a lost replica: ``Replicas.failures``
(``fleet.poison``) says which of its prompts to issue again alone, which are poison (their samples recorded failures,
``poison_samples``, dropped in the ledger with the reason when the round is trained) and whether the replica is
replaced after all (it keeps raising on distinct prompts). A replica lost with a call running is replaced, and the
same record says which of that call's prompts are poison (the replicas lost with it in their calls, the last time
alone) and isolates the others (``running_call`` finds the call that ran).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ray

from reasonrl.controller.worker_group import RolloutWorkerError, wait_watched
from reasonrl.fault_points import arrive, fault_point, run_in_actor
from reasonrl.fleet.health import HUNG, FleetHealth, HealthPolicy
from reasonrl.fleet.ledger import DONE
from reasonrl.fleet.poison import FailureTracker
from reasonrl.fleet.progress import ProgressBoard
from reasonrl.fleet.router import Router
from reasonrl.fleet.weight_check import UncheckedReplicaError, compare_replicas

from .fleet_journal import (LEDGER_DIR, RESTARTS_FILE, FleetRound, append_restart, drop_rounds_from, load_fleet,
                            save_fleet)
from .streaming import poison_samples

READY_GET_S = 10.0
"""Longest ``running_call`` waits to read a call's answer that is ready (it is in the object store already)."""
BOARD_READ_S = 5.0
"""Longest ``verdicts`` waits for the progress board (a small actor that answers at once); past it, no progress."""


def beat_interval(watchdog_s: float) -> float:
    """How often a replica reports its engine's steps: a tenth of the watchdog, within 0.05-5 s."""
    return min(5.0, max(0.05, watchdog_s / 10))


def replica_name(rank: int) -> str:
    return f"replica{rank}"


def replica_rank(name: str) -> int:
    """The rollout worker's rank of ``replica_name(rank)``."""
    return int(name[len("replica"):])


class Replicas:
    """The replicas, their router and health, the published weights and the ledger's folder (module docstring)."""

    def __init__(self, workers, rollouts, fleet_cfg, run_dir: str) -> None:
        if not hasattr(rollouts, "respawn"):
            raise ValueError("fleet.enabled needs the Ray backend: its replicas are Ray actors that can be replaced")
        self.workers, self.rollouts = workers, rollouts
        rollouts.call_error = RolloutWorkerError
        self.watchdog_s = fleet_cfg.watchdog_s
        self.weight_sync_max_diff = fleet_cfg.weight_sync_max_diff
        self.health = FleetHealth(HealthPolicy(watchdog_s=fleet_cfg.watchdog_s,
                                               restart_budget=fleet_cfg.max_restarts))
        self.router = Router("least_outstanding", load="requests")
        for name in self.names():
            self.router.add(name)
            self.health.add(name)
        self.ledger_dir = Path(run_dir) / LEDGER_DIR
        self.weights: Any = None  # the object-store ref of the latest published weights
        self.version = 0
        self.reissued = 0
        self.failures = FailureTracker(self.health.policy.max_consecutive_failures)
        self.board = ray.remote(num_cpus=0)(ProgressBoard).remote()  # the replicas' heartbeats (fleet.progress)
        ray.get([self.watch(self.actor(name)) for name in self.names()])

    def watch(self, actor: Any) -> Any:
        """``actor`` starts reporting its engine's steps to the progress board; the call's ref."""
        return actor.watch_progress.remote(self.board, beat_interval(self.watchdog_s))

    def shutdown(self) -> None:
        """The replicas stopped, then the progress board (an actor of this run, not of the cluster): waited for up to
        ``BOARD_READ_S``, so that a call made after this fails for certain."""
        self.rollouts.shutdown()
        ray.wait([self.board.close.remote()], timeout=BOARD_READ_S)

    def names(self) -> List[str]:
        return [replica_name(rank) for rank in range(self.rollouts.world_size)]

    def actor(self, name: str) -> Any:
        """The Ray actor serving ``name`` now."""
        return self.rollouts.workers[replica_rank(name)]

    def start(self, step: int) -> None:
        """The ledger's folder, without journals of rounds ``step`` and later (left by a run stopped before a
        checkpoint held them: those rounds were not trained in this run's history and are drawn again); from step 0
        without the restarts journal of a run stopped before its first checkpoint."""
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        drop_rounds_from(self.ledger_dir, step)
        if step == 0:  # the run starts over (no checkpoint): so do its restarts
            (self.ledger_dir / RESTARTS_FILE).unlink(missing_ok=True)

    def put_weights(self, version: int) -> int:
        """Actor rank 0 puts its weights of ``version`` into Ray's object store once (``self.weights``: the ref the
        replicas load; ``reasonrl.workers.published_weights``: they never pass through this process); their bytes."""
        got = self.wait_gather(version, self.start_gather())
        self.hold(version, got)
        return int(got["bytes"])

    def start_gather(self) -> List[Any]:
        """``gather_weights`` sent to every actor rank, not waited for: it runs before any call sent to the actor
        after it (a Ray actor runs its calls in the order they were sent), so it reads the weights just trained."""
        return self.workers.submit("gather_weights")

    def wait_gather(self, version: int, refs: List[Any]) -> Dict[str, Any]:
        """Rank 0's answer to the gather ``refs`` of ``version`` (``ref``, ``bytes``, ``copy_s``, ``put_s``), under the
        group's watchdog."""
        return wait_watched("gather_weights", [(self.workers, refs)], f"gathering the weights of version {version}")[0]

    def hold(self, version: int, got: Dict[str, Any]) -> None:
        """The gathered weights of ``version`` become the ones a respawned replica loads."""
        self.weights, self.version = got["ref"][0], version

    def verdicts(self, now: float) -> List[Tuple[str, str]]:
        """The replicas to replace now (``FleetHealth.verdicts``), once the heartbeats are read when one would count
        as hung: a replica whose engine ran more steps since it was last seen is on a long call, not stuck, and its
        watchdog starts again (``FleetHealth.progressed``)."""
        due = self.health.verdicts(now)
        if any(cause.startswith(HUNG) for _, cause in due):
            read = self.board.read.remote()
            ready, _ = ray.wait([read], timeout=BOARD_READ_S)
            for rank, steps in (ray.get(ready[0]) if ready else {}).items():
                if replica_name(rank) in self.health.replicas:
                    self.health.progressed(replica_name(rank), steps, now)
            due = self.health.verdicts(now)
        return due

    def wait_left(self) -> float:
        """Seconds until the earliest busy replica would count as hung."""
        since = [r.watched_since for r in self.health.replicas.values() if r.watched_since is not None]
        return max(0.0, min(since) + self.watchdog_s - time.monotonic()) if since else self.watchdog_s

    def book(self, name: str, cause: str) -> None:
        """The restart of ``name`` counted (RestartBudgetSpent, naming it and the cause, when the budget is spent)."""
        self.health.restart(name, cause)
        append_restart(self.ledger_dir / RESTARTS_FILE, {"replica": name, "cause": cause,
                                                         "restart": self.health.restarts})
        print(f"fleet: replacing {name} ({cause}); restart {self.health.restarts} of "
              f"{self.health.policy.restart_budget}", flush=True)

    def respawn(self, name: str) -> None:
        """A new actor for ``name`` on its bundle, started and holding the current weights before its first request;
        then it takes work again."""
        actor = self.rollouts.respawn(replica_rank(name))
        ray.get(self.board.forget.remote(replica_rank(name)))  # the new engine counts from 0 (so does its health)
        self.watch(actor)
        if self.weights is not None:
            ray.get(actor.load_published.remote(self.weights, self.version))
        else:  # up before it counts as a replica: its start-up is not charged to the next publish's watchdog
            ray.get(actor.__ray_ready__.remote())
        self.router.add(name)

    def arm_fault(self, name: str, call: str) -> Optional[str]:
        """Test hook (``REASONRL_FAULT_AT=fleet.<name>.<call>=ACTION``) before the caller's ``call`` to replica
        ``name``: the action armed, if any. A crash or hang runs inside the replica's actor, queued before that call
        so it runs first; ``skip`` is the caller's to honour (the call is not made: a replica left stale)."""
        action = arrive(f"fleet.{name}.{call}")
        if action is not None and action != "skip":
            self.actor(name).__ray_call__.remote(run_in_actor, action)
        return action

    def generate_call(self, name: str, batch: Any, sampling: Dict[str, Any], prompt_ids: Sequence[int]) -> Any:
        """``name``'s ``generate`` call of ``batch`` (the prompts of ledger ids ``prompt_ids``), its ref. Test hooks:
        ``fleet.<name>.generate`` (``arm_fault``) and ``fleet.prompt<id>.generate`` for each prompt held (a poison
        prompt): the action ``raise`` makes the call itself raise in the replica (which lives on); ``sigkill`` and
        ``hang`` run in the replica just before the call (queued ahead of it, as ``arm_fault`` does: the replica dies
        or hangs when it reaches the call holding the prompt)."""
        self.arm_fault(name, "generate")  # test hook: the replica crashes here
        actor = self.actor(name)
        actions = [arrive(f"fleet.prompt{i}.generate") for i in list(prompt_ids)]
        for action in ("sigkill", "hang"):
            if action in actions:
                actor.__ray_call__.remote(run_in_actor, action)
        if "raise" in actions:
            return actor.__ray_call__.remote(run_in_actor, "raise")
        return actor.generate.remote(batch, sampling)

    def lost_call(self, name: str, refs: Sequence[Any], prompt_ids: Sequence[Sequence[int]],
                  cause: str) -> Dict[int, str]:
        """``name`` is lost (``cause``) with the ``generate`` calls ``refs`` in flight (in the order sent; their
        prompts' ledger ids ``prompt_ids``): the call that was running (``running_call``) is the evidence of
        ``self.failures.lost``, which isolates its prompts; the poison ones (id -> reason) are returned, for the caller
        to answer with failed samples before it revokes the rest. Call before ``replace_lost`` (which counts the new
        generation)."""
        k = running_call(refs)
        return {} if k is None else self.failures.lost(name, prompt_ids[k], cause).poison

    def drop_poison(self, rnd: FleetRound, name: str, k: int, attempt: int, reason: str, prompt: Any,
                    reward_cfg: Any) -> Optional[List[Any]]:
        """Position ``k`` of ``rnd`` (``attempt``, on ``name``) is poison (``fleet.poison``): when that attempt is the
        one in flight it is answered in the ledger and its ``n`` samples, recorded failures naming ``reason``, are
        returned (the round drops it at ``mark_trained``); None when it is not (a late verdict changes nothing)."""
        if not rnd.answered(name, [(k, attempt)], {k: rnd.n}):
            return None
        print(f"fleet: dropping prompt {rnd.prompt_id(k)} ({reason})", flush=True)
        return poison_samples(k, rnd.n, prompt, reason, self.version, reward_cfg)

    def replace_lost(self, name: str, cause: str, revoke: Callable[[], int], reissue: Callable[[], None]) -> None:
        """``name`` is lost with work in flight, replaced in this order (both fleet sources): ``revoke()`` revokes its
        prompts in flight in the ledger (returns how many), it leaves the router, the restart is booked (past the
        budget the run stops here, nothing issued again; fault point ``fleet.replica_lost`` after it), then
        ``reissue()`` issues the revoked prompts again, once: on the other live replicas before the respawn, or, when
        none lives, on the replacement after it."""
        revoked = revoke()
        if name in self.router.replicas():
            self.router.remove(name)
        self.reissued += revoked
        self.book(name, cause)
        self.failures.replaced(name)
        fault_point("fleet.replica_lost")  # test hook: the trainer stops with the lost prompts revoked, not reissued
        if self.router.accepting():  # the other live replicas (the lost one left the router)
            reissue()
            self.respawn(name)
        else:
            self.respawn(name)
            reissue()

    def replace(self, name: str, cause: str) -> None:
        """Between rounds (a failed weight load, a failed weight-sync check): ``name`` replaced, nothing in flight to
        issue again."""
        self.book(name, cause)
        self.failures.replaced(name)
        self.router.remove(name)
        self.respawn(name)

    def check_weights(self, prompt_ids: List[int], response_ids: List[int], patience_s: float,
                      lose: Callable[[str, Any, str], None]) -> Dict[str, float]:
        """The weight-sync check (``fleet.weight_check``): every live replica scores ``response_ids`` after
        ``prompt_ids`` with the weights it holds, against the actor's log-probs; ``StaleReplicaError`` names a
        replica not at ``self.version`` or off by more than ``fleet.weight_sync_max_diff``. A replica that has not
        answered within ``patience_s`` (the caller's: what it may have queued ahead of the check), or raised, is
        lost (``lose(name, actor, cause)``: the caller replaces it, with any work it had in flight) and its
        replacement, which loaded the current weights before taking work, is checked in its place, once
        (``UncheckedReplicaError`` if it fails too). A replica that died meanwhile is not checked: its next call
        fails and its replacement loads the current weights before any request."""
        actor_lp = self.workers.actor_sequence_logprobs(prompt_ids, response_ids)

        def ask(name: str) -> Tuple[Any, List[Any]]:
            self.arm_fault(name, "check_weights")  # test hook: a replica hangs or crashes before its check
            actor = self.actor(name)
            return actor, [actor.weights_version.remote(),
                           actor.sequence_logprobs.remote([list(prompt_ids)], [list(response_ids)])]

        calls = {name: ask(name) for name in self.names()}
        answers: Dict[str, Tuple[int, List[float]]] = {}
        for replaced in (False, True):
            deadline = time.monotonic() + patience_s
            retry = {}
            for name, (actor, refs) in calls.items():
                try:
                    version, lps = ray.get(refs, timeout=max(0.0, deadline - time.monotonic()))
                    answers[name] = (version, lps[0])
                except ray.exceptions.RayActorError:
                    continue
                except (ray.exceptions.GetTimeoutError, ray.exceptions.RayTaskError) as exc:
                    cause = (f"hung past {patience_s:g} s" if isinstance(exc, ray.exceptions.GetTimeoutError)
                             else f"failed ({first_line(exc)})")
                    if replaced:
                        raise UncheckedReplicaError(name, f"{cause} in the weight-sync check") from exc
                    lose(name, actor, f"{cause} in the weight-sync check")
                    retry[name] = ask(name)
            calls = retry
        return compare_replicas(actor_lp, answers, self.version, self.weight_sync_max_diff)[1]

    def metrics(self) -> Dict[str, float]:
        return {**self.health.metrics(), "fleet/reissued": float(self.reissued)}

    def round_metrics(self, rnd: "FleetRound", samples: Sequence[Any], load: Dict[str, int],
                      dropped: Dict[int, str]) -> Dict[str, float]:
        """The fleet's metrics of one round returned to the loop (its ledger complete): these, the round's re-issued,
        lost and dropped (``dropped``: its ``untrainable_groups``) prompts, the oldest weight version of its samples,
        the prompts each replica served."""
        return {**self.metrics(), "fleet/round_reissued": float(len(rnd.reissued)),
                "fleet/round_dropped": float(len(dropped)),
                "fleet/round_lost": float(rnd.count - rnd.ledger.counts()[DONE]),
                "fleet/weights_version": float(min(s.weights_version for s in samples)),
                **{f"fleet/load/{name}": float(count) for name, count in sorted(load.items())}}

    def save(self, directory: str) -> None:
        """The ledger's journals and the fleet's counters (``save_fleet``)."""
        save_fleet(self.ledger_dir, directory, self.health.restarts, self.reissued)

    def load(self, directory: str) -> None:
        """The checkpoint's ledger and counters, the run's restarts (``load_fleet``)."""
        counters = load_fleet(self.ledger_dir, directory)
        if counters is not None:
            self.health.restarts, self.reissued = counters


def running_call(refs: Sequence[Any]) -> Optional[int]:
    """Of a lost replica's calls in flight (``refs``, in the order sent: an actor runs them in that order), the index
    of the one that was running: the first that has not answered (a call that answered before the loss was not
    waited for yet). None when every call answered."""
    for k, ref in enumerate(refs):
        if ray.wait([ref], timeout=0)[0]:
            try:
                ray.get(ref, timeout=READY_GET_S)
                continue  # it answered before the replica was lost
            except Exception:  # noqa: BLE001 - any failure: the replica failed on this call
                return k
        return k  # not answered: running (a hang) or the first not run
    return None


def raised_error(exc: BaseException) -> str:
    """The first line of what a replica's method raised (``RayTaskError``'s cause), else of ``exc``."""
    cause = getattr(exc, "cause", None)
    return first_line(cause if isinstance(cause, BaseException) else exc)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
