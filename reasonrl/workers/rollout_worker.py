"""RolloutWorker: a rollout engine on its own device, and nothing else (``trainer.mode=async``).

It generates while the actor group trains, and takes new weights from actor rank 0 through the weight transfer group
(``reasonrl.workers.weight_transfer``) into its engine host (``engine_host.py``, the same engine-side loading as the
colocated ``ActorRolloutRefWorker``). It counts the policy version its engine holds (the number of actor updates
its weights include) and stamps every generated Sample with it (``Sample.weights_version``), so the trainer can measure
staleness instead of assuming it.

With ``rollout.partial`` (a fleet replica under ``fleet.continuous``) the worker runs as a threaded Ray actor (two
calls at once, ``WorkerGroup(max_concurrency=2)``): ``stage_published`` hands it a newer weight version while
``generate`` runs, and the generation (``rollout.partial.SegmentedGenerator``) loads it between two segments
(``rollout.partial_mode=in_engine``: ``InEngineGenerator``, between two vLLM engine steps), so each response token
records the version that produced it; staging only stores the weights. In ``in_engine`` mode two generate calls
may run at once (three slots): the second adds its requests to the engine's running step loop
(``rollout.step_loop.StepLoop``) and returns when they are done, so a batch's tail no longer holds back the next.

The engine is built on, and only ever called from, one thread of its own (``engine_thread.EngineThread``): a threaded
actor runs its calls on several threads, and vLLM driven from two threads faulted on a GPU. Every method that
touches the engine, the device or the weight transfer group goes through ``self.engine_thread.call``, which also
makes the calls one at a time.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import torch

from reasonrl.config import from_dict
from reasonrl.config.worker_plan import WorkerPlan
from reasonrl.data.batch import Batch
from reasonrl.data.sample import Sample
from reasonrl.models import load_tokenizer, torch_dtype
from reasonrl.models.lora import adapter_config_for, is_adapter_param
from reasonrl.rollout.partial import InEngineGenerator, SegmentedGenerator
from reasonrl.rollout.weight_sync import iter_buckets

from . import weight_transfer
from .dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, dispatch
from .engine_host import EngineHost, make_engine
from .engine_thread import EngineThread
from .published_weights import PublishedWeights, unpack


class RolloutWorker:
    """One rollout engine on one device (a GPU, or CPU cores), driven by the async trainer."""

    def __init__(self, config: Dict[str, Any], model_path: str, rank: int, world_size: int, master_addr: str = "",
                 master_port: int = 0, num_threads: int = 0, *, plan: WorkerPlan) -> None:
        self.cfg = from_dict(config)
        self.plan = plan
        self.rank = rank
        self.device = plan.device
        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path, self.cfg.model.trust_remote_code)
        self.dtype = torch_dtype(self.cfg.model.dtype, self.device)
        self._set_device(num_threads)  # the actor's own thread too
        self.engine_thread = EngineThread(f"engine{rank}")
        engine = self.engine_thread.call(self._build_engine, num_threads)
        self.host = EngineHost(engine, self.tokenizer, self.cfg, self.device, tools=plan.tools)
        self.version = 0  # actor updates included in the engine's weights
        self.group = None
        self._staged: Optional[tuple] = None  # (weights, version) published while a generation runs
        self._staged_lock = threading.Lock()
        self.partial = self.cfg.rollout.partial
        self.joins = self.partial and self.cfg.rollout.partial_mode == "in_engine"
        """Generate calls share the engine's step loop (``InEngineGenerator`` with ``start``): a call runs on the
        caller's thread and waits for its own requests, which the loop on the engine's thread adds between steps."""
        if self.joins:
            self.host.use_generator(InEngineGenerator(engine, 0, self._latest_version, self._load_staged,
                                                      start=self.engine_thread.submit,
                                                      loaded_version=lambda: self.version))
        elif self.partial:
            self.host.use_generator(SegmentedGenerator(engine, self.tokenizer, self.cfg.rollout.partial_segment_tokens,
                                                       0, self._latest_version, self._load_staged))

    def _set_device(self, num_threads: int) -> None:
        """This thread's device, or on a CPU its torch threads (both may be per thread)."""
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each worker one visible GPU
        elif num_threads:
            torch.set_num_threads(num_threads)

    def _build_engine(self, num_threads: int):
        """On the engine's thread: its device or threads, the seed, then the engine."""
        self._set_device(num_threads)
        torch.manual_seed(self.cfg.trainer.seed + 1000 * (self.rank + 1))
        return make_engine(self.cfg, self.plan, self.model_path, self.tokenizer, self.dtype, self.device)

    def _stamped(self, samples: List[Sample]) -> List[Sample]:
        for s in samples:
            if s.token_versions is None:  # a partial rollout's Sample carries the versions of its own tokens
                s.weights_version = self.version
        return samples

    @dispatch(SPLIT_BATCH)
    def generate(self, prompts: Batch, sampling: Dict[str, Any]) -> List[Sample]:
        """Like ``ActorRolloutRefWorker.generate``; each Sample also carries ``weights_version`` (partial: the
        versions of its tokens, weights staged meanwhile loaded between segments)."""
        if self.joins:  # the samples are built here; the engine's work runs in its step loop
            return self._stamped(next(self.host.generate_chunks(prompts, sampling, 0)))
        return self.engine_thread.call(self._generate, prompts, sampling)

    def _generate(self, prompts: Batch, sampling: Dict[str, Any]) -> List[Sample]:
        if self.partial:
            self.host.generator.version = self.version
        return self._stamped(next(self.host.generate_chunks(prompts, sampling, 0)))

    def generate_stream(self, prompts: Batch, sampling: Dict[str, Any], chunk_prompts: int
                        ) -> Iterator[List[Sample]]:
        """A Ray streaming generator (``WorkerGroup.stream``): the Samples of ``generate``, a sub-batch at a time."""
        parts = self.host.generate_chunks(prompts, sampling, chunk_prompts)
        while True:
            part = next(parts, None) if self.joins else self.engine_thread.call(next, parts, None)
            if part is None:
                return
            yield self._stamped(part)

    # ------------------------------------------------------------------ weights
    @dispatch(ONE_TO_ALL)
    def join_weight_transfer(self, host: str, port: int, group_size: int) -> None:
        """Join the transfer group as rank ``1 + self.rank`` (actor rank 0 is rank 0 and hosts the store)."""
        store = weight_transfer.connect_store(host, port)
        self.group = self.engine_thread.call(weight_transfer.join_group, store, 1 + self.rank, group_size,
                                             self.device, self.cfg.async_rollout.transfer_timeout_s)

    @dispatch(ONE_TO_ALL)
    def receive_weights(self, specs: List[weight_transfer.ParamSpec], version: int) -> Dict[str, float]:
        """Take the actor's weights of ``version`` from the transfer group, bucket by bucket, into the engine (a LoRA
        adapter-only sync: the adapter's tensors, loaded as the engine's adapter once all have arrived)."""
        return self.engine_thread.call(self._receive_weights, specs, version)

    def _receive_weights(self, specs: List[weight_transfer.ParamSpec], version: int) -> Dict[str, float]:
        start = time.perf_counter()
        bucket_bytes = self.plan.bucket_bytes
        if specs and all(is_adapter_param(s.name) for s in specs):
            tensors = [t for bucket in weight_transfer.receive(self.group, specs, bucket_bytes, self.device)
                       for t in bucket]
            config = adapter_config_for(self.cfg.actor.lora, [s.name for s in specs], self.model_path)
            moved = self.host.load_adapter(tensors, config)
            self.version = version
            return {"seconds": time.perf_counter() - start, "bytes": float(moved)}
        # the sync is finished here (vLLM: the reload session closed now, not at the next generate)
        moved = self.host.load_weights(weight_transfer.receive(self.group, specs, bucket_bytes, self.device))
        self.version = version
        return {"seconds": time.perf_counter() - start, "bytes": float(moved)}

    @dispatch(ONE_TO_ALL)
    def stage_published(self, published: PublishedWeights, version: int) -> None:
        """``rollout.partial``: keep the weights of ``version`` for the generation in flight to load at its next
        segment (or the next generation, before its first); a newer staged version replaces an older one."""
        with self._staged_lock:
            if version > (self._staged[1] if self._staged else self.version):
                self._staged = (published, version)

    def _latest_version(self) -> int:
        with self._staged_lock:
            return self._staged[1] if self._staged else self.version

    def _load_staged(self, version: int) -> None:
        """The partial generator's call between segments: the staged weights (of ``version``) into the engine."""
        with self._staged_lock:
            published, staged = self._staged
            self._staged = None
        if staged != version:
            raise RuntimeError(f"staged weights of version {staged}, asked for {version}")
        self._load_named(published, version)  # on the engine's thread already: the generator's

    @dispatch(ONE_TO_ALL)
    def load_published(self, published: PublishedWeights, version: int) -> Dict[str, float]:
        """A fleet replica takes the weights of ``version`` (``ActorRolloutRefWorker.gather_weights``, read from Ray's
        object store without a copy) into its engine; a LoRA adapter-only list is loaded as the engine's adapter."""
        return self.engine_thread.call(self._load_named, published, version)

    def _load_named(self, published: PublishedWeights, version: int) -> Dict[str, float]:
        start = time.perf_counter()
        named = unpack(published)
        if named and all(is_adapter_param(name) for name, _ in named):
            config = adapter_config_for(self.cfg.actor.lora, [name for name, _ in named], self.model_path)
            moved = self.host.load_adapter(named, config)
        else:
            device = "cuda" if self.device == "cuda" else "cpu"
            moved = self.host.load_weights(iter_buckets(((n, t.to(device)) for n, t in named),
                                                        self.plan.bucket_bytes))
        self.version = version
        return {"seconds": time.perf_counter() - start, "bytes": float(moved)}

    @dispatch(ONE_TO_ALL)
    def rng_state(self) -> Dict[str, Any]:
        """The random state sampling draws from (saved with an async checkpoint, after the rounds ahead)."""
        return self.engine_thread.call(self._rng_state)

    def _rng_state(self) -> Dict[str, Any]:
        state = {"cpu": torch.get_rng_state()}
        if self.device == "cuda":
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    @dispatch(ONE_TO_ALL)
    def load_rng_state(self, states: List[Dict[str, Any]]) -> None:
        """Restore this rank's entry of ``states`` (``rng_state`` of every rank, in rank order)."""
        self.engine_thread.call(self._load_rng_state, states[self.rank])

    def _load_rng_state(self, state: Dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])
        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"])

    @dispatch(ONE_TO_ALL)
    def weights_version(self) -> int:
        return self.version

    def watch_progress(self, board: Any, every_s: float) -> None:
        """A fleet replica's heartbeat (``reasonrl.fleet.progress``): from a thread of its own, every ``every_s`` its
        engine's steps in all go to ``board`` (a Ray actor) when they changed, while a call runs or not. Called
        by the fleet once per replica, on an idle replica."""
        counter = getattr(self.host.engine, "steps", None)
        if counter is None:  # an engine that counts no steps: the watchdog goes by answers alone
            return

        def beat() -> None:
            seen = None
            while True:
                if counter.count != seen:
                    seen = counter.count
                    board.beat.remote(self.rank, seen)
                time.sleep(every_s)

        threading.Thread(target=beat, name=f"progress{self.rank}", daemon=True).start()

    @dispatch(RANK_ZERO)
    def sequence_logprobs(self, prompts: List[List[int]], responses: List[List[int]]) -> List[List[float]]:
        """The engine's log-probs of each response given its prompt (weight checks)."""
        return self.engine_thread.call(self.host.engine.sequence_logprobs, prompts, responses)

    @dispatch(ONE_TO_ALL)
    def info(self) -> Dict[str, Any]:
        engine = self.host.engine
        return {"rank": self.rank, "device": self.device, "engine": engine.name, "pid": os.getpid(),
                "threads": torch.get_num_threads(), "version": self.version}
