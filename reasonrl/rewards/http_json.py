"""JSON over HTTP for the reward endpoints: one POST under a whole-call deadline, retried with exponential backoff,
at most ``concurrency`` requests in flight (a thread pool of that size).

The deadline bounds the whole call, connect to last byte: every socket wait is capped at what is left of it, and a
watchdog shuts the socket down when it passes, so a server that trickles its status line, headers or body a byte at
a time cannot hold a call past ``timeout_s``. An answer is read up to ``max_bytes`` and no further. Every text made
from the answer or the URL goes through ``redact`` (redact.py) before it is cut short.

Errors are typed so the caller can tell a retryable outage (``EndpointTimeout``, ``EndpointUnreachable``, an
``EndpointHTTPError`` with 408/429/5xx) from an answer that will not get better by asking again (any other HTTP
status, ``EndpointGarbage``, ``EndpointOversize``). Every error ends as a *failed* sample, never a score of 0.
Standard library only.
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
from typing import Any, Callable, Dict, List, Optional, Sequence
from urllib.parse import urlsplit

from reasonrl.config.reward_sources_schema import EndpointConfig

from .redact import excerpt, redact, url_secrets

RETRYABLE_STATUS = (408, 429, 500, 502, 503, 504)
"""HTTP statuses worth another attempt (the service is busy or broken for a moment)."""

ERROR_BODY_BYTES = 4096
"""How much of a non-200 answer's body is read (for the failure reason, which shows 200 characters of it)."""


class EndpointError(RuntimeError):
    """A request that got no usable answer; ``retryable`` says whether asking again may help."""

    retryable = False


class EndpointTimeout(EndpointError):
    retryable = True


class EndpointUnreachable(EndpointError):
    retryable = True


class EndpointGarbage(EndpointError):
    """The service answered, but not with what the contract says (not JSON, wrong shape)."""


class EndpointOversize(EndpointError):
    """The answer is larger than the size limit (not retried: it would be as large again)."""


class EndpointHTTPError(EndpointError):
    def __init__(self, status: int, body: str, secrets: Sequence[str] = ()) -> None:
        super().__init__(f"HTTP {status}: {excerpt(body, 200, secrets)}")
        self.status = status
        self.retryable = status in RETRYABLE_STATUS


class _Deadline:
    """The end of one call: ``arm()`` caps the socket's next wait at what is left (EndpointTimeout once it passed);
    a watchdog thread shuts the socket down at the end, so a wait that is already blocked returns at once (a read
    that keeps getting a byte in time would otherwise never time out); ``fired`` says it did."""

    def __init__(self, conn: http.client.HTTPConnection, timeout_s: float) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self.end = time.monotonic() + timeout_s
        self.fired = False
        self._stopped = False
        self._lock = threading.Lock()  # a shutdown never races the close (the descriptor could be reused)
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def timeout(self) -> EndpointTimeout:
        return EndpointTimeout(f"no complete answer within {self.timeout_s:g}s")

    def arm(self) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.timeout()
        if self.conn.sock is not None:
            self.conn.sock.settimeout(left)

    def _fire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.fired = True
            if self.conn.sock is not None:
                try:
                    socket.socket.shutdown(self.conn.sock, socket.SHUT_RDWR)  # the descriptor's, TLS or not
                except OSError:
                    pass

    def stop(self) -> None:
        """Called before the connection closes: the watchdog does nothing from now on."""
        with self._lock:
            self._stopped = True
        self._timer.cancel()


def post_json(url: str, payload: Any, timeout_s: float, headers: Optional[Dict[str, str]] = None,
              max_bytes: int = EndpointConfig.max_response_bytes, secrets: Sequence[str] = (),
              size_key: str = "max_response_bytes") -> Any:
    """POST ``payload`` as JSON to ``url`` and return the decoded JSON answer; the whole call (connect, send, read
    to the last byte) ends within ``timeout_s`` or raises EndpointTimeout; an answer over ``max_bytes`` raises
    EndpointOversize naming ``size_key`` (the config key that sets it). Other failures raise the EndpointError kinds
    above, their messages redacted of ``secrets`` (and of the URL's credentials, which are never sent)."""
    parts = urlsplit(url)
    secrets = [*secrets, *url_secrets(url)]
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = json.dumps(payload).encode()
    deadline = _Deadline(conn, timeout_s)
    try:
        conn.connect()
        deadline.arm()
        conn.request("POST", path, body, {"Content-Type": "application/json", "Accept": "application/json",
                                          **(headers or {})})
        deadline.arm()
        response = conn.getresponse()
        if response.status != 200:
            error = _read_body(response, deadline, ERROR_BODY_BYTES, None)
            raise EndpointHTTPError(response.status, error.decode("utf-8", errors="replace"), secrets)
        data = _read_body(response, deadline, int(max_bytes), size_key)
    except EndpointError:
        raise
    except (socket.timeout, TimeoutError):
        raise deadline.timeout() from None
    except (ConnectionError, OSError, http.client.HTTPException) as exc:
        if deadline.fired:  # the watchdog's shutdown ended the read
            raise deadline.timeout() from None
        raise EndpointUnreachable(redact(f"{type(exc).__name__}: {exc}", secrets)) from None
    finally:
        deadline.stop()
        conn.close()
    if deadline.fired:  # an answer cut at the deadline can look complete
        raise deadline.timeout()
    text = data.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise EndpointGarbage(f"the answer is not JSON: {excerpt(text, 200, secrets)}") from None


def _read_body(response: http.client.HTTPResponse, deadline: _Deadline, limit: int, size_key: Optional[str]) -> bytes:
    """The body, never more than ``limit`` bytes of it in memory: a larger one raises EndpointOversize naming
    ``size_key``, or (``size_key`` None) gives its first ``limit`` bytes."""
    declared = (response.getheader("Content-Length") or "").strip()
    if size_key and declared.isdigit() and int(declared) > limit:
        raise EndpointOversize(f"the answer is {int(declared)} bytes (Content-Length), over the limit "
                               f"{size_key}={limit} bytes")
    chunks: List[bytes] = []
    size = 0
    while size <= limit:
        deadline.arm()
        chunk = response.read1(min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        if size_key:
            raise EndpointOversize(f"the answer is over the limit {size_key}={limit} bytes")
        return b"".join(chunks)[:limit]
    return b"".join(chunks)


def backoff_delay(attempt: int, backoff_s: float, max_backoff_s: float) -> float:
    """The wait before retry number ``attempt`` (1, 2, ...): backoff_s, 2x, 4x, ... capped at max_backoff_s."""
    return min(max_backoff_s, backoff_s * 2.0 ** (attempt - 1))


class EndpointClient:
    """Calls to one endpoint: ``submit(fn)`` runs ``fn(post)`` on one of ``concurrency`` threads, where ``post``
    is ``post_json`` bound to the endpoint's URL, timeout, headers and retry rule. Counts requests, retries,
    timeouts and failures for ``pop_stats``."""

    def __init__(self, cfg: Any, name: str) -> None:
        """``cfg``: an ``EndpointConfig`` (url, concurrency, timeout_s, retries, backoff_s, max_backoff_s,
        api_key_env, max_response_bytes); ``name``: the source's name, in thread names and errors."""
        self.cfg = cfg
        self.name = name
        self.headers: Dict[str, str] = {}
        self.secrets: List[str] = url_secrets(cfg.url)
        """The literal secrets this client knows (the API key, the URL's credentials): redacted wherever a text is
        made from the endpoint's answers or URL."""
        if cfg.api_key_env:
            token = os.environ.get(cfg.api_key_env)
            if not token:
                raise ValueError(f"reward.{name}.api_key_env names {cfg.api_key_env}, which is not set")
            self.headers["Authorization"] = f"Bearer {token}"
            self.secrets.append(token)
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
                answer = post_json(url or self.cfg.url, payload, float(self.cfg.timeout_s), self.headers,
                                   max_bytes=int(self.cfg.max_response_bytes), secrets=self.secrets,
                                   size_key=f"reward.{self.name}.max_response_bytes")
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

    def redact(self, text: Any) -> str:
        """``text`` without the secrets of this endpoint (``redact.redact`` with the client's own)."""
        return redact(text, self.secrets)

    def excerpt(self, value: Any, limit: int) -> str:
        """``value``'s repr, redacted, then cut to ``limit`` characters (``redact.excerpt``)."""
        return excerpt(value, limit, self.secrets)

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
