"""FleetSource: ``trainer.mode=async``'s rollout workers as a self-healing fleet of replicas (``fleet.enabled``;
docs/fleet.md). A ``RolloutSource``, beside ``ColocatedSource`` and ``AsyncSource`` (sources.py).

Each rollout worker (rank r of the rollout group, on bundle r of its placement group) is one replica, ``replica<r>``.
A round: the step's prompts are drawn, each is written to the round's ledger (``fleet.ledger``: one journal per
round under ``<output_dir>/fleet/``) and assigned by the router (``fleet.router``, least outstanding requests,
sticky per prompt group) to one replica, which generates all its ``n`` samples; each replica gets one ``generate``
call holding its prompts. When a call answers, its prompts are completed in the ledger (only the attempt in flight
counts) and their samples kept. When a call fails (the replica's process died, or it raised) or a replica with
prompts in flight has not answered for ``fleet.watchdog_s``, the replica is replaced: its prompts are revoked in the
ledger and issued again, once, on the live replica with the least outstanding work (on the new one when no other
lives), the restart is booked against ``fleet.max_restarts`` (``fleet.health``: past it, ``RestartBudgetSpent``
naming the replica and the cause stops the run), and a new actor on the same bundle loads the current weights before
its first request. Then the round is verified (the reward pool) and returned, staleness 0 (generated on demand, with
the weights of the step it trains).

``publish(v)``: actor rank 0 gathers the weights (``gather_weights``), they go once into Ray's object store and every
replica loads them with version ``v`` (a replica that fails to is replaced, and the new one loads them); the round just
trained is marked ``trained`` in its ledger. A checkpoint holds the ledger's journals (``save``/``load``) and the
restart count, so a resumed run keeps the history and the budget spent.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ray

from reasonrl.controller.worker_group import RolloutWorkerError, wait_watched
from reasonrl.data.batch import Batch
from reasonrl.data.sample import Round, Sample, bind_prompts
from reasonrl.fault_points import arrive, fault_point, run_in_actor
from reasonrl.fleet.health import FleetHealth, HealthPolicy
from reasonrl.fleet.ledger import DONE, Ledger
from reasonrl.fleet.router import RouteRequest, Router

from .metrics import PhaseTimer
from .streaming import generate_verified, verify

LEDGER_DIR = "fleet"
"""The ledger's folder, in the run directory and in each checkpoint."""
STATE_FILE = "fleet_state.json"
"""The fleet's counters in a checkpoint (restarts, re-issued prompts)."""

Draw = Callable[[], Tuple[List[Any], List[int]]]
Issued = Tuple[int, int]
"""A prompt's position in its round and the attempt issued."""


def replica_name(rank: int) -> str:
    return f"replica{rank}"


def replica_rank(name: str) -> int:
    """The rollout worker's rank of ``replica_name(rank)``."""
    return int(name[len("replica"):])


def journal_step(path: Path) -> int:
    """The step of ``round_<step>.jsonl``."""
    return int(Path(path).stem[len("round_"):])


def drop_rounds_from(directory: Path, step: int) -> List[int]:
    """Remove the journals of rounds ``step`` and later from ``directory``; their steps."""
    dropped = sorted(journal_step(p) for p in Path(directory).glob("round_*.jsonl") if journal_step(p) >= step)
    for s in dropped:
        (Path(directory) / f"round_{s:06d}.jsonl").unlink()
    return dropped


def round_ledger(path: Path) -> Ledger:
    """The ledger of one round from its journal (its header names the round and its prompts)."""
    with open(path, "rb") as f:
        header = json.loads(f.readline())
    return Ledger.open(path, header["epoch"], header["prompts"])


def ledger_summary(directory: Path) -> Dict[str, int]:
    """Every round's prompts by state, summed over the journals in ``directory`` (the run's or a checkpoint's)."""
    totals: Dict[str, int] = {}
    for path in sorted(Path(directory).glob("round_*.jsonl")):
        ledger = round_ledger(path)
        for state, count in ledger.counts().items():
            totals[state] = totals.get(state, 0) + count
        ledger.close()
    return totals


class FleetRound:
    """One round's bookkeeping: which replica holds which prompts, re-issues counted (pure, no Ray)."""

    def __init__(self, step: int, count: int, n: int, router: Router, ledger: Ledger) -> None:
        self.step, self.count, self.n, self.router, self.ledger = step, count, n, router, ledger
        self.reissued: List[int] = []

    def prompt_id(self, k: int) -> int:
        return self.step * self.count + k

    def assign(self, positions: Sequence[int]) -> Dict[str, List[Issued]]:
        """Route each prompt position (its ``n`` samples together) to a replica taking work and issue it in the
        ledger; replica -> its (position, attempt) pairs."""
        out: Dict[str, List[Issued]] = {}
        for k in positions:
            attempt = self.ledger.state(self.prompt_id(k)).attempt + 1
            name = self.router.assign(RouteRequest(f"{self.step}:{k}:{attempt}", group=f"{self.step}:{k}", n=self.n))
            out.setdefault(name, []).append((k, self.ledger.issue(self.prompt_id(k), name)))
        return out

    def answered(self, name: str, issued: Sequence[Issued], samples: Dict[int, int]) -> List[int]:
        """``name``'s answer for ``issued`` ((position, attempt) pairs; ``samples``: position -> samples it returned):
        the positions whose attempt was the one in flight, now done (replica and sample count in the ledger's
        payload); a late or second answer changes nothing."""
        kept = []
        for k, attempt in issued:
            self.router.complete(f"{self.step}:{k}:{attempt}")
            if self.ledger.complete(self.prompt_id(k), attempt, {"replica": name, "samples": samples.get(k, 0)}):
                kept.append(k)
        return kept

    def lost(self, name: str, cause: str) -> List[int]:
        """``name`` is gone: its prompts in flight revoked (to be issued again), it leaves the router."""
        ids = self.ledger.replica_lost(name, cause)
        self.router.remove(name)
        positions = [i - self.step * self.count for i in ids]
        self.reissued.extend(positions)
        return positions


class FleetSource:
    """Rounds from a fleet of rollout replicas (see the module docstring); a ``RolloutSource``."""

    def __init__(self, workers, rollouts, pool, plan, reward_cfg, draw: Draw, fleet_cfg, run_dir: str) -> None:
        if not hasattr(rollouts, "respawn"):
            raise ValueError("fleet.enabled needs the Ray backend: its replicas are Ray actors that can be replaced")
        self.workers, self.rollouts, self.pool, self.plan, self.reward_cfg, self.draw = \
            workers, rollouts, pool, plan, reward_cfg, draw
        rollouts.call_error = RolloutWorkerError
        self.watchdog_s = fleet_cfg.watchdog_s
        self.health = FleetHealth(HealthPolicy(watchdog_s=fleet_cfg.watchdog_s,
                                               restart_budget=fleet_cfg.max_restarts))
        self.router = Router("least_outstanding", load="requests")
        for rank in range(rollouts.world_size):
            self.router.add(replica_name(rank))
            self.health.add(replica_name(rank))
        self.ledger_dir = Path(run_dir) / LEDGER_DIR
        self.weights: Any = None  # the object-store ref of the latest published weights
        self.version = 0
        self.reissued = 0
        self.trainable: Optional[Path] = None  # the journal of the round returned last, trained at the next publish
        self.stats: Dict[str, float] = {}

    # ------------------------------------------------------------------ the loop's members
    def start(self, step: int) -> None:
        """Replicas at the weights of ``step`` (they start from the base model). Journals of rounds ``step`` and later
        (left by a run stopped before a checkpoint held them, when nothing or a checkpoint without a ledger was
        restored) go: those rounds were not trained in this run's history and are drawn again."""
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        drop_rounds_from(self.ledger_dir, step)
        if step > 0:
            self.publish(step, PhaseTimer())

    def next_round(self, step: int, timer: PhaseTimer) -> Round:
        prompts, indices = self.draw()
        path = self.ledger_dir / f"round_{step:06d}.jsonl"
        path.unlink(missing_ok=True)  # a round of this step drawn before a resume was never trained: drawn again
        ledger = Ledger.open(path, step, [step * len(prompts) + k for k in range(len(prompts))],
                             meta={"data_indices": [int(i) for i in indices]})  # what the audit compares
        rnd = FleetRound(step, len(prompts), self.plan.training_sampling["n"], self.router, ledger)
        try:
            with timer("rollout"):
                samples, load = self._generate(rnd, prompts)
        finally:
            ledger.close()
        with timer("verify"):
            samples = verify(samples, self.pool, self.reward_cfg)
        self.trainable = path
        done = ledger.counts()[DONE]
        self.stats = {**self.health.metrics(), "fleet/reissued": float(self.reissued),
                      "fleet/round_reissued": float(len(rnd.reissued)),
                      "fleet/round_lost": float(len(prompts) - done),
                      "fleet/weights_version": float(min(s.weights_version for s in samples)),
                      **{f"fleet/load/{name}": float(count) for name, count in sorted(load.items())}}
        return Round(prompts, samples, indices)

    def round_metrics(self) -> Dict[str, float]:
        return self.stats

    def generate_verified(self, prompts: Sequence[Any], sampling: Dict[str, Any]) -> List[Sample]:
        """On the replicas (validation; no ledger)."""
        return generate_verified(self.rollouts, prompts, sampling, self.pool, self.reward_cfg)

    def release_devices(self, timer: PhaseTimer) -> None:
        """The replicas are on devices of their own."""

    def publish(self, version: Optional[int], timer: PhaseTimer) -> Dict[str, float]:
        """The weights of ``version`` to every replica (object store); the round just trained marked ``trained``."""
        if version is None:
            return {}  # nothing was updated: the round stays verified, not trained
        with timer("weight_sync"):
            named = wait_watched("gather_weights", [(self.workers, self.workers.submit("gather_weights"))],
                                 f"gathering the weights of version {version}")[0]
            self.weights, self.version = ray.put(named), version
            calls = {}
            for r, w in enumerate(self.rollouts.workers):
                action = arrive(f"fleet.{replica_name(r)}.load_published")  # test hook: the replica crashes here
                if action is not None:
                    w.__ray_call__.remote(run_in_actor, action)
                calls[replica_name(r)] = w.load_published.remote(self.weights, version)
            for name, ref in calls.items():
                try:
                    ray.get(ref, timeout=self.watchdog_s)
                except (ray.exceptions.RayError, TimeoutError) as exc:
                    self._replace(name, f"failed to load the weights of version {version}: {_first_line(exc)}")
        if self.trainable is not None:
            ledger = round_ledger(self.trainable)
            for index in ledger.in_state(DONE):
                ledger.trained(index)
            ledger.close()
            self.trainable = None
        return {"weight_sync/bytes": float(sum(t.numel() * t.element_size() for _, t in named))}

    def save(self, directory: str) -> None:
        """The ledger's journals and the fleet's counters."""
        target = Path(directory) / LEDGER_DIR
        shutil.copytree(self.ledger_dir, target, dirs_exist_ok=True)
        fault_point("fleet.ledger_saved")
        (Path(directory) / STATE_FILE).write_text(json.dumps({"restarts": self.health.restarts,
                                                              "reissued": self.reissued}))

    def load(self, directory: str) -> None:
        """The checkpoint's ledger replaces the run's (rounds drawn after it were not trained: they are drawn again)."""
        source = Path(directory) / LEDGER_DIR
        if source.is_dir():
            shutil.rmtree(self.ledger_dir, ignore_errors=True)
            shutil.copytree(source, self.ledger_dir)
        state_file = Path(directory) / STATE_FILE
        if state_file.exists():
            state = json.loads(state_file.read_text())
            self.health.restarts, self.reissued = state["restarts"], state["reissued"]

    def close(self) -> None:
        self.rollouts.shutdown()

    # ------------------------------------------------------------------ the fleet
    def _generate(self, rnd: FleetRound, prompts: List[Any]) -> Tuple[List[Sample], Dict[str, int]]:
        """Every prompt's samples from one replica, re-issuing what a lost replica held; (samples in prompt order,
        prompts served per replica)."""
        calls: Dict[Any, Tuple[str, List[Issued]]] = {}
        load: Dict[str, int] = {}

        def send(assignment: Dict[str, List[Issued]]) -> None:
            for name, issued in assignment.items():
                positions = [k for k, _ in issued]
                actor = self.rollouts.workers[replica_rank(name)]
                action = arrive(f"fleet.{name}.generate")  # test hook (REASONRL_FAULT_AT): the replica crashes here
                if action is not None:
                    actor.__ray_call__.remote(run_in_actor, action)  # issued before the generation, so it runs first
                batch = Batch(meta={"prompt_ids": [prompts[k].token_ids for k in positions],
                                    "rows": [prompts[k].row for k in positions], "groups": list(positions)})
                calls[actor.generate.remote(batch, self.plan.training_sampling)] = (name, issued)
                for _ in positions:
                    self.health.sent(name, time.monotonic())
                load[name] = load.get(name, 0) + len(positions)

        send(rnd.assign(range(len(prompts))))
        fault_point("fleet.round_issued")  # test hook: the trainer stops with every prompt of the round in flight
        by_prompt: Dict[int, List[Sample]] = {}
        while calls:
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=self._wait_left())
            if not ready:
                for name, cause in self.health.verdicts(time.monotonic()):
                    send(self._lose(rnd, calls, name, cause))
                continue
            name, issued = calls.pop(ready[0])
            try:
                samples = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                cause = ("died: " if isinstance(exc, ray.exceptions.RayActorError) else "failed: ") + _first_line(exc)
                send(self._lose(rnd, calls, name, cause))
                continue
            for _ in issued:
                self.health.answered(name, time.monotonic())
            counts: Dict[int, int] = {}
            for s in samples:
                counts[s.group] = counts.get(s.group, 0) + 1
            kept = set(rnd.answered(name, issued, counts))
            for s in samples:
                if s.group in kept:
                    by_prompt.setdefault(s.group, []).append(s)
        ordered = [s for k in range(len(prompts)) for s in by_prompt[k]]
        return bind_prompts(ordered, prompts), load

    def _wait_left(self) -> float:
        """Seconds until the earliest busy replica would count as hung."""
        since = [r.watched_since for r in self.health.replicas.values() if r.watched_since is not None]
        return max(0.0, min(since) + self.watchdog_s - time.monotonic()) if since else self.watchdog_s

    def _lose(self, rnd: FleetRound, calls: Dict[Any, Tuple[str, List[Issued]]], name: str,
              cause: str) -> Dict[str, List[Issued]]:
        """``name`` is lost mid-round: its prompts go, once, to the other live replicas (or its replacement when none
        lives), and it is replaced. Returns the re-issued prompts' assignment, for the caller to send."""
        for ref in [ref for ref, (owner, _) in calls.items() if owner == name]:
            del calls[ref]  # a late answer of the lost replica's calls is not waited for
        positions = rnd.lost(name, cause)
        self.reissued += len(positions)
        self._book(name, cause)  # before anything is issued again: past the budget the run stops here
        fault_point("fleet.replica_lost")  # test hook: the trainer stops with the lost prompts revoked, not reissued
        if self.router.accepting():  # the other live replicas (the lost one left the router)
            assignment = rnd.assign(positions)
            self._respawn(name)
            return assignment
        self._respawn(name)
        return rnd.assign(positions)

    def _replace(self, name: str, cause: str) -> None:
        """Between rounds (a failed weight load): ``name`` replaced, nothing in flight to issue again."""
        self._book(name, cause)
        self.router.remove(name)
        self._respawn(name)

    def _book(self, name: str, cause: str) -> None:
        """The restart of ``name`` counted (RestartBudgetSpent, naming it and the cause, when the budget is spent)."""
        self.health.restart(name, cause)
        print(f"fleet: replacing {name} ({cause}); restart {self.health.restarts} of "
              f"{self.health.policy.restart_budget}", flush=True)

    def _respawn(self, name: str) -> None:
        """A new actor for ``name`` on its bundle, started and holding the current weights before its first request;
        then it takes work again."""
        actor = self.rollouts.respawn(replica_rank(name))
        if self.weights is not None:
            ray.get(actor.load_published.remote(self.weights, self.version))
        else:  # up before it counts as a replica: its start-up is not charged to the next publish's watchdog
            ray.get(actor.__ray_ready__.remote())
        self.router.add(name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
