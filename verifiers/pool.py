"""VerifierPool: run verify calls in killable worker processes, many at a time, results in input order.

Each worker is a fresh interpreter (``python -m reasonrl.verifiers.pool_worker``, started like the
``spawn`` method but without re-importing the trainer's main module, which would drag torch into the
worker). The parent sends a worker a chunk of calls at once (one message, gold answers grouped so each is
sent and parsed once); the worker answers each call as soon as it is done. The parent therefore knows
which call is running and when it started: a call past ``timeout_s`` gets its worker killed (SIGKILL)
and replaced, scores as a timeout, and the rest of that chunk goes back to the queue. A worker that dies
(segfault, ``os._exit``) costs only the call it was running.

Work is handed over without waiting: ``submit(items)`` queues the calls and returns a ``Submission`` at once;
a dispatcher thread (running only while calls are open) feeds the workers, reads their answers and enforces
the timeouts, so a trainer can submit each chunk of responses as generation finishes it and collect the
results (``Submission.result()``, input order) later. ``verify_batch`` is ``submit(items).result()``.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from .base import VerifyResult

Item = Tuple[Any, ...]
"""``(verifier_name, response, ground_truth)`` or ``(verifier_name, response, ground_truth, extra)``."""

_MAX_CHUNK = 64
"""Most calls sent to a worker in one message."""
_CHUNKS_PER_WORKER = 4
"""A batch is cut into about this many chunks per worker, so that slow calls spread evenly."""
_MAX_START_FAILURES = 3
"""Workers that die (or hang) before they are ready, in a row, before the pool gives up with an error."""
_START_TIMEOUT_S = 120.0
"""A worker not ready (imports and warm-up done) this long after its start counts as a failed start."""


class _Worker:
    """One worker process, its two pipe ends, and the calls it holds (in the order it runs them)."""

    def __init__(self, settings: Dict[str, Any]) -> None:
        """``settings``: the first message the worker reads (its verifier options and score range)."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reasonrl.verifiers.pool_worker", str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self.ready = False
        self.started_at = time.monotonic()
        self.outstanding: Deque[int] = deque()
        self.head_started = 0.0
        self.outbox.send(settings)

    def send_chunk(self, chunk: list, task_ids: List[int]) -> None:
        self.outbox.send(chunk)
        self.outstanding = deque(task_ids)
        self.head_started = time.monotonic()

    def exit_code(self) -> Optional[int]:
        """The exit code of a process whose pipe closed (waits briefly for it to be reaped)."""
        try:
            return self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the process and close the pipes (idempotent)."""
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for conn in (self.outbox, self.inbox):
            try:
                conn.close()
            except OSError:
                pass

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within a second."""
        try:
            self.outbox.send(None)
            self.proc.wait(timeout=1)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _shutdown(workers: List[_Worker]) -> None:
    for worker in workers:
        worker.stop()
    workers.clear()


def _check_options(verifier_options: Optional[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """``{verifier name: {option: value}}`` as plain dicts; a clear error for any other shape."""
    checked: Dict[str, Dict[str, Any]] = {}
    for name, options in (verifier_options or {}).items():
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ValueError(f"verifier_options maps a verifier name to its options, e.g. "
                             f"{{'math': {{'float_rounding': 6}}}}; got {name!r}: {options!r}")
        checked[str(name)] = dict(options)
    return checked


def _group_key(name: str, ground_truth: Any, extra: Dict[str, Any]) -> str:
    try:
        return json.dumps([name, ground_truth, extra], sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr((name, ground_truth, extra))


def _percentile(sorted_values: List[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[rank])


class Submission:
    """Calls handed to ``VerifierPool.submit``: ``result()`` waits for all of them and returns their results in
    input order; ``done()`` says, without waiting, whether they are all in."""

    def __init__(self, pool: "VerifierPool", task_ids: List[int]) -> None:
        self._pool = pool
        self.task_ids = task_ids
        self._results: Optional[List[VerifyResult]] = None

    def __len__(self) -> int:
        return len(self.task_ids)

    def done(self) -> bool:
        return self._results is not None or self._pool._all_done(self.task_ids)

    def result(self) -> List[VerifyResult]:
        """Block until every call has a result (a verdict, a timeout or a worker death; never longer than the
        pool's per-call timeout per call); raises if the pool failed (workers that cannot start) or was closed."""
        if self._results is None:
            self._results = self._pool._collect(self.task_ids)
        return self._results


class VerifierPool:
    """Worker processes that run verifiers with a hard per-call timeout.

    Args:
        workers: number of worker processes; 0 means ``os.cpu_count()``.
        timeout_s: wall-clock limit of one verify call; past it the worker is killed and replaced and the
            call fails (``VerifyResult.failed``, ``info["timed_out"] = True``).
        verifier_options: per verifier name, the keyword options its constructor gets
            (``{"math": {"float_rounding": 6}}``).
        score_range: (low, high): a verdict whose score is not a finite number in this range (bounds included) is a
            failure naming the verifier, as are calls that time out, crash their worker, raise, or return something
            that is not a ``VerifyResult``.

    Thread-safe: ``submit``, ``verify_batch``, ``Submission.result`` and ``pop_stats`` may be called from any thread.
    """

    def __init__(self, workers: int = 0, timeout_s: float = 10.0,
                 verifier_options: Optional[Dict[str, Dict[str, Any]]] = None,
                 score_range: Sequence[float] = (0.0, 1.0)) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        low, high = (float(x) for x in score_range)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"score_range must be two finite numbers, low < high; got {list(score_range)}")
        self.score_range = (low, high)
        self.num_workers = int(workers) if workers and workers > 0 else (os.cpu_count() or 1)
        self.timeout_s = float(timeout_s)
        self.verifier_options = _check_options(verifier_options)
        self._workers: List[_Worker] = [self._new_worker() for _ in range(self.num_workers)]
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        self._start_failures = 0
        self._state = threading.Condition()
        self._calls: Dict[int, Tuple[str, Any, Any, str, Dict[str, Any], int]] = {}  # open calls (+ chunk size)
        self._results: Dict[int, VerifyResult] = {}
        self._pending: Deque[int] = deque()  # calls not yet sent to a worker
        self._next_id = 0
        self._error: Optional[BaseException] = None
        self._dispatcher: Optional[threading.Thread] = None
        self._wake_read, self._wake_write = Pipe(duplex=False)
        self._reset_stats()

    # -- public API --------------------------------------------------------------------------------
    def submit(self, items: Sequence[Item]) -> Submission:
        """Queue the items (see ``Item``) and return at once; the calls start as workers come free."""
        calls = [self._unpack(i, item) for i, item in enumerate(items)]
        with self._state:
            if self._error is not None or not self._workers:
                raise RuntimeError("VerifierPool is closed" + (f" ({self._error})" if self._error else ""))
            ids = list(range(self._next_id, self._next_id + len(calls)))
            self._next_id += len(calls)
            chunk_size = max(1, min(_MAX_CHUNK, math.ceil(len(calls) / (self.num_workers * _CHUNKS_PER_WORKER))))
            for task_id, call in zip(ids, calls):
                self._calls[task_id] = (*call, chunk_size)
            # calls with the same gold answer next to each other (stable), so a chunk sends and parses it once
            self._pending.extend(ids[i] for i in sorted(range(len(calls)), key=lambda i: calls[i][3]))
            if calls and self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._run, name="verifier-pool", daemon=True)
                self._dispatcher.start()
        self._wake()
        return Submission(self, ids)

    def verify_batch(self, items: Sequence[Item]) -> List[VerifyResult]:
        """Verify every item; results come back in input order (see ``Item``)."""
        return self.submit(items).result()

    def pop_stats(self) -> Dict[str, float]:
        """Counters since the previous call (then reset): timeouts, errors, calls, latency p50/p99 (s)."""
        with self._state:
            latencies = sorted(self._stats["latencies"])
            stats = {
                "verify/timeouts": self._stats["timeouts"],
                "verify/errors": self._stats["errors"],
                "verify/calls": self._stats["calls"],
                "verify/latency_p50_s": _percentile(latencies, 0.50),
                "verify/latency_p99_s": _percentile(latencies, 0.99),
            }
            self._reset_stats()
        return stats

    def close(self) -> None:
        """Stop the dispatcher and the workers (idempotent); waiting ``result()`` calls raise."""
        with self._state:
            if self._error is None:
                self._error = RuntimeError("VerifierPool is closed")
            self._state.notify_all()
            dispatcher = self._dispatcher
        self._wake()
        if dispatcher is not None and dispatcher is not threading.current_thread():
            dispatcher.join()
        with self._state:
            self._finalizer()

    def __enter__(self) -> "VerifierPool":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the dispatcher thread ---------------------------------------------------------------------
    def _run(self) -> None:
        """Feed idle workers, read answers, enforce timeouts; exit when no call is in flight (or on close/failure)."""
        try:
            while self._serve_once():
                pass
        except Exception as exc:  # e.g. workers that cannot start, or cannot be spawned: every waiter raises
            with self._state:
                self._fail(exc)

    def _serve_once(self) -> bool:
        """One round of the dispatcher: returns False when it should exit."""
        with self._state:
            if self._error is not None or not (self._pending or any(w.outstanding for w in self._workers)):
                self._dispatcher = None
                return False
            self._dispatch()
            busy = [w for w in self._workers if w.outstanding]
            deadlines = [w.head_started + self.timeout_s for w in busy]
            deadlines += [w.started_at + _START_TIMEOUT_S for w in self._workers if not w.ready]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            inboxes = [w.inbox for w in self._workers]
        readable = wait(inboxes + [self._wake_read], timeout=wait_s)
        with self._state:
            while self._wake_read.poll():
                self._wake_read.recv_bytes()
            if self._error is not None:
                self._dispatcher = None
                return False
            for worker in [w for w in self._workers if w.inbox in readable]:
                self._drain(worker)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.outstanding and now >= worker.head_started + self.timeout_s:
                    self._fail_head(worker, timed_out=True)
                elif not worker.ready and now >= worker.started_at + _START_TIMEOUT_S:
                    self._failed_start(worker, f"not ready after {_START_TIMEOUT_S:g}s")
                    self._replace(worker)
            self._state.notify_all()
        return True

    def _wake(self) -> None:
        try:
            self._wake_write.send_bytes(b"!")
        except OSError:
            pass

    def _fail(self, exc: BaseException) -> None:
        """The pool cannot go on (held lock): record why, stop the workers, wake every waiter."""
        self._error = exc
        self._dispatcher = None
        self._finalizer()
        self._state.notify_all()

    def _all_done(self, task_ids: List[int]) -> bool:
        with self._state:
            return all(t in self._results for t in task_ids)

    def _collect(self, task_ids: List[int]) -> List[VerifyResult]:
        with self._state:
            while not all(t in self._results for t in task_ids):
                if self._error is not None:
                    raise RuntimeError(str(self._error))
                self._state.wait()
            results = [self._results.pop(t) for t in task_ids]
            for t in task_ids:
                self._calls.pop(t, None)
            self._stats["calls"] += len(task_ids)
        return results

    # -- internals (called with self._state held) --------------------------------------------------
    def _reset_stats(self) -> None:
        self._stats: Dict[str, Any] = {"timeouts": 0, "errors": 0, "calls": 0, "latencies": []}

    @staticmethod
    def _unpack(index: int, item: Item) -> Tuple[str, Any, Any, str, Dict[str, Any]]:
        if not isinstance(item, (tuple, list)) or len(item) not in (3, 4):
            raise ValueError(f"item {index} must be (verifier, response, ground_truth[, extra]), got {item!r:.200}")
        name, response, ground_truth = item[0], item[1], item[2]
        extra = dict(item[3] or {}) if len(item) == 4 else {}
        return name, response, ground_truth, _group_key(name, ground_truth, extra), extra

    def _dispatch(self) -> None:
        """Send a chunk to every ready, idle worker while calls are pending."""
        for worker in self._workers:
            if not self._pending:
                return
            if not worker.ready or worker.outstanding:
                continue
            chunk_size = self._calls[self._pending[0]][5]
            task_ids = [self._pending.popleft() for _ in range(min(chunk_size, len(self._pending)))]
            chunk: list = []
            for task_id in task_ids:
                name, response, ground_truth, key, extra, _ = self._calls[task_id]
                if chunk and chunk[-1][4] == key:
                    chunk[-1][3].append((task_id, response))
                else:
                    chunk.append([name, ground_truth, extra, [(task_id, response)], key])
            try:
                worker.send_chunk([tuple(group[:4]) for group in chunk], task_ids)
            except (OSError, ValueError):  # died between calls: put the calls back, replace it
                self._pending.extendleft(reversed(task_ids))
                worker.outstanding.clear()
                self._replace(worker)

    def _drain(self, worker: _Worker) -> None:
        """Read everything the worker has sent."""
        try:
            while worker.inbox.poll():
                message = worker.inbox.recv()
                if message[0] == "ready":
                    worker.ready = True
                    self._start_failures = 0
                    continue
                task_id, score, correct, info, latency, failed = message
                if worker.outstanding and worker.outstanding[0] == task_id:
                    worker.outstanding.popleft()
                elif task_id in worker.outstanding:
                    worker.outstanding.remove(task_id)
                else:
                    continue
                self._results[task_id] = VerifyResult(score=score, correct=correct, info=info, failed=failed)
                self._stats["latencies"].append(latency)
                self._stats["errors"] += int(failed)
                worker.head_started = time.monotonic()
        except (EOFError, OSError):  # the process died: its running call pays, the rest are requeued
            if not worker.ready:
                self._failed_start(worker, f"exit code {worker.exit_code()}")
            self._fail_head(worker, timed_out=False)

    def _failed_start(self, worker: _Worker, why: str) -> None:
        """Count a worker that never became ready; give up with an error after a few in a row."""
        self._start_failures += 1
        if self._start_failures >= _MAX_START_FAILURES:
            worker.kill()
            raise RuntimeError(f"verifier workers failed to start {_MAX_START_FAILURES} times in a row ({why}); "
                               "see their stderr above")

    def _fail_head(self, worker: _Worker, timed_out: bool) -> None:
        """Kill and replace ``worker``; its running call fails (no verdict), its queued calls go back to pending."""
        worker.kill()
        if worker.outstanding:
            head = worker.outstanding.popleft()
            elapsed = time.monotonic() - worker.head_started
            if timed_out:
                self._results[head] = VerifyResult.failure(
                    f"timeout: verifier {self._calls[head][0]!r} exceeded {self.timeout_s:g}s (worker killed)", timed_out=True,
                    elapsed_s=round(elapsed, 3))
                self._stats["timeouts"] += 1
            else:
                code = worker.proc.returncode
                self._results[head] = VerifyResult.failure(
                    f"verifier {self._calls[head][0]!r}: its worker died (exit code {code}) while running this call", worker_died=True,
                    exit_code=code, timed_out=False)
                self._stats["errors"] += 1
            self._stats["latencies"].append(elapsed)
            self._pending.extendleft(reversed(worker.outstanding))
            worker.outstanding.clear()
        self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        index = self._workers.index(worker)
        self._workers[index] = self._new_worker()

    def _new_worker(self) -> _Worker:
        return _Worker({"verifier_options": self.verifier_options, "score_range": self.score_range})
