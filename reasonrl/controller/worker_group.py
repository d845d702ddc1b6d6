"""WorkerGroup: one Ray actor per data-parallel rank, called as if it were one local object.

``group.update_actor(batch)`` looks up the method's dispatch mode (``reasonrl.workers.dispatch``), splits the batch
by rank (or by rollout engine: a tensor-parallel group of ``engine_ranks`` ranks shares one), calls every rank, and
gathers the results. This is the only place that splits and gathers. Where the ranks run (one placement-group bundle
each, over as many nodes as needed) and where they meet for torch's rendezvous is ``placement``'s job.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import ray
from ray.util.placement_group import remove_placement_group

from reasonrl.data.batch import Batch
from reasonrl.fault_points import arrive, fault_point, hang_here
from reasonrl.workers.dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, SPLIT_BY_ENGINE, SPLIT_METRICS
from reasonrl.workers.stacks import collect_stack_dump, install_stack_dump, scratch_stack_dir

from .mps import refused_hint
from .placement import on_bundle, rendezvous_address, reserve_bundles


def mean_metrics(dicts: List[Dict[str, float]]) -> Dict[str, float]:
    keys = sorted({k for d in dicts for k in d})
    return {k: sum(d[k] for d in dicts if k in d) / sum(1 for d in dicts if k in d) for k in keys}


def check_engine_ranks(world_size: int, engine_ranks: int) -> None:
    """Every rollout engine spans ``engine_ranks`` consecutive ranks (``rollout.tensor_parallel_size``), so it must
    divide the workers."""
    if engine_ranks < 1 or world_size % engine_ranks:
        raise ValueError(f"rollout.tensor_parallel_size={engine_ranks} must be >= 1 and divide the "
                         f"trainer.num_workers={world_size} workers")


def start_waves(world_size: int, bundles: int) -> List[List[int]]:
    """The ranks ``WorkerGroup`` starts together, wave by wave, when ``world_size`` ranks share ``bundles``
    placement-group bundles (rank r on bundle r mod ``bundles``): wave i holds ranks i*bundles ..
    min((i+1)*bundles, world_size)-1, so no two ranks of one wave share a bundle. Ranks that share a bundle (several
    rollout replicas a GPU) must not start at once: vLLM sizes its KV cache from the whole device's used memory while
    it profiles (``vllm.utils.mem_utils``), so two engines profiling one GPU at once would each count the other's
    allocations as their own. The constructor waits for each wave to be up (its actors' constructors done) before
    starting the next, only when there is more than one wave; a single wave (one rank a bundle) is not waited on."""
    return [list(range(first, min(first + bundles, world_size))) for first in range(0, world_size, bundles)]


class WorkerGroup:
    """``world_size`` copies of ``worker_cls`` in one placement group (one bundle per rank)."""

    def __init__(self, worker_cls: type, world_size: int, use_gpu: bool, cpus_per_worker: int,
                 init_kwargs: Dict[str, Any], gpu_fraction: float = 1.0, engine_ranks: int = 1,
                 bundle_room: Optional[Dict[str, float]] = None, on_bundles_of: Optional["WorkerGroup"] = None,
                 max_concurrency: int = 1, worker_env: Optional[Dict[str, str]] = None) -> None:
        """``gpu_fraction`` < 1 lets another group (the PPO critic) share each rank's GPU. ``engine_ranks``: ranks
        that share one rollout engine (``rollout.tensor_parallel_size``); ranks r*T .. r*T+T-1 form engine r.
        ``bundle_room``: each bundle reserved larger than this group's rank asks for (room for a group placed on it
        later); ``on_bundles_of``: reserve nothing, rank r goes on bundle r mod its world size of that group's
        placement group (its ``bundle_room`` holds them all; ``async_rollout.share_devices``: replica r on actor rank
        r mod ranks' GPU, several replicas a GPU when there are more replicas than ranks). Ranks that share a bundle
        start one wave at a time, each wave up (its engines started) before the next (``start_waves`` says why).
        ``max_concurrency`` > 1: threaded actors running that many calls at once (partial rollouts' replicas take
        weights while generating); their calls need not run in the order issued. ``worker_env``: variables set in
        each worker's process (over the job's; e.g. the allocator of a shared GPU), whoever started Ray.

        Fails at once (before any placement) when ``engine_ranks`` does not divide ``world_size`` or when the
        cluster cannot hold ``world_size`` bundles. The torch rendezvous is on bundle 0's node, at a port free there.
        """
        check_engine_ranks(world_size, engine_ranks)
        self.worker_cls = worker_cls
        self.world_size = world_size
        self.engine_ranks = engine_ranks
        gpus = gpu_fraction if use_gpu else 0
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus} if use_gpu else {})}
        self.owns_group = on_bundles_of is None
        bundles = world_size
        if on_bundles_of is not None:
            bundles = on_bundles_of.world_size
            if world_size % bundles:
                raise ValueError(f"{world_size} {worker_cls.__name__} ranks cannot share the {bundles} bundles of "
                                 f"{on_bundles_of.worker_cls.__name__} evenly")
            self.placement_group = on_bundles_of.placement_group
        else:
            self.placement_group = reserve_bundles(world_size, {**bundle, **(bundle_room or {})})
        master_addr, master_port = rendezvous_address(self.placement_group)
        remote_cls = ray.remote(worker_cls)
        env = {"OMP_NUM_THREADS": str(cpus_per_worker), **(worker_env or {})}
        self._spawn = lambda r: remote_cls.options(
            num_cpus=cpus_per_worker, num_gpus=gpus, scheduling_strategy=on_bundle(self.placement_group, r % bundles),
            runtime_env={"env_vars": env}, max_concurrency=max_concurrency,
        ).remote(**init_kwargs, rank=r, world_size=world_size, master_addr=master_addr, master_port=master_port,
                 num_threads=cpus_per_worker)
        self.workers: List[Any] = []
        waves = start_waves(world_size, bundles)  # ranks sharing a bundle: one wave at a time
        for ranks in waves:
            wave = [self._spawn(r) for r in ranks]
            if len(waves) > 1:
                for rank, ready in [(r, w.__ray_ready__.remote()) for r, w in zip(ranks, wave)]:
                    try:
                        ray.get(ready)
                    except ray.exceptions.RayError as exc:
                        raise WorkerCallError(failure_message(worker_cls.__name__, rank, "starting", str(exc))) from exc
            self.workers += wave
        self.watchdog: Optional[Any] = None  # set by enable_watchdog
        self.call_error: type = WorkerCallError  # what a failed call raises (wait_watched)
        self.stack_files: List[Path] = []  # each worker's open dump file (scratch, outside the run directory)
        self.stack_dir: Optional[Path] = None  # where a dump asked for is kept: the run's stacks/
        self.pids: List[int] = []

    def enable_watchdog(self, watchdog: Any, stack_dir: str) -> None:
        """Time every later call with ``watchdog`` (``limit_s``/``record``/``hung``; see
        reasonrl.trainer.watchdog) and let each worker dump its stacks on request, kept in
        ``<stack_dir>/<class>_rank<r>.txt`` (made only then: the open dump files are scratch files elsewhere)."""
        name = self.worker_cls.__name__
        scratch = scratch_stack_dir()
        self.stack_dir = Path(stack_dir)
        self.stack_files = [scratch / f"{name}_rank{r}.txt" for r in range(self.world_size)]
        self.pids = ray.get([w.__ray_call__.remote(install_stack_dump, str(f))
                             for w, f in zip(self.workers, self.stack_files)])
        self.watchdog = watchdog

    def __getattr__(self, name: str) -> Callable:
        method = getattr(self.worker_cls, name, None)
        mode = getattr(method, "dispatch_mode", None)
        if mode is None:
            raise AttributeError(f"{self.worker_cls.__name__}.{name} is not a dispatchable worker method")
        return lambda *args, **kwargs: self._call(name, mode, *args, **kwargs)

    def _arm_hangs(self, name: str) -> None:
        """Test hook (``REASONRL_FAULT_AT=worker<rank>.<method>=hang``): the armed ranks block in ``method``."""
        for rank, w in enumerate(self.workers):
            if arrive(f"worker{rank}.{name}") == "hang":
                w.__ray_call__.remote(hang_here)  # queued before the method: the worker blocks in it

    def _call(self, name: str, mode: str, *args: Any, **kwargs: Any) -> Any:
        self._arm_hangs(name)
        if mode == SPLIT_BY_ENGINE:
            batch, rest = args[0], args[1:]
            parts = batch.chunk(self.world_size // self.engine_ranks)
            refs = [getattr(w, name).remote(parts[r // self.engine_ranks], *rest, **kwargs)
                    for r, w in enumerate(self.workers)]
            results = self._wait(name, refs)  # fault points and the watchdog, as for every call
            return concat_parts(results[::self.engine_ranks])
        if mode in (SPLIT_BATCH, SPLIT_METRICS):
            batch, rest = args[0], args[1:]
            parts = batch.chunk(self.world_size)
            refs = [getattr(w, name).remote(p, *rest, **kwargs) for w, p in zip(self.workers, parts)]
            results = self._wait(name, refs)
            return concat_parts(results) if mode == SPLIT_BATCH else mean_metrics(results)
        refs = [getattr(w, name).remote(*args, **kwargs) for w in self.workers]
        results = self._wait(name, refs)
        if mode == RANK_ZERO:
            return results[0]
        if mode == ONE_TO_ALL:
            return results
        raise ValueError(f"unknown dispatch mode {mode!r}")

    def _wait(self, name: str, refs: List[Any]) -> List[Any]:
        """The results of one call on every rank; with a watchdog, a call past its limit is reported as hung."""
        fault_point(f"group.{name}")
        return wait_watched(name, [(self, refs)])

    def dump_stacks(self, ranks: List[int]) -> Dict[int, str]:
        """Ask the workers of ``ranks`` (on this host) for their Python stacks; rank -> text."""
        out: Dict[int, str] = {}
        for rank in ranks:
            path = self.stack_files[rank]
            try:
                out[rank] = collect_stack_dump(self.pids[rank], path, self.stack_dir / path.name)
            except (OSError, IndexError) as exc:
                out[rank] = f"(no stack dump: {exc})"
        return out

    def stream(self, name: str, batch: Batch, *args: Any) -> List[Any]:
        """Start the generator method ``name`` on every rank with its engine's share of ``batch`` (split as
        SPLIT_BY_ENGINE: the ranks of one tensor-parallel engine make identical calls), as Ray streaming calls: one
        ``ObjectRefGenerator`` per rank, in rank order, each yielding refs to Batches. Only each engine's first
        rank's rows are the engine's output (``stream_heads``); the other ranks' streams must still be drained."""
        self._arm_hangs(name)
        fault_point(f"group.{name}")
        parts = batch.chunk(self.world_size // self.engine_ranks)
        return [getattr(w, name).options(num_returns="streaming").remote(parts[r // self.engine_ranks], *args)
                for r, w in enumerate(self.workers)]

    @property
    def engines(self) -> int:
        """Rollout engines of the group (ranks / ``engine_ranks``)."""
        return self.world_size // self.engine_ranks

    def iter_stream(self, streams: List[Any]) -> Iterator[Tuple[int, Batch]]:
        """(engine, sub-batch) as each engine's stream yields them, in arrival order; GenerationError naming the rank
        when a worker fails. With tensor-parallel engines only each engine's first rank's sub-batches are rows; the
        other ranks' streams (the same rows again) are drained."""
        heads = {stream: e for e, stream in enumerate(streams[::self.engine_ranks])}
        active = {stream: rank for rank, stream in enumerate(streams)}
        name = self.worker_cls.__name__
        while active:
            ready, _ = ray.wait(list(active), num_returns=1)
            stream = ready[0]
            try:
                part = ray.get(next(stream))
            except StopIteration:
                del active[stream]
                continue
            except ray.exceptions.RayError as exc:
                raise GenerationError(f"{name} rank {active[stream]} failed while generating: {exc}") from exc
            if stream in heads:
                yield heads[stream], part

    def submit(self, name: str, *args: Any, **kwargs: Any) -> List[Any]:
        """Start ``name`` (same arguments to every rank) without waiting: the ranks' ObjectRefs, in rank order. The
        fault points and hang hooks of ``name`` apply as for a dispatched call; wait with ``wait_watched``."""
        self._arm_hangs(name)
        fault_point(f"group.{name}")
        return [getattr(w, name).remote(*args, **kwargs) for w in self.workers]

    def respawn(self, rank: int) -> Any:
        """Replace the worker of ``rank`` (dead, hung or failing) by a new actor on its bundle, built as the first was;
        the old one is killed first (a no-op when its process is gone), so the bundle's resources are free. Returns
        the new actor (``workers[rank]`` from now on); calls to it queue until it is up."""
        ray.kill(self.workers[rank], no_restart=True)
        self.workers[rank] = self._spawn(rank)
        return self.workers[rank]

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)
        if self.stack_files:  # the scratch dump files (a dump asked for was kept in the run's stacks/)
            shutil.rmtree(self.stack_files[0].parent, ignore_errors=True)
        if self.owns_group:  # a group placed on another's bundles leaves them to their owner
            remove_placement_group(self.placement_group)


class GenerationError(RuntimeError):
    """A worker of the generating group failed (raised, or its process died) while generating."""


def concat_parts(parts: List[Any]) -> Any:
    """The ranks' (or engines') results one after another: Batches concatenated, lists of records (the engines'
    Samples, which carry their own group ids) joined."""
    if parts and isinstance(parts[0], Batch):
        return Batch.concat(parts)
    return [record for part in parts for record in part]


PEER_GONE = ("Connection closed by peer", "remote worker crashing", "Connection reset by peer")
"""Phrases of gloo/NCCL errors that mean the other end of a collective went away (a worker of another group)."""


class WorkerCallError(RuntimeError):
    """A worker failed (raised, or its process died) during a call; the message names the class, the rank and what
    it was doing."""


class RolloutWorkerError(WorkerCallError):
    """A rollout worker of ``trainer.mode=async`` failed or died."""


def failure_message(worker: str, rank: int, doing: str, error: str) -> str:
    """What a failed call raises: the worker's class and rank, what it was doing, its error, and what to do where
    the error says what is wrong outside the run (an MPS daemon that refused the process: ``mps.refused_hint``)."""
    return f"{worker} rank {rank} failed while {doing}: {error}{refused_hint(error)}"


def wait_watched(phase: str, calls: List[Tuple["WorkerGroup", List[Any]]], what: Optional[str] = None) -> List[Any]:
    """The results of calls on one or more groups (``(group, refs)`` pairs, results in that order). Every call of the
    controller on its workers is waited on here (dispatch, submit, the async weight broadcast).

    Under the first group's watchdog when it has one: past the phase's limit the pending ranks are named, their
    stacks printed, and PhaseHangError raised. A failed call raises the group's ``call_error`` naming the worker and
    ``what`` it was doing (default: the phase); when the failure is a collective whose peer went away
    (``PEER_GONE``), the other calls are waited for first, so the worker that died is the one named."""
    if any(hasattr(group, "wait") for group, _ in calls):  # in-process groups (controller.in_process) wait their own
        return [result for group, refs in calls for result in group.wait(phase, refs, what or "")]
    owner = {ref: (group, rank) for group, refs in calls for rank, ref in enumerate(refs)}
    order = [ref for _, refs in calls for ref in refs]
    watchdog = calls[0][0].watchdog
    limit = watchdog.limit_s(phase) if watchdog is not None else None
    start, pending, results = time.monotonic(), list(order), {}
    peer_gone: Optional[WorkerCallError] = None
    while pending:
        left = None if limit is None else max(0.0, start + limit - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:  # past the phase's limit: name the ranks that did not answer, with their stacks
            for group, refs in calls:
                ranks = [r for r, ref in enumerate(refs) if ref in pending]
                if ranks:
                    watchdog.hung(group.worker_cls.__name__, phase, ranks, time.monotonic() - start,
                                  group.dump_stacks(ranks))
        try:
            results[ready[0]] = ray.get(ready[0])
        except ray.exceptions.RayError as exc:
            group, rank = owner[ready[0]]
            error = group.call_error(failure_message(group.worker_cls.__name__, rank, what or phase, str(exc)))
            if not any(p in str(exc) for p in PEER_GONE) or not pending:
                raise error from exc
            peer_gone = peer_gone or error  # a peer went away: its own error is the one to report
    if peer_gone is not None:
        raise peer_gone
    if watchdog is not None:
        watchdog.record(phase, time.monotonic() - start)
    return [results[ref] for ref in order]


def start_ray(address: str | None, num_cpus: int | None = None, own_session: bool = False) -> None:
    """Start a local Ray (``address`` None) or join a running cluster (``auto`` or ``host:port``, the head's GCS),
    once, passing this process's environment on to the workers (on every node). ``own_session``: the local cluster's
    processes in a session of their own, safe from signals to this process's group (``ray_head``; the training CLI,
    which stops it with ``ray_head.stop_local_head``). A run's own defaults for its workers go to each
    ``WorkerGroup`` (``worker_env``), not here: a process that started Ray itself would miss them."""
    if ray.is_initialized():
        return
    env_keys = ("HF_HUB_OFFLINE", "REASONRL_CACHE", "REASONRL_DATA_DIR", "VLLM_ENABLE_V1_MULTIPROCESSING",
                "VLLM_CPU_KVCACHE_SPACE", "TOKENIZERS_PARALLELISM", "PYTHONPATH", "HF_HOME",
                "REASONRL_FAULT_AT", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_DEBUG",
                "PYTORCH_CUDA_ALLOC_CONF")  # expandable_segments: a shared GPU (docs/async.md)
    env = {k: os.environ[k] for k in env_keys if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # None or "local": a new cluster of our own, even when another one runs on this machine (ray.init() would join it)
    joining = address not in (None, "local")
    if own_session and not joining:
        from .ray_head import start_local_head

        address, joining = start_local_head(num_cpus).address, True
    ray.init(address=address if joining else "local", num_cpus=None if joining else num_cpus, include_dashboard=False,
             log_to_driver=True, logging_level="WARNING", runtime_env={"env_vars": env})


def cpus_per_worker(world_size: int, groups: int = 1) -> int:
    """CPU cores for each worker of a CPU run: the cluster's CPUs shared by ``groups`` worker groups of
    ``world_size`` ranks (colocated groups time-share the cores: Ray is told of each core once per group)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)) // (world_size * groups))
