"""The rollout sources, side by side: each implements ``rollout_source.RolloutSource`` (the members the loop calls);
what they share is plain functions (``streaming``: ``generate_verified`` among them).

The loop (``Trainer.train_step``) opens with ``source.next_round`` and ends with ``source.publish``; everything in
between is the same in both modes.

* ``ColocatedSource``: the engines live in the actor workers. A round is generated when the step asks for it; before
  the update the engines sleep (``release_devices``), after it the new weights are loaded into them in place
  (``publish``), or they wake as they were when the update was skipped (``publish(None)``).
* ``AsyncSource`` (``trainer.mode=async``, ``async_rollout.*``): rollout workers on their own devices generate
  ``plan.steps_ahead`` rounds ahead; a collector thread reads each round's sub-batches as the engines finish them and
  hands them to the verifier pool, so generation and verification overlap training. ``publish`` broadcasts the new
  weights from actor rank 0 to the rollout workers (``reasonrl.workers.weight_transfer``); the receive calls queue
  behind the generation already started, so a round started before the sync of version v is generated with older
  weights and one started after it with v (a Ray actor runs calls in the order they were issued, and every call to the
  rollout workers is issued from the controller's main thread). The engines stamp each response with the version they
  hold; ``async/staleness`` = step - that version is checked against the bound. A checkpoint holds the rounds
  generated but not yet trained on, with their versions, and the engines' random state, so a resumed run trains on
  exactly what the uninterrupted one would have.
"""
from __future__ import annotations

import pickle
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from reasonrl.controller.worker_group import GenerationError, RolloutWorkerError, wait_watched
from reasonrl.data.sample import Round, Sample
from reasonrl.fault_points import arrive, run_in_actor

from .metrics import PhaseTimer
from .rollout_source import RolloutSource
from .streaming import collect_stream, generate_and_verify, generate_verified, prompt_batch

PENDING_ROUNDS = "pending_rounds.pkl"
"""The file of an async checkpoint that holds the rounds generated ahead and the rollout engines' random state."""

Draw = Callable[[], Tuple[List[Any], List[int]]]
"""The next training prompts and their dataset positions (the trainer's sampler over its data)."""


class ColocatedSource:
    """Rounds from the engines inside the actor workers (see the module docstring); a ``RolloutSource``."""

    def __init__(self, workers, pool, plan, reward_cfg, draw: Draw) -> None:
        self.workers, self.pool, self.plan, self.reward_cfg, self.draw = workers, pool, plan, reward_cfg, draw

    def start(self, step: int) -> None:
        """The engines at the weights of ``step`` (a resumed run's workers loaded them; nothing runs ahead)."""
        if step > 0:
            self.workers.sync_weights()

    def next_round(self, step: int, timer: PhaseTimer) -> Round:
        """The next ``data.train_batch_size`` prompts, ``rollout.n`` responses each, verified (rollout + verify)."""
        prompts, indices = self.draw()
        samples = generate_and_verify(self.workers, prompts, self.plan.training_sampling, self.pool, self.reward_cfg,
                                      self.plan.stream_chunk_prompts, timer)
        return Round(prompts, samples, indices)

    def round_metrics(self) -> Dict[str, float]:
        return {}

    def generate_verified(self, prompts: Sequence[Any], sampling: Dict[str, Any]) -> List[Sample]:
        return generate_verified(self.workers, prompts, sampling, self.pool, self.reward_cfg)

    def release_devices(self, timer: PhaseTimer) -> None:
        """The engines sleep (their weights and KV cache freed where the engine can) while the actor trains."""
        with timer("sleep"):
            self.workers.sleep_engine()

    def publish(self, version: Optional[int], timer: PhaseTimer) -> Dict[str, float]:
        """The actor's new weights into the colocated engines (woken on the way); ``None``: the engines wake as they
        were."""
        if version is None:
            with timer("wake"):
                self.workers.wake_engine()
            return {}
        with timer("weight_sync"):
            sync = self.workers.sync_weights()
        return {"weight_sync/bytes": sync[0]["bytes"]}

    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """The colocated engine against the actor (``ActorRolloutRefWorker.check_weight_sync``)."""
        return self.workers.check_weight_sync(prompt_ids, response_ids)

    def save(self, directory: str) -> None:
        """Nothing is ahead of the loop: the data position is the sampler's."""

    def load(self, directory: str) -> None:
        pass

    def close(self) -> None:
        pass


class AsyncSource:
    """Rounds generated ahead by rollout workers of their own (see the module docstring); a ``RolloutSource``."""

    def __init__(self, workers, rollouts, pool, plan, reward_cfg, draw: Draw, total_steps: int) -> None:
        self.workers, self.rollouts, self.pool, self.plan, self.reward_cfg, self.draw = \
            workers, rollouts, pool, plan, reward_cfg, draw
        self.total_steps = total_steps
        rollouts.call_error = RolloutWorkerError
        self.weight_specs = workers.weight_specs()
        host, port = workers.open_weight_transfer()
        size = 1 + rollouts.world_size
        wait_watched("join_weight_transfer", [(workers, workers.submit("join_weight_transfer", size)),
                                              (rollouts, rollouts.submit("join_weight_transfer", host, port, size))],
                     "joining the weight transfer group")
        self.collector: Optional[ThreadPoolExecutor] = ThreadPoolExecutor(1, thread_name_prefix="rollout-collector")
        self.in_flight: Deque["Future[Tuple[Round, Dict[str, float]]]"] = deque()
        self.stats: Dict[str, float] = {}
        self.restored: List[Tuple[Round, Dict[str, float]]] = []
        self.restored_rng: Optional[List[Any]] = None

    def start(self, step: int) -> None:
        """Engines at the weights of ``step`` (they start from the base model), the checkpoint's rounds back in
        flight, then rounds started until ``steps_ahead`` are ahead."""
        if step > 0:
            self.publish(step, PhaseTimer())
        if self.restored_rng is not None:
            self.rollouts.load_rng_state(self.restored_rng)
        for done in self.restored:
            future: Future = Future()
            future.set_result(done)
            self.in_flight.append(future)
        self.restored = []
        while len(self.in_flight) < min(self.plan.steps_ahead, self.total_steps - step):
            self._start_round()

    def next_round(self, step: int, timer: PhaseTimer) -> Round:
        """Start the round of step ``step + steps_ahead`` (if training gets there), then take this step's."""
        if not self.in_flight or step + len(self.in_flight) < self.total_steps:
            self._start_round()
        flight = self.in_flight.popleft()
        with timer("rollout"):  # only what the actor waits for: the rest overlapped the previous update
            try:
                rnd, seconds = flight.result()
            except GenerationError as exc:
                raise RolloutWorkerError(f"{exc} (the batch for step {step + 1})") from exc
        version = min(s.weights_version for s in rnd.samples)
        staleness, bound = step - version, self.plan.steps_ahead
        if not 0 <= staleness <= bound:
            raise RuntimeError(f"step {step} would train on a batch generated with the weights of version {version}: "
                               f"staleness {staleness} outside [0, async_rollout.max_staleness={bound}]")
        self.stats = {"async/staleness": float(staleness), "async/weights_version": float(version),
                      "async/generate_s": seconds.get("rollout", 0.0),  # generation, overlapped with training
                      "async/verify_tail_s": seconds.get("verify", 0.0)}  # verification left after the last response
        return rnd

    def round_metrics(self) -> Dict[str, float]:
        return self.stats

    def _start_round(self) -> None:
        for rank, worker in enumerate(self.rollouts.workers):  # test hook (REASONRL_FAULT_AT): a worker crashes here
            action = arrive(f"rollout{rank}.generate_stream")
            if action is not None:
                worker.__ray_call__.remote(run_in_actor, action)  # issued before the generation, so it runs first
        prompts, indices = self.draw()
        streams = self.rollouts.stream("generate_stream", prompt_batch(prompts), self.plan.training_sampling,
                                       self.plan.stream_chunk_prompts)
        self.in_flight.append(self.collector.submit(self._collect, streams, prompts, indices))

    def _collect(self, streams: List[Any], prompts: List[Any], indices: List[int]) -> Tuple[Round, Dict[str, float]]:
        """Collector thread: the round's sub-batches to the verifier pool as they come; the verified round."""
        timer = PhaseTimer()
        samples = collect_stream(self.rollouts, streams, prompts, self.pool, self.reward_cfg, timer)
        return Round(prompts, samples, indices), timer.seconds

    def generate_verified(self, prompts: Sequence[Any], sampling: Dict[str, Any]) -> List[Sample]:
        """On the rollout workers' engines."""
        return generate_verified(self.rollouts, prompts, sampling, self.pool, self.reward_cfg)

    def release_devices(self, timer: PhaseTimer) -> None:
        """The rollout workers are on devices of their own: they keep generating while the actor trains."""

    def publish(self, version: Optional[int], timer: PhaseTimer) -> Dict[str, float]:
        """Actor rank 0 broadcasts the weights of ``version``; the rollout workers load them (watched as the phase
        ``weight_broadcast``). ``None``: nothing to send."""
        if version is None:
            return {}
        with timer("weight_sync"):
            sent = wait_watched("weight_broadcast",
                                [(self.workers, self.workers.submit("send_weights", self.weight_specs)),
                                 (self.rollouts, self.rollouts.submit("receive_weights", self.weight_specs, version))],
                                f"syncing the weights of version {version}")
        return {"weight_sync/bytes": sent[0]["bytes"]}

    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """Not with the plain async mode (the config refuses ``rollout.check_weight_sync`` without the fleet)."""
        raise ValueError("rollout.check_weight_sync needs fleet.enabled with trainer.mode=async")

    def save(self, directory: str) -> None:
        """The rounds ahead of the loop (waited for: they are what the next steps train on) and the engines' random
        state after them."""
        rounds = [future.result() for future in self.in_flight]
        rng = self.rollouts.rng_state()
        with open(Path(directory) / PENDING_ROUNDS, "wb") as f:
            pickle.dump({"rounds": rounds, "rng": rng}, f)

    def load(self, directory: str) -> None:
        path = Path(directory) / PENDING_ROUNDS
        if not path.exists():  # a checkpoint from before the rounds were saved: they are drawn again
            return
        with open(path, "rb") as f:
            state = pickle.load(f)
        self.restored, self.restored_rng = state["rounds"], state["rng"]

    def close(self) -> None:
        if self.collector is not None:
            self.collector.shutdown(wait=False, cancel_futures=True)
            self.collector = None
        self.rollouts.shutdown()


def make_source(plan, groups, pool, cfg, draw: Draw) -> RolloutSource:
    """The plan's source over the started ``groups`` (``backends.Groups``)."""
    if plan.is_async and cfg.fleet.continuous:
        from .continuous_source import ContinuousSource

        return ContinuousSource(groups.actor, groups.rollouts, pool, plan, cfg.reward, draw, cfg.fleet,
                                cfg.trainer.output_dir, batch_size=cfg.data.train_batch_size,
                                max_staleness=cfg.async_rollout.max_staleness, total_steps=cfg.trainer.total_steps,
                                partial=cfg.rollout.partial)
    if plan.is_async and cfg.fleet.enabled:
        from .fleet_source import FleetSource

        return FleetSource(groups.actor, groups.rollouts, pool, plan, cfg.reward, draw, cfg.fleet,
                           cfg.trainer.output_dir)
    if plan.is_async:
        return AsyncSource(groups.actor, groups.rollouts, pool, plan, cfg.reward, draw, cfg.trainer.total_steps)
    return ColocatedSource(groups.actor, pool, plan, cfg.reward, draw)
