"""EngineThread: one thread that builds a rollout engine and makes every call to it.

A Ray actor with ``max_concurrency`` > 1 (a fleet replica with ``rollout.partial``, which takes staged weights while
it generates) runs its ``__init__`` on one thread and its method calls on a pool of others, taking turns even when the
calls come one at a time (Ray 2.60: two pool threads for two slots, neither the one ``__init__`` ran on). vLLM's
in-process engine is not made to be driven from several threads: CUDA's current device and stream are per thread,
and vLLM keeps a stream per thread (``vllm.utils.torch_utils.current_stream``: thread-local, a new stream on a
thread's first use), so one engine's work lands on streams that nothing orders, and memory the caching allocator
frees on one can be reused while the other's kernels still read it. On an H100 (twenty-fourth session) the replica of
the same-GPU async mode with partial rollouts raised "an illegal memory access" in its generate calls (time-sliced:
the replica was replaced and the run went on; under MPS the fault reached the actor and stopped the run); of the
modes measured, only that one drove its engine from several threads.

So the worker builds its engine here and sends every engine call through ``call``: one thread, always the same, in
the order the calls arrive; a call made from that thread itself (the partial generator loading staged weights
between segments) runs at once instead of waiting behind itself.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class EngineThread:
    """A single thread for an engine's whole life (the module docstring)."""

    def __init__(self, name: str = "engine") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.ident: int = self._pool.submit(threading.get_ident).result()
        """The thread's identifier (what ``threading.get_ident`` says on it)."""

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` run on the engine's thread (at once when called from it); its result, or its
        exception raised here."""
        if threading.get_ident() == self.ident:
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Callable[[], Any]) -> None:
        """``fn()`` queued on the engine's thread, not waited for (``step_loop.StepLoop`` runs there while the calls
        that share it wait on their own requests). From the engine's thread itself it would run only after the call
        that queued it, so that raises."""
        if threading.get_ident() == self.ident:
            raise RuntimeError("EngineThread.submit from the engine's own thread")
        self._pool.submit(fn)

    def close(self) -> None:
        """No more calls; the thread ends once the call it runs returns."""
        self._pool.shutdown(wait=False)
