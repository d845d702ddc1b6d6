"""ContinuousSource: the fleet generating all the time (``fleet.continuous``), a ``RolloutSource`` beside
``FleetSource`` on the same replicas, router, health, replacement, ledger and published weights
(``replicas.Replicas``). What admission, partial rollouts and the checkpoint mean for a run is in docs/async.md
("Continuous generation", "Partial rollouts"); the ledger and the answer to a failed replica in docs/fleet.md. The
state shared with the dispatcher thread, and that thread, are ``continuous_dispatch.FleetDispatch`` (held as
``dispatch``, not inherited: the sources stand side by side); here are the trainer's side and the publish. The
invariants they keep:

* One thread at a time draws from the sampler: the trainer's in ``start``, then each publish's thread (``_publish``
  draws every batch admission could accept at the new version, batch ``j`` being the ``j``-th draw), which is joined
  before the next publish and before a checkpoint, so a checkpoint's data position is exact.
* ``publish(v)`` tells admission of ``v`` only after each replica's ``load_published`` is queued behind the
  generation it runs (a call issued later generates with ``v``) or, with ``rollout.partial``, its
  ``stage_published`` has returned (the generation in flight loads ``v`` at its next segment), so a group admitted
  at ``v`` is generated with weights of ``v`` or newer.
* ``publish(v)`` sends the gather from the trainer's thread, so the actor runs it before the next step's calls and
  reads the weights just trained; a publisher thread waits for it and does the rest, so the gather overlaps the wait
  for the next batch instead of adding to it. Whatever reads the replicas' weights (validation, the weight-sync
  check, a checkpoint, the next publish) waits for the publish in flight first (``_published``).
* ``save`` keeps the batches drawn and not yet trained (``PENDING_BATCHES``); ``load`` queues them first again.
"""
from __future__ import annotations

import pickle
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import ray

from reasonrl.data.sample import Round, Sample

from .continuous_dispatch import FleetDispatch
from .fleet_journal import mark_trained, untrainable_groups
from .fleet_source import Draw
from .metrics import PhaseTimer
from .replicas import Replicas, first_line
from .streaming import generate_verified

PENDING_BATCHES = "continuous_pending.pkl"
"""The checkpoint file of the batches drawn and not yet trained."""


class ContinuousSource:
    """Batches generated continuously by the fleet, paced by admission (the module docstring)."""

    def __init__(self, workers, rollouts, pool, plan, reward_cfg, draw: Draw, fleet_cfg, run_dir: str, *,
                 batch_size: int, max_staleness: int, total_steps: int, partial: bool) -> None:
        self.fleet = Replicas(workers, rollouts, fleet_cfg, run_dir)
        self.partial = partial
        self.dispatch = FleetDispatch(self.fleet, pool, plan, reward_cfg, draw, batch_size=batch_size,
                                      max_staleness=max_staleness, total_steps=total_steps)
        self.trainable = None  # the batch returned last (journal, untrainable positions), trained at the next publish
        self.stats: Dict[str, float] = {}
        self.restored: Dict[int, Tuple[List[Any], List[int]]] = {}
        self.publishing: Optional[threading.Thread] = None  # the publisher thread of the publish in flight
        self.publish_stats: Dict[str, float] = {}  # the last finished publish's ``weight_sync/*`` metrics

    # ------------------------------------------------------------------ the loop's members
    def start(self, step: int) -> None:
        """Replicas at the weights of ``step``, a checkpoint's untrained batches queued first, the dispatcher on."""
        self.fleet.start(step)  # journals a stopped run left past its checkpoint are dropped
        self.dispatch.begin(step, self.restored)
        self.restored = {}
        if step > 0:
            self.publish(step, PhaseTimer())
            self._published()  # the replicas hold the resumed weights before the dispatcher sends them work
        else:
            with self.dispatch.cv:
                self.dispatch.top_up()
        self.dispatch.start()

    def next_round(self, step: int, timer: PhaseTimer) -> Round:
        """Batch ``step`` once all its groups finished (waited for under ``rollout``; verified as they came)."""
        with timer("rollout"):
            taken = self.dispatch.take(step)
        dropped = untrainable_groups(taken.samples)
        self.trainable = (taken.round.ledger.path, dropped)
        with self.dispatch.cv:  # the fleet's counters, which the dispatcher moves
            fleet = self.fleet.round_metrics(taken.round, taken.samples, taken.load, dropped)
        self.stats = {**fleet, **taken.admission, "async/staleness": float(step - fleet["fleet/weights_version"])}
        return Round(taken.prompts, taken.samples, taken.indices)

    def round_metrics(self) -> Dict[str, float]:
        return self.stats

    def generate_verified(self, prompts: Sequence[Any], sampling: Dict[str, Any]) -> List[Sample]:
        """On the replicas (validation; no ledger), beside the generation in flight, once they hold the weights
        published last."""
        self._published()
        return generate_verified(self.fleet.rollouts, prompts, sampling, self.dispatch.pool, self.dispatch.reward_cfg)

    def release_devices(self, timer: PhaseTimer) -> None:
        """The replicas keep generating while the actor trains."""

    def publish(self, version: Optional[int], timer: PhaseTimer) -> Dict[str, float]:
        """The weights of ``version`` on their way (the module docstring): the gather is sent to the actor here, so
        it runs before the next step's calls; the publisher thread waits for it, then sends the weights to every
        replica and tells admission, while the trainer goes on to its next batch. The batch just trained is marked
        ``trained`` in its journal. Returns the metrics of the last publish that finished (``weight_sync/*``)."""
        if version is None:
            return {}
        with timer("weight_sync"):
            self._published()
            started = time.monotonic()  # before the sending: the actor's copy and put fall inside gather_s
            refs = self.fleet.start_gather()
            self.publishing = threading.Thread(target=self._publish, args=(version, refs, started),
                                               name="fleet-publish", daemon=True)
            self.publishing.start()
        mark_trained(self.trainable)
        self.trainable = None
        return dict(self.publish_stats)

    def _published(self) -> None:
        """The publish in flight, if any, finished; its failure, or the dispatcher's, raised here."""
        if self.publishing is not None:
            self.publishing.join()
            self.publishing = None
        with self.dispatch.cv:
            self.dispatch.raise_error()

    def _publish(self, version: int, refs: List[Any], started: float) -> None:
        """The publisher thread: the gather waited for, then under the lock (a replica respawned meanwhile must not
        hold ``version`` before admission) the weights to every replica and to admission, which may start the next
        batches' groups."""
        dispatch = self.dispatch
        try:
            got = self.fleet.wait_gather(version, refs)
            gathered = time.monotonic()
            with dispatch.cv:
                dispatch.raise_error()
                self.fleet.hold(version, got)
                ref = self.fleet.weights
                staged = {}
                for name in self.fleet.names():
                    if self.fleet.arm_fault(name, "load_published") == "skip":
                        continue  # a stale replica (the weight-sync check's test)
                    actor = self.fleet.actor(name)
                    if self.partial:
                        staged[name] = (actor, actor.stage_published.remote(ref, version))
                    else:  # queued behind the generation the replica runs; checked by the dispatcher
                        dispatch.calls[actor.load_published.remote(ref, version)] = (name, "load", [], actor)
                for name, (actor, call) in staged.items():
                    try:
                        ray.get(call, timeout=self.fleet.watchdog_s)
                    except (ray.exceptions.RayError, TimeoutError) as exc:
                        dispatch.lose_replica(name, actor, f"failed to stage the weights of version {version}: "
                                                           f"{first_line(exc)}")
                dispatch.admission.publish(version)
                dispatch.top_up()
                self.publish_stats = {"weight_sync/bytes": float(got["bytes"]),
                                      "weight_sync/gather_s": gathered - started,
                                      "weight_sync/copy_s": float(got["copy_s"]),
                                      "weight_sync/put_s": float(got["put_s"]),
                                      "weight_sync/publish_s": time.monotonic() - started}
                dispatch.cv.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread, which raises it
            dispatch.fail(exc)

    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """Every replica against the actor (``Replicas.check_weights``; a stale one stops the run, named). The
        check queues behind the generation a replica runs, which the watchdog bounds: a replica has twice
        ``fleet.watchdog_s`` to answer, or it is lost as the dispatcher loses one (its groups issued again)."""
        def lose(name: str, actor: Any, cause: str) -> None:
            with self.dispatch.cv:
                self.dispatch.lose_replica(name, actor, cause)

        self._published()
        return self.fleet.check_weights(prompt_ids, response_ids, 2 * self.fleet.watchdog_s, lose)

    def save(self, directory: str) -> None:
        """The batches drawn and not trained, and (``Replicas.save``) the ledger and the fleet's counters (after the
        publish in flight)."""
        self._published()
        with self.dispatch.cv:
            drawn = self.dispatch.drawn
            with open(f"{directory}/{PENDING_BATCHES}", "wb") as f:
                pickle.dump({j: drawn[j] for j in sorted(drawn)}, f)
            self.fleet.save(directory)

    def load(self, directory: str) -> None:
        self.fleet.load(directory)
        try:
            with open(f"{directory}/{PENDING_BATCHES}", "rb") as f:
                self.restored = pickle.load(f)
        except FileNotFoundError:
            self.restored = {}  # a checkpoint of a run that was not continuous: its batches are drawn again

    def close(self) -> None:
        if self.publishing is not None:  # bounded by the gather's watchdog and the staging timeout
            self.publishing.join()
        self.dispatch.stop()
        self.fleet.shutdown()
