"""The HTTP server: the page (``/``, ``/run/<i>``), its static files (``/static/...``, from this package) and the
JSON API (``view.api``). The standard library's ThreadingHTTPServer; GET only; it never writes to a run directory."""
from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, List
from urllib.parse import parse_qsl, urlsplit

from .api import ROUTES, ApiError
from .page import page_html, prompt_page_html
from .runs import Run

STATIC = Path(__file__).parent / "static"
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def static_files() -> List[str]:
    """The names of the files the page loads (this package's ``static/`` folder)."""
    return sorted(p.name for p in STATIC.iterdir() if p.suffix in TYPES)


def make_handler(runs: List[Run], quiet: bool = True) -> type:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, payload: Any) -> None:
            self._send(status, json.dumps(payload, allow_nan=False, default=str).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            url = urlsplit(self.path)
            params = dict(parse_qsl(url.query))
            if url.path in ROUTES:
                try:
                    self._json(200, ROUTES[url.path](runs, params))
                except ApiError as exc:
                    self._json(exc.status, {"error": str(exc)})
            elif url.path == "/prompt":
                self._send(200, prompt_page_html().encode(), "text/html; charset=utf-8")
            elif url.path == "/" or url.path.startswith("/run/"):
                self._send(200, page_html().encode(), "text/html; charset=utf-8")
            elif url.path[len("/static/"):] in static_files():
                path = STATIC / url.path[len("/static/"):]
                self._send(200, path.read_bytes(), TYPES[path.suffix])
            else:
                self._json(404, {"error": f"no such page: {url.path}"})

        def log_message(self, fmt: str, *args: Any) -> None:
            if not quiet:
                sys.stderr.write("view: " + fmt % args + "\n")

    return Handler


def make_server(runs: List[Run], host: str = "127.0.0.1", port: int = 8050, quiet: bool = True) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0: any free one, read back from ``server.server_address``)."""
    server = ThreadingHTTPServer((host, port), make_handler(runs, quiet))
    server.daemon_threads = True
    return server
