"""FleetSource: ``trainer.mode=async``'s rollout workers as a self-healing fleet of replicas (``fleet.enabled``;
docs/fleet.md). A ``RolloutSource``, beside ``ColocatedSource`` and ``AsyncSource`` (sources.py).

Each rollout worker (rank r of the rollout group, on bundle r of its placement group) is one replica, ``replica<r>``.
A round: the step's prompts are drawn, each is written to the round's ledger (``fleet.ledger``: one journal per round
under ``<output_dir>/fleet/``) and assigned by the router (``fleet.router``, least outstanding requests, sticky per
prompt group) to one replica, which generates all its ``n`` samples; each replica gets one ``generate`` call holding
its prompts. When a call answers, its prompts are completed in the ledger (only the attempt in flight counts) and
their samples kept. When a call raised while its replica lives (``fleet.poison``), its prompts are issued again one
per call, kept off that replica; a prompt that raised alone on 2 replicas is poison: its samples are recorded failures
naming them and the error (the round drops it in the ledger), and the replicas it made raise are not charged; a
replica that keeps raising on prompts that answer elsewhere is replaced as below. When a call fails otherwise (the
replica's process died) or a replica with prompts in flight has not answered for ``fleet.watchdog_s``, the replica is
replaced: the prompts of the call it was running are isolated (issued again alone), a prompt that a second replica
was lost with, alone in its call, is poison as above; its other prompts are revoked in the ledger and issued again,
once, on the live replica with the least outstanding work (on the new one when no other lives), the restart is
booked against ``fleet.max_restarts`` (``fleet.health``: past it, ``RestartBudgetSpent`` naming the replica and the
cause stops the run), and a new actor on the same bundle loads the current weights before its first request. Then
the round is verified (the reward pool) and returned, staleness 0 (generated on demand, with the weights of the step
it trains).

``publish(v)``: actor rank 0 gathers the weights (``gather_weights``), they go once into Ray's object store and every
replica loads them with version ``v`` (a replica that fails to is replaced, and the new one loads them); the round just
trained is marked ``trained`` in its ledger. A checkpoint holds the ledger's journals (``save``/``load``) and the
restart count, so a resumed run keeps the history and the budget spent. The replicas, their router and health, the
weights and the ledger's folder are ``replicas.Replicas``, which ``ContinuousSource`` drives too.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ray

from reasonrl.data.batch import Batch
from reasonrl.data.sample import Round, Sample, bind_prompts
from reasonrl.fault_points import fault_point
from reasonrl.fleet.ledger import Ledger

from .metrics import PhaseTimer
from .fleet_journal import FleetRound, Issued, mark_trained, untrainable_groups
from .replicas import Replicas, first_line, raised_error
from .streaming import generate_verified, verify

Draw = Callable[[], Tuple[List[Any], List[int]]]


class FleetSource:
    """Rounds from a fleet of rollout replicas (see the module docstring); a ``RolloutSource``."""

    def __init__(self, workers, rollouts, pool, plan, reward_cfg, draw: Draw, fleet_cfg, run_dir: str) -> None:
        self.fleet = Replicas(workers, rollouts, fleet_cfg, run_dir)
        self.pool, self.plan, self.reward_cfg, self.draw = pool, plan, reward_cfg, draw
        self.trainable = None  # the round returned last (journal, untrainable positions), trained at the next publish
        self.stats: Dict[str, float] = {}

    # ------------------------------------------------------------------ the loop's members
    def start(self, step: int) -> None:
        """Replicas at the weights of ``step`` (they start from the base model); journals of rounds ``step`` and
        later dropped (``Replicas.start``)."""
        self.fleet.start(step)
        if step > 0:
            self.publish(step, PhaseTimer())

    def next_round(self, step: int, timer: PhaseTimer) -> Round:
        prompts, indices = self.draw()
        path = self.fleet.ledger_dir / f"round_{step:06d}.jsonl"
        path.unlink(missing_ok=True)  # a round of this step drawn before a resume was never trained: drawn again
        ledger = Ledger.open(path, step, [step * len(prompts) + k for k in range(len(prompts))],
                             meta={"data_indices": [int(i) for i in indices]})  # what the audit compares
        rnd = FleetRound(step, len(prompts), self.plan.training_sampling["n"], self.fleet.router, ledger)
        try:
            with timer("rollout"):
                samples, load = self._generate(rnd, prompts)
        finally:
            ledger.close()
        with timer("verify"):
            verify([s for s in samples if s.result is None], self.pool, self.reward_cfg)  # poison ones failed already
        dropped = untrainable_groups(samples)
        self.trainable = (path, dropped)
        self.stats = self.fleet.round_metrics(rnd, samples, load, dropped)
        return Round(prompts, samples, indices)

    def round_metrics(self) -> Dict[str, float]:
        return self.stats

    def generate_verified(self, prompts: Sequence[Any], sampling: Dict[str, Any]) -> List[Sample]:
        """On the replicas (validation; no ledger)."""
        return generate_verified(self.fleet.rollouts, prompts, sampling, self.pool, self.reward_cfg)

    def release_devices(self, timer: PhaseTimer) -> None:
        """The replicas are on devices of their own."""

    def publish(self, version: Optional[int], timer: PhaseTimer) -> Dict[str, float]:
        """The weights of ``version`` to every replica (object store); the round just trained marked ``trained``."""
        if version is None:
            return {}  # nothing was updated: the round stays verified, not trained
        with timer("weight_sync"):
            sent = self.fleet.put_weights(version)
            calls = {}
            for name in self.fleet.names():
                if self.fleet.arm_fault(name, "load_published") == "skip":
                    continue  # a stale replica (the weight-sync check's test)
                calls[name] = self.fleet.actor(name).load_published.remote(self.fleet.weights, version)
            for name, ref in calls.items():
                try:
                    ray.get(ref, timeout=self.fleet.watchdog_s)
                except (ray.exceptions.RayError, TimeoutError) as exc:
                    self.fleet.replace(name, f"failed to load the weights of version {version}: {first_line(exc)}")
        mark_trained(self.trainable)
        self.trainable = None
        return {"weight_sync/bytes": float(sent)}

    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """Every replica against the actor (``Replicas.check_weights``; a stale one stops the run, named). Nothing
        is in flight between rounds: a replica has ``fleet.watchdog_s`` to answer, or it is replaced."""
        return self.fleet.check_weights(prompt_ids, response_ids, self.fleet.watchdog_s,
                                        lambda name, _actor, cause: self.fleet.replace(name, cause))

    def save(self, directory: str) -> None:
        """The ledger's journals and the fleet's counters."""
        self.fleet.save(directory)

    def load(self, directory: str) -> None:
        """The checkpoint's ledger replaces the run's (rounds drawn after it were not trained: they are drawn again)."""
        self.fleet.load(directory)

    def close(self) -> None:
        self.fleet.shutdown()

    # ------------------------------------------------------------------ the fleet
    def _generate(self, rnd: FleetRound, prompts: List[Any]) -> Tuple[List[Sample], Dict[str, int]]:
        """Every prompt's samples from one replica, re-issuing what a lost replica held; (samples in prompt order,
        prompts served per replica)."""
        calls: Dict[Any, Tuple[str, List[Issued]]] = {}
        load: Dict[str, int] = {}
        health = self.fleet.health

        def send(assignment: Dict[str, List[Issued]]) -> None:
            for name, held in assignment.items():
                alone = [[pair] for pair in held if rnd.prompt_id(pair[0]) in self.fleet.failures.isolated]
                rest = [pair for pair in held if rnd.prompt_id(pair[0]) not in self.fleet.failures.isolated]
                for issued in alone + ([rest] if rest else []):  # a prompt that raised goes alone
                    positions = [k for k, _ in issued]
                    batch = Batch(meta={"prompt_ids": [prompts[k].token_ids for k in positions],
                                        "rows": [prompts[k].row for k in positions], "groups": list(positions)})
                    ref = self.fleet.generate_call(name, batch, self.plan.training_sampling,
                                                   [rnd.prompt_id(k) for k in positions])
                    calls[ref] = (name, issued)
                    for _ in positions:
                        health.sent(name, time.monotonic())
                    load[name] = load.get(name, 0) + len(positions)

        send(rnd.assign(range(len(prompts))))
        fault_point("fleet.round_issued")  # test hook: the trainer stops with every prompt of the round in flight
        by_prompt: Dict[int, List[Sample]] = {}
        while calls:
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=self.fleet.wait_left())
            if not ready:
                for name, cause in self.fleet.verdicts(time.monotonic()):
                    send(self._lose(rnd, calls, name, cause, (prompts, by_prompt)))
                continue
            name, issued = calls[ready[0]]
            try:
                samples = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:  # the replica lives; its generate raised
                del calls[ready[0]]
                send(self._raised(rnd, calls, name, issued, raised_error(exc), prompts, by_prompt))
                continue
            except ray.exceptions.RayError as exc:  # the call is the lost replica's evidence (``_lose`` drops it)
                cause = ("died: " if isinstance(exc, ray.exceptions.RayActorError) else "failed: ") + first_line(exc)
                send(self._lose(rnd, calls, name, cause, (prompts, by_prompt)))
                continue
            del calls[ready[0]]
            for _ in issued:
                health.answered(name, time.monotonic())
            self.fleet.failures.answered(name, [rnd.prompt_id(k) for k, _ in issued])
            counts: Dict[int, int] = {}
            for s in samples:
                counts[s.group] = counts.get(s.group, 0) + 1
            kept = set(rnd.answered(name, issued, counts))
            for s in samples:
                if s.group in kept:
                    by_prompt.setdefault(s.group, []).append(s)
        ordered = [s for k in range(len(prompts)) for s in by_prompt[k]]
        return bind_prompts(ordered, prompts), load

    def _raised(self, rnd: FleetRound, calls: Dict[Any, Tuple[str, List[Issued]]], name: str, issued: List[Issued],
                error: str, prompts: List[Any], by_prompt: Dict[int, List[Sample]]) -> Dict[str, List[Issued]]:
        """``name``'s call of ``issued`` raised ``error`` (the replica lives): the verdict of ``fleet.poison``. Poison
        prompts are answered with failed samples (into ``by_prompt``); the others are issued again alone, off
        ``name``; or, when ``name`` keeps raising, it is replaced (``_lose``: its prompts issued again, one restart).
        Returns the assignment to send."""
        for _ in issued:
            self.fleet.health.answered(name, time.monotonic())
        verdict = self.fleet.failures.raised(name, [rnd.prompt_id(k) for k, _ in issued], error)
        self._drop_poison(rnd, name, issued, verdict.poison, prompts, by_prompt)
        if verdict.replace is not None:  # it keeps raising: its other calls are no evidence against their prompts
            return self._lose(rnd, calls, name, verdict.replace)
        retry = rnd.retry(name, [(k, a) for k, a in issued if rnd.prompt_id(k) in verdict.retry], f"raised: {error}")
        self.fleet.reissued += len(retry)
        return rnd.assign(retry, avoid=self.fleet.failures.avoid)

    def _drop_poison(self, rnd: FleetRound, name: str, issued: Sequence[Issued], poison: Dict[int, str],
                     prompts: List[Any], by_prompt: Dict[int, List[Sample]]) -> None:
        """Each of ``issued`` (on ``name``) whose prompt id ``poison`` names: answered with failed samples, into
        ``by_prompt`` (``Replicas.drop_poison``)."""
        for k, attempt in issued:
            reason = poison.get(rnd.prompt_id(k))
            failed = None if reason is None else self.fleet.drop_poison(rnd, name, k, attempt, reason, prompts[k],
                                                                        self.reward_cfg)
            if failed is not None:
                by_prompt[k] = failed

    def _lose(self, rnd: FleetRound, calls: Dict[Any, Tuple[str, List[Issued]]], name: str, cause: str,
              evidence: Optional[Tuple[List[Any], Dict[int, List[Sample]]]] = None) -> Dict[str, List[Issued]]:
        """``name`` is lost mid-round: its prompts go, once, to the other live replicas (or its replacement when none
        lives), and it is replaced (``Replicas.replace_lost``). With ``evidence`` (the round's prompts and the
        samples by position: it died or hung, ``fleet.poison``), the prompts of the call it was running are isolated
        and a poison one is answered with failed samples (into the samples by position) instead of issued again.
        Returns the re-issued prompts' assignment, for the caller to send."""
        owned = [(ref, issued) for ref, (owner, issued) in calls.items() if owner == name]
        for ref, _ in owned:
            del calls[ref]  # a late answer of the lost replica's calls is not waited for
        if evidence is not None and owned:
            prompts, by_prompt = evidence
            poison = self.fleet.lost_call(name, [ref for ref, _ in owned],
                                          [[rnd.prompt_id(k) for k, _ in issued] for _, issued in owned], cause)
            self._drop_poison(rnd, name, [pair for _, issued in owned for pair in issued], poison, prompts, by_prompt)
        positions: List[int] = []
        assignment: Dict[str, List[Issued]] = {}

        def revoke() -> int:
            positions.extend(rnd.lost(name, cause))
            return len(positions)

        self.fleet.replace_lost(name, cause, revoke, lambda: assignment.update(rnd.assign(positions)))
        return assignment
