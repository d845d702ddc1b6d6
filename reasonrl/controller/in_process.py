"""InProcessGroup: one worker built in this process, called with the dispatch rules of a Ray ``WorkerGroup``.

The worker gets a thread of its own and every call runs there, in the order it was issued (as on a Ray actor), so a
call issued while a streamed generation runs waits behind it, and the async source's ordering argument holds. Used by
``trainer.backends.InProcessBackend`` for benchmarks and fast tests of the loop: the trainer cannot tell it from the
Ray group. World size 1 (one rank, one engine); ``torch.distributed`` gets a group of one.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Tuple

from reasonrl.data.batch import Batch
from reasonrl.fault_points import fault_point
from reasonrl.workers.dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, SPLIT_BY_ENGINE, SPLIT_METRICS

from .placement import free_port
from .worker_group import GenerationError, WorkerCallError, mean_metrics

_END = object()


class InProcessGroup:
    """``worker_cls(**init_kwargs)`` as rank 0 of a group of one (see the module docstring)."""

    world_size = 1
    engine_ranks = 1
    engines = 1

    def __init__(self, worker_cls: type, init_kwargs: Dict[str, Any]) -> None:
        self.worker_cls = worker_cls
        self.watchdog = None
        self.call_error: type = WorkerCallError
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"{worker_cls.__name__}-0")
        self.thread_ident = self.executor.submit(threading.get_ident).result()
        self.worker = self.executor.submit(lambda: worker_cls(**init_kwargs, rank=0, world_size=1,
                                                              master_addr="127.0.0.1",
                                                              master_port=free_port("127.0.0.1"))).result()
        self.workers: List[Any] = []  # no Ray actors (the fault points that act inside one do not apply)

    def enable_watchdog(self, watchdog: Any, stack_dir: str) -> None:
        self.watchdog = watchdog

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_") or name in ("worker", "worker_cls", "executor"):
            raise AttributeError(name)
        method = getattr(self.worker_cls, name, None)
        mode = getattr(method, "dispatch_mode", None)
        if mode is None:
            raise AttributeError(f"{self.worker_cls.__name__}.{name} is not a dispatchable worker method")
        return lambda *args, **kwargs: self._call(name, mode, *args, **kwargs)

    def _call(self, name: str, mode: str, *args: Any, **kwargs: Any) -> Any:
        result = self.wait(name, self.submit(name, *args, **kwargs))[0]
        if mode in (SPLIT_BATCH, SPLIT_BY_ENGINE, RANK_ZERO):
            return result
        if mode == SPLIT_METRICS:
            return mean_metrics([result])
        if mode == ONE_TO_ALL:
            return [result]
        raise ValueError(f"unknown dispatch mode {mode!r}")

    def submit(self, name: str, *args: Any, **kwargs: Any) -> List[Future]:
        """Start ``name`` on the worker's thread without waiting (the fault points of ``name`` apply)."""
        fault_point(f"group.{name}")
        return [self.executor.submit(getattr(self.worker, name), *args, **kwargs)]

    def wait(self, phase: str, futures: List[Future], what: str = "") -> List[Any]:
        """The futures' results under the watchdog (past the phase's limit: the worker thread's stack, then
        PhaseHangError); a failure raises ``call_error`` naming the worker."""
        limit = self.watchdog.limit_s(phase) if self.watchdog is not None else None
        start = time.monotonic()
        out = []
        for future in futures:
            left = None if limit is None else max(0.0, start + limit - time.monotonic())
            try:
                out.append(future.result(timeout=left))
            except TimeoutError:
                self.watchdog.hung(self.worker_cls.__name__, phase, [0], time.monotonic() - start, self.dump_stacks([0]))
            except Exception as exc:
                raise self.call_error(f"{self.worker_cls.__name__} rank 0 failed while {what or phase}: "
                                      f"{exc}") from exc
        if self.watchdog is not None:
            self.watchdog.record(phase, time.monotonic() - start)
        return out

    def stream(self, name: str, batch: Batch, *args: Any) -> List["queue.Queue"]:
        """Run the generator method ``name`` on the worker's thread; its sub-batches arrive on the returned queue."""
        fault_point(f"group.{name}")
        parts: "queue.Queue" = queue.Queue()

        def run() -> None:
            try:
                for part in getattr(self.worker, name)(batch, *args):
                    parts.put(part)
            except BaseException as exc:  # handed to the reader (iter_stream), not lost in the thread
                parts.put(exc)
            parts.put(_END)

        self.executor.submit(run)
        return [parts]

    def iter_stream(self, streams: List["queue.Queue"]) -> Iterator[Tuple[int, Batch]]:
        for part in iter(streams[0].get, _END):
            if isinstance(part, BaseException):
                raise GenerationError(f"{self.worker_cls.__name__} rank 0 failed while generating: {part}") from part
            yield 0, part

    def dump_stacks(self, ranks: List[int]) -> Dict[int, str]:
        frame = sys._current_frames().get(self.thread_ident)
        return {0: "".join(traceback.format_stack(frame)) if frame is not None else "(thread gone)"}

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)
        self.worker = None
