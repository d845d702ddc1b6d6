"""The run viewer's server on loopback for the view tests: ``serving(runs)`` yields its base URL and stops it after;
``get_json`` reads one answer of its JSON API."""
from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
from typing import Any, Iterator, List

from reasonrl.view.runs import Run
from reasonrl.view.server import make_server


@contextlib.contextmanager
def serving(runs: List[Run]) -> Iterator[str]:
    server = make_server(runs, port=0)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())
