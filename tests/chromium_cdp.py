"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ended
by a NUL byte on file descriptors 3 and 4), with the standard library only: open a page, wait for a condition in it,
click an element with real mouse events, read the DOM, take a screenshot. ``chromium_browser``: one browser for the
whole test session (a pytest plugin of conftest.py); Debian's ``chromium``, a skip without it (a failure under
CI=true)."""
from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest


class Chromium:
    """One headless Chromium process; ``open(url)`` gives a ``Tab``."""

    def __init__(self, executable: str, profile_dir: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [executable, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe",
                "--no-first-run", f"--user-data-dir={profile_dir}", "--window-size=1280,1200", "about:blank"]
        self.proc = subprocess.Popen(["bash", "-c", f"exec {shlex.join(args)} 3<&{to_browser_r} 4>&{from_browser_w}"],
                                     pass_fds=(to_browser_r, from_browser_w), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: List[Dict[str, Any]] = []

    def _read_message(self) -> Dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed its DevTools pipe (exit status {self.proc.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: Optional[Dict[str, Any]] = None, session: Optional[str] = None) -> Any:
        """Send one command and return its result (events that arrive meanwhile are kept in ``events``)."""
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str, **match: Any) -> Dict[str, Any]:
        """The parameters of the next event ``method`` of ``session`` whose parameters include ``match`` (kept
        events first)."""
        def fits(event: Dict[str, Any]) -> bool:
            params = event.get("params", {})
            return (event.get("method") == method and event.get("sessionId") == session
                    and all(params.get(k) == v for k, v in match.items()))

        while True:
            for i, event in enumerate(self.events):
                if fits(event):
                    return self.events.pop(i)["params"]
            self.events.append(self._read_message())

    def open(self, url: str, size: Optional[Tuple[int, int]] = None) -> "Tab":
        """A new tab at ``url`` (its viewport ``size`` pixels when given), after the page's load event."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tab = Tab(self, target, session)
        self.send("Page.enable", session=session)
        self.send("Page.setLifecycleEventsEnabled", {"enabled": True}, session)
        if size:
            tab.resize(*size)
        tab.go(url)
        return tab

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


class Tab:
    """One page of the browser."""

    def __init__(self, browser: Chromium, target: str, session: str) -> None:
        self.browser, self.target, self.session = browser, target, session

    def go(self, url: str) -> None:
        """Navigate and wait for the new document's load event."""
        loader = self.browser.send("Page.navigate", {"url": url}, self.session)["loaderId"]
        self.browser.wait_event("Page.lifecycleEvent", self.session, name="load", loaderId=loader)

    def eval(self, expression: str) -> Any:
        """The value of ``expression`` in the page (a promise is awaited)."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                        "returnByValue": True}, self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_ready(self) -> None:
        """Wait until the page's script marks ``<body data-ready="1">`` (a DOM observer, no polling)."""
        self.eval("""new Promise((resolve) => {
            const ok = () => document.body && document.body.getAttribute("data-ready") === "1";
            if (ok()) return resolve(true);
            new MutationObserver((_, observer) => { if (ok()) { observer.disconnect(); resolve(true); } })
              .observe(document.documentElement, {attributes: true, subtree: true, childList: true});
        })""")

    def click(self, selector: str, navigates: bool = False) -> None:
        """A left click with mouse events at the centre of the first element matching ``selector``."""
        x, y = self.eval(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) throw new Error("no element {selector}"); e.scrollIntoView({{block: "center"}});
            const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        # events of this page so far belong to its current document: a navigation below is a new one
        self.browser.events = [e for e in self.browser.events if e.get("sessionId") != self.session]
        for kind in ("mousePressed", "mouseReleased"):
            self.browser.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                                           "clickCount": 1}, self.session)
        if navigates:  # the main frame's next document, then its load event
            frame = self.browser.wait_event("Page.frameNavigated", self.session)["frame"]
            self.browser.wait_event("Page.lifecycleEvent", self.session, name="load", loaderId=frame["loaderId"])

    def html(self, selector: str = "html") -> str:
        return self.eval(f"document.querySelector({json.dumps(selector)}).outerHTML")

    def resize(self, width: int, height: int) -> None:
        """A viewport of ``width`` x ``height`` pixels, all of it the page's (no scroll bars)."""
        self.browser.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                                 "deviceScaleFactor": 1, "mobile": False}, self.session)
        self.browser.send("Emulation.setScrollbarsHidden", {"hidden": True}, self.session)

    def screenshot(self, out: Path) -> Path:
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        out.write_bytes(base64.b64decode(data))
        return out

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "chromium is not installed (apt-get install -y chromium; .ci/setup_sandboxes.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def chromium_browser(tmp_path_factory) -> Iterator[Chromium]:
    """One headless Chromium for the session's browser tests (each opens its own tabs)."""
    browser = Chromium(chromium_path(), tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield browser
    finally:
        browser.close()
