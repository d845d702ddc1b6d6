"""JSON over HTTP for the reward endpoints: one POST under a whole-call deadline, retried with exponential backoff,
at most ``concurrency`` requests in flight (a thread pool of that size).

Errors are typed so the caller can tell a retryable outage (``EndpointTimeout``, ``EndpointUnreachable``, an
``EndpointHTTPError`` with 408/429/5xx) from an answer that will not get better by asking again (any other HTTP
status, ``EndpointGarbage``). Every error ends as a *failed* sample, never a score of 0. Standard library only.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import urlsplit

RETRYABLE_STATUS = (408, 429, 500, 502, 503, 504)
"""HTTP statuses worth another attempt (the service is busy or broken for a moment)."""


class EndpointError(RuntimeError):
    """A request that got no usable answer; ``retryable`` says whether asking again may help."""

    retryable = False


class EndpointTimeout(EndpointError):
    retryable = True


class EndpointUnreachable(EndpointError):
    retryable = True


class EndpointGarbage(EndpointError):
    """The service answered, but not with what the contract says (not JSON, wrong shape)."""


class EndpointHTTPError(EndpointError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.retryable = status in RETRYABLE_STATUS


def post_json(url: str, payload: Any, timeout_s: float, headers: Optional[Dict[str, str]] = None) -> Any:
    """POST ``payload`` as JSON to ``url`` and return the decoded JSON answer; the whole call (connect, send, read)
    ends within ``timeout_s`` or raises EndpointTimeout. Other failures raise the EndpointError kinds above."""
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout_s
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = json.dumps(payload).encode()
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", "Accept": "application/json",
                                          **(headers or {})})
        _limit(conn, deadline)
        response = conn.getresponse()
        chunks: List[bytes] = []
        while True:
            _limit(conn, deadline)
            chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
        text = b"".join(chunks).decode("utf-8", errors="replace")
    except (socket.timeout, TimeoutError):
        raise EndpointTimeout(f"no complete answer within {timeout_s:g}s") from None
    except (ConnectionError, OSError, http.client.HTTPException) as exc:
        raise EndpointUnreachable(f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise EndpointHTTPError(response.status, text)
    try:
        return json.loads(text)
    except ValueError:
        raise EndpointGarbage(f"the answer is not JSON: {text[:200]!r}") from None


def _limit(conn: http.client.HTTPConnection, deadline: float) -> None:
    """Cap the socket's next wait at what is left of the call's time."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise EndpointTimeout("deadline passed")
    if conn.sock is not None:
        conn.sock.settimeout(left)


def backoff_delay(attempt: int, backoff_s: float, max_backoff_s: float) -> float:
    """The wait before retry number ``attempt`` (1, 2, ...): backoff_s, 2x, 4x, ... capped at max_backoff_s."""
    return min(max_backoff_s, backoff_s * 2.0 ** (attempt - 1))


class EndpointClient:
    """Calls to one endpoint: ``submit(fn)`` runs ``fn(post)`` on one of ``concurrency`` threads, where ``post``
    is ``post_json`` bound to the endpoint's URL, timeout, headers and retry rule. Counts requests, retries,
    timeouts and failures for ``pop_stats``."""

    def __init__(self, cfg: Any, name: str) -> None:
        """``cfg``: an ``EndpointConfig`` (url, concurrency, timeout_s, retries, backoff_s, max_backoff_s,
        api_key_env); ``name``: the source's name, in thread names and errors."""
        self.cfg = cfg
        self.name = name
        self.headers: Dict[str, str] = {}
        if cfg.api_key_env:
            token = os.environ.get(cfg.api_key_env)
            if not token:
                raise ValueError(f"reward.{name}.api_key_env names {cfg.api_key_env}, which is not set")
            self.headers["Authorization"] = f"Bearer {token}"
        self._pool = ThreadPoolExecutor(max_workers=int(cfg.concurrency), thread_name_prefix=f"reward-{name}")
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._stats = self._zero()
        self.backoffs: List[float] = []
        """Every backoff wait so far, in seconds (the tests read the schedule from it)."""

    @staticmethod
    def _zero() -> Dict[str, Any]:
        return {"requests": 0, "retries": 0, "timeouts": 0, "errors": 0, "latencies": []}

    def post(self, payload: Any, url: Optional[str] = None) -> Any:
        """``payload`` to the endpoint (or ``url``), retried per the config; raises the last EndpointError."""
        attempts = 1 + int(self.cfg.retries)
        for attempt in range(1, attempts + 1):
            start = time.monotonic()
            try:
                answer = post_json(url or self.cfg.url, payload, float(self.cfg.timeout_s), self.headers)
                self._count(start, requests=1)
                return answer
            except EndpointError as exc:
                self._count(start, requests=1, timeouts=int(isinstance(exc, EndpointTimeout)))
                if not exc.retryable or attempt == attempts or self._closed.is_set():
                    self._count(None, errors=1)
                    raise
                delay = backoff_delay(attempt, float(self.cfg.backoff_s), float(self.cfg.max_backoff_s))
                with self._lock:
                    self.backoffs.append(delay)
                self._count(None, retries=1)
                if self._closed.wait(delay):
                    raise EndpointUnreachable("the reward source was closed while waiting to retry") from None
        raise AssertionError("unreachable")

    def _count(self, start: Optional[float], **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                self._stats[key] += n
            if start is not None:
                self._stats["latencies"].append(time.monotonic() - start)

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the client's threads (at most ``concurrency`` at once)."""
        return self._pool.submit(fn)

    def pop_stats(self, prefix: str) -> Dict[str, float]:
        """``<prefix>/{requests,retries,timeouts,errors,latency_p50_s,latency_p99_s}`` since the last call."""
        with self._lock:
            stats, self._stats = self._stats, self._zero()
        latencies = sorted(stats.pop("latencies"))
        out = {f"{prefix}/{k}": float(v) for k, v in stats.items()}
        for q, key in ((0.5, "latency_p50_s"), (0.99, "latency_p99_s")):
            out[f"{prefix}/{key}"] = (latencies[min(len(latencies) - 1, max(0, math.ceil(q * len(latencies)) - 1))]
                                      if latencies else 0.0)
        return out

    def close(self) -> None:
        """Stop waiting retries and drop queued calls; calls in flight end at their own timeout."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
