"""FleetDispatch: the state the continuous fleet source (``continuous_source.ContinuousSource``) shares between its
threads, and the dispatcher thread that works on it. The dispatcher admits queued groups as admission lets them start,
routes them to the replicas' backlogs, sends each idle replica its backlog as one ``generate`` call, verifies what
comes back and finishes the groups, and answers a failed replica (its groups revoked and issued again, a poison one
dropped: docs/fleet.md). The invariants it keeps:

* One condition (``cv``) guards the shared state, and every call to a replica is issued under it, so a weight load
  and a generation reach a replica in the order issued.
* Samples are verified outside the lock (a slow verifier does not stop admission or the publish).
* Batch ``j``'s journal (``fleet/round_<j>.jsonl``) opens when it is drawn (``add_batch``); a lost replica's groups
  are revoked in it and issued again once elsewhere.
* A failure of the dispatcher is kept in ``error`` and raised on the trainer's thread (``raise_error``).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Tuple

import ray

from reasonrl.data.batch import Batch
from reasonrl.data.sample import Sample, bind_prompts
from reasonrl.fault_points import fault_point
from reasonrl.fleet.admission import AdmissionController
from reasonrl.fleet.ledger import Ledger

from .fleet_journal import FleetRound
from .fleet_source import Draw
from .replicas import Replicas, first_line, raised_error
from .streaming import verify

POLL_S = 0.2
"""Longest the dispatcher waits on the replicas before it looks for new work to send (admission may have opened)."""


@dataclass
class TakenBatch:
    """A finished batch as ``FleetDispatch.take`` hands it to the source."""

    prompts: List[Any]
    indices: List[int]
    """The prompts' dataset positions."""
    samples: List[Sample]
    """Every group's samples, in position order."""
    round: FleetRound
    """Its bookkeeping (journal closed)."""
    load: Dict[str, int]
    """Groups sent to each replica."""
    admission: Dict[str, float]
    """Admission's metrics at the take."""


class FleetDispatch:
    """The shared state of a continuous fleet source and its dispatcher thread (the module docstring)."""

    def __init__(self, fleet: Replicas, pool, plan, reward_cfg, draw: Draw, *,
                 batch_size: int, max_staleness: int, total_steps: int) -> None:
        self.fleet = fleet
        self.pool, self.plan, self.reward_cfg, self.draw = pool, plan, reward_cfg, draw
        self.batch_size, self.total_steps = batch_size, total_steps
        self.admission = AdmissionController(batch_size=batch_size, max_staleness=max_staleness)
        self.cv = threading.Condition()
        self.drawn: Dict[int, Tuple[List[Any], List[int]]] = {}  # batch -> its prompts and dataset positions
        self.next_draw = 0
        self.queue: Deque[Tuple[int, int]] = deque()  # (batch, position) drawn, not yet admitted
        self.rounds: Dict[int, FleetRound] = {}  # batches drawn and not yet taken, with their open journals
        self.backlog: Dict[str, List[Tuple[int, int, int]]] = {}  # replica -> (batch, position, attempt) to send
        self.calls: Dict[Any, Tuple[str, str, List[Tuple[int, int, int]], Any]] = {}  # ref -> (replica, kind, ...)
        self.busy: Dict[str, List[Any]] = {}  # replica -> the refs of its generate calls in flight
        self.results: Dict[int, Dict[int, List[Sample]]] = {}
        self.batch_load: Dict[int, Dict[str, int]] = {}
        self.error: Optional[BaseException] = None
        self.closing = False
        self.thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ the source's calls
    def begin(self, step: int, restored: Dict[int, Tuple[List[Any], List[int]]]) -> None:
        """Admission at ``step``, the next draw batch ``step``, a checkpoint's untrained batches queued first."""
        self.admission.start_at(step)
        self.next_draw = step
        with self.cv:
            for j in sorted(restored):
                self.add_batch(j, *restored[j])

    def start(self) -> None:
        """The dispatcher thread on."""
        self.thread = threading.Thread(target=self._run, name="fleet-dispatcher", daemon=True)
        self.thread.start()

    def take(self, step: int) -> "TakenBatch":
        """Batch ``step``, once admission says all its groups finished; its journal closed."""
        with self.cv:
            while True:
                self.raise_error()
                groups = self.admission.take_batch(now=time.monotonic())
                if groups is not None:
                    break
                self.cv.wait(timeout=1.0)
            if sorted(groups) != [(step, k) for k in range(self.batch_size)]:
                raise RuntimeError(f"batch {step} holds groups {sorted(groups)}: admission and the draws disagree")
            prompts, indices = self.drawn.pop(step)
            by_position = self.results.pop(step)
            rnd = self.rounds.pop(step)
            rnd.ledger.close()
            samples = [s for k in range(self.batch_size) for s in by_position[k]]
            return TakenBatch(prompts, indices, samples, rnd, self.batch_load.pop(step, {}), self.admission.metrics())

    def fail(self, exc: BaseException) -> None:
        """A thread's failure, kept (the first one) for the trainer's thread to raise."""
        with self.cv:
            if self.error is None:
                self.error = exc
            self.cv.notify_all()

    def stop(self) -> None:
        """The dispatcher thread stopped (it ends within its next poll), the open journals closed."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=30)
        for rnd in self.rounds.values():
            rnd.ledger.close()

    # ------------------------------------------------------------------ drawing (under the lock)
    def add_batch(self, j: int, prompts: List[Any], indices: List[int]) -> None:
        """Batch ``j`` drawn (or restored): its journal opened afresh, its groups queued for admission."""
        path = self.fleet.ledger_dir / f"round_{j:06d}.jsonl"
        path.unlink(missing_ok=True)  # generated before a resume and never trained: generated again
        ledger = Ledger.open(path, j, [j * self.batch_size + k for k in range(len(prompts))],
                             meta={"data_indices": [int(i) for i in indices]})  # what the fault audit compares
        self.rounds[j] = FleetRound(j, len(prompts), self.plan.training_sampling["n"], self.fleet.router, ledger)
        self.drawn[j] = (prompts, indices)
        self.results[j] = {}
        self.queue.extend((j, k) for k in range(len(prompts)))
        self.next_draw = max(self.next_draw, j + 1)

    def top_up(self) -> None:
        """Draw every batch admission could accept now (up to the run's last step)."""
        while self.next_draw <= min(self.admission.version + self.admission.max_staleness, self.total_steps - 1):
            self.add_batch(self.next_draw, *self.draw())

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------------ the dispatcher
    def _run(self) -> None:
        try:
            while True:
                with self.cv:
                    if self.closing:
                        return
                    self._admit()
                    self._send()
                    refs = list(self.calls)
                    timeout = min(POLL_S, self.fleet.wait_left())
                if not refs:
                    with self.cv:
                        self.cv.wait_for(lambda: self.closing, timeout=POLL_S)
                    continue
                ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
                if not ready:
                    with self.cv:
                        for name, cause in self.fleet.verdicts(time.monotonic()):
                            self.lose_replica(name, self.fleet.actor(name), cause)
                    continue
                self._answer(ready[0])
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread, which raises it
            self.fail(exc)

    def _admit(self) -> None:
        """Admit queued groups while admission lets them start; route each to a replica's backlog, preferring the
        replicas that could start it now (``idle``)."""
        admitted: Dict[int, List[int]] = {}
        while self.queue:
            j, k = self.queue[0]
            index = self.admission.admit((j, k), now=time.monotonic())
            if index is None:
                break
            if index != j:
                raise RuntimeError(f"group {k} of batch {j} was admitted into batch {index}")
            self.queue.popleft()
            admitted.setdefault(j, []).append(k)
        idle = self.idle() if admitted else []
        for j, positions in admitted.items():
            self._route(j, positions, among=idle)

    def idle(self) -> List[str]:
        """The replicas taking work that could start a call now: fewer than ``plan.replica_calls`` in flight and
        nothing waiting in their backlog. A group admitted while another replica's only call decodes its longest
        responses goes to one of these, not half of it behind that call's tail (several replicas a GPU,
        ``async_rollout.num_rollout_workers``; with one replica this changes nothing)."""
        return [name for name in self.fleet.router.accepting()
                if len(self.busy.get(name, ())) < self.plan.replica_calls and not self.backlog.get(name)]

    def _route(self, j: int, positions: List[int], avoid: Optional[Dict[int, str]] = None,
               among: Optional[List[str]] = None) -> None:
        for name, issued in self.rounds[j].assign(positions, avoid, among).items():
            self.backlog.setdefault(name, []).extend((j, k, attempt) for k, attempt in issued)
        if self.batch_size - 1 in positions:
            fault_point("fleet.round_issued")  # test hook: the trainer stops with a whole batch issued

    def _send(self) -> None:
        """Each replica's backlog as one ``generate`` call, while it has fewer than ``plan.replica_calls`` in flight
        (more than one: the in-engine step loop takes a new call's requests between two steps of the running one)."""
        for name in list(self.backlog):
            work = self.backlog[name]
            if not work or len(self.busy.get(name, ())) >= self.plan.replica_calls:
                continue
            alone = [w for w in work if w[0] * self.batch_size + w[1] in self.fleet.failures.isolated]
            if alone:  # a group that raised goes alone; the rest waits for the next call
                work = alone[:1]
                self.backlog[name].remove(work[0])
            else:
                del self.backlog[name]
            actor = self.fleet.actor(name)
            prompts = [self.drawn[j][0][k] for j, k, _ in work]
            ids = [j * self.batch_size + k for j, k, _ in work]
            batch = Batch(meta={"prompt_ids": [p.token_ids for p in prompts], "rows": [p.row for p in prompts],
                                "groups": ids})
            ref = self.fleet.generate_call(name, batch, self.plan.training_sampling, ids)
            self.calls[ref] = (name, "generate", work, actor)
            self.busy.setdefault(name, []).append(ref)
            for j, _, _ in work:
                self.fleet.health.sent(name, time.monotonic())
                load = self.batch_load.setdefault(j, {})
                load[name] = load.get(name, 0) + 1

    def _answer(self, ref: Any) -> None:
        """A replica's call came back: a failure loses the replica; samples are verified (outside the lock), then
        their groups finish, the attempt in flight only."""
        with self.cv:
            entry = self.calls.pop(ref, None)
        if entry is None:
            return  # the replica was lost meanwhile: its calls are no longer waited for
        name, kind, work, actor = entry
        try:
            samples = ray.get(ref)
        except ray.exceptions.RayError as exc:
            cause = ("died: " if isinstance(exc, ray.exceptions.RayActorError) else "failed: ") + first_line(exc)
            with self.cv:
                if kind == "generate" and isinstance(exc, ray.exceptions.RayTaskError):  # the replica lives
                    return self._raised(name, actor, ref, work, raised_error(exc))
                return self.lose_replica(name, actor, cause, (ref, work) if kind == "generate" else None)
        if kind == "load":
            return
        by_group: Dict[int, List[Sample]] = {}
        for s in samples:
            j, k = divmod(s.group, self.batch_size)
            s.group = k
            by_group.setdefault(j * self.batch_size + k, []).append(s)
        for g, group in by_group.items():
            j, k = divmod(g, self.batch_size)
            bind_prompts(group, self.drawn[j][0])
        verify(samples, self.pool, self.reward_cfg)
        with self.cv:
            self._free(name, ref)
            for _ in work:
                self.fleet.health.answered(name, time.monotonic())
            self.fleet.failures.answered(name, [j * self.batch_size + k for j, k, _ in work])
            for j in sorted({j for j, _, _ in work}):
                issued = [(k, attempt) for jj, k, attempt in work if jj == j]
                counts = {k: len(by_group.get(j * self.batch_size + k, [])) for k, _ in issued}
                for k in self.rounds[j].answered(name, issued, counts):
                    group = by_group.get(j * self.batch_size + k, [])
                    self.results[j][k] = group
                    versions = [v for s in group for v in (s.oldest_version, s.newest_version) if v is not None]
                    self.admission.finished((j, k), ok=True, tokens=sum(len(s.response_ids) for s in group),
                                            versions=(min(versions), max(versions)) if versions else None)
            self.cv.notify_all()

    def _free(self, name: str, ref: Any) -> None:
        """``name``'s call ``ref`` is no longer in flight (its replica's other calls are)."""
        if ref in self.busy.get(name, ()):
            self.busy[name].remove(ref)

    def _raised(self, name: str, actor: Any, ref: Any, work: List[Tuple[int, int, int]], error: str) -> None:
        """``name``'s generate call of ``work`` raised ``error`` (the replica lives): as ``FleetSource._raised``."""
        if self.fleet.actor(name) is not actor:
            return
        self._free(name, ref)  # its other call in flight (``plan.replica_calls``) runs on
        for _ in work:
            self.fleet.health.answered(name, time.monotonic())
        verdict = self.fleet.failures.raised(name, [j * self.batch_size + k for j, k, _ in work], error)
        retry: Dict[int, List[Tuple[int, int]]] = {}
        for j, k, attempt in work:
            reason = verdict.poison.get(j * self.batch_size + k)
            if reason is None:
                retry.setdefault(j, []).append((k, attempt))
            else:
                self._drop(name, j, k, attempt, reason)
        self.cv.notify_all()
        if verdict.replace is not None:  # it keeps raising: no evidence against the prompts it holds
            return self.lose_replica(name, actor, verdict.replace, evidence=False)
        for j, issued in retry.items():
            positions = self.rounds[j].retry(name, issued, f"raised: {error}")
            self.fleet.reissued += len(positions)
            self._route(j, positions, self.fleet.failures.avoid)

    def _drop(self, name: str, j: int, k: int, attempt: int, reason: str) -> None:
        """Group ``k`` of batch ``j`` (``attempt``, on ``name``) is poison: answered with failed samples, finished."""
        failed = self.fleet.drop_poison(self.rounds[j], name, k, attempt, reason, self.drawn[j][0][k], self.reward_cfg)
        if failed is not None:
            self.results[j][k] = failed
            self.admission.finished((j, k), ok=True, tokens=0)

    def lose_replica(self, name: str, actor: Any, cause: str, running: Optional[Tuple[Any, List[Any]]] = None,
                     evidence: bool = True) -> None:
        """``name`` (the actor ``actor``) is lost: with ``evidence`` (it died, hung or failed a call; not when it
        keeps raising) the groups of its generate call (``running``, its ref and work, when the caller popped it;
        else of its calls in flight, the first unanswered one) are evidence for ``fleet.poison``: isolated, a poison
        one dropped; its other groups in every open batch revoked and issued again, once, on the other live replicas
        (its replacement when none lives); the restart booked; a new actor with the current weights
        (``Replicas.replace_lost``'s order). A failure of an actor already replaced changes nothing."""
        if self.fleet.actor(name) is not actor:
            return
        in_flight = [(ref, self.calls[ref][2]) for ref in self.busy.get(name, ()) if ref in self.calls]
        lost = [running] if running is not None else in_flight
        if evidence and lost:
            poison = self.fleet.lost_call(name, [ref for ref, _ in lost],
                                          [[j * self.batch_size + k for j, k, _ in work] for _, work in lost], cause)
            for _, work in lost:
                for j, k, attempt in work:
                    if j * self.batch_size + k in poison:
                        self._drop(name, j, k, attempt, poison[j * self.batch_size + k])
            self.cv.notify_all()
        for ref in [ref for ref, entry in self.calls.items() if entry[0] == name]:
            del self.calls[ref]
        self.busy.pop(name, None)
        self.backlog.pop(name, None)  # issued in the ledger: revoked below with the rest
        revoked: Dict[int, List[int]] = {}

        def revoke() -> int:
            for j, rnd in self.rounds.items():
                positions = [i - j * self.batch_size for i in rnd.ledger.replica_lost(name, cause)]
                rnd.reissued.extend(positions)
                if positions:
                    revoked[j] = positions
            return sum(len(p) for p in revoked.values())

        def reissue() -> None:
            for j, positions in revoked.items():
                self._route(j, positions)

        self.fleet.replace_lost(name, cause, revoke, reissue)
