"""StepLoop: one vLLM engine's step loop that several generate calls share (``rollout.partial_mode=in_engine`` on a
fleet replica).

``vllm_stepper.run`` adds one call's requests and steps the engine until they are all done, so a replica's engine
runs the long tail of a batch with few sequences while the next batch's groups, admitted meanwhile, wait for the call
to return (docs/async.md, the in-engine section). Here a call adds its requests to the loop already running, between
two of its steps, and returns as soon as its own requests are done, while the others run on.

* ``submit(prompts, params, lora_request)`` puts the call's ``vllm_stepper.Requests`` in the inbox and returns its
  handle; ``wait(handle)`` waits for them. The first call while no loop runs starts one with ``start(fn)``
  (``EngineThread.submit``: on the engine's thread, not waited for); every other call joins it.
* The loop, on the engine's thread: before adding a batch of calls when no request is in the engine, ``refresh()``
  (the newest staged weights loaded, and the prefix cache dropped if a load made it stale: nothing runs, so it can);
  then ``before_step()`` before every step, whose return stamps the step's tokens (as in ``vllm_stepper.run``).
  It ends once the engine has nothing unfinished and the inbox is empty, both read under one lock, so a call is
  either added by this loop or starts the next one.
* An exception in the loop aborts every unfinished request and is raised in every call waiting on it.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Sequence

from .vllm_stepper import Requests, Stream, absorb_output


class _Waiting:
    """A call's requests and what its caller waits on."""

    def __init__(self, requests: Requests) -> None:
        self.requests = requests
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.left = len(requests.ids)
        self.joined = False
        """Its requests were added while another call's ran in the engine."""

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done.set()


class StepLoop:
    """The shared step loop of one engine (the module docstring). ``llm``: the vLLM ``LLM``; ``start(fn)`` runs ``fn``
    on the engine's thread without waiting; ``refresh()`` and ``before_step()`` return the weight version."""

    def __init__(self, llm, start: Callable[[Callable[[], None]], None], refresh: Callable[[], int],
                 before_step: Callable[[], int]) -> None:
        self.llm, self.start, self.refresh, self.before_step = llm, start, refresh, before_step
        self._lock = threading.Lock()
        self._inbox: List[_Waiting] = []
        self._running = False
        self._live: Dict[str, _Waiting] = {}  # request id -> its call, for requests in the engine
        self.joined = 0
        """Calls added while requests of another call were in the engine."""

    def submit(self, prompts: Sequence[Sequence[int]], params, lora_request) -> "_Waiting":
        """Queue a call's requests (the loop adds them before its next step, or a new loop is started); its handle."""
        if not prompts:
            raise ValueError("a call with no prompts")
        waiting = _Waiting(Requests(prompts, params, lora_request))
        with self._lock:
            self._inbox.append(waiting)
            owner = not self._running
            self._running = True
        if owner:
            try:
                self.start(self._loop)
            except BaseException as exc:  # noqa: BLE001 - no loop will run: the queued calls get the error
                with self._lock:
                    queued, self._inbox, self._running = self._inbox, [], False
                for w in queued:
                    w.fail(exc)
        return waiting

    @staticmethod
    def wait(waiting: "_Waiting") -> List[List[Stream]]:
        """A submitted call's Streams once all its requests are done (for each prompt, ``params.n`` Streams, as
        ``vllm_stepper.run`` gives them); the loop's error if it failed."""
        waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error
        return waiting.requests.groups()

    def _loop(self) -> None:
        engine = self.llm.llm_engine
        try:
            while True:
                with self._lock:
                    new, self._inbox = self._inbox, []
                    if not new and not engine.has_unfinished_requests():
                        self._running = False
                        return
                if new:
                    self._add(engine, new)
                version = self.before_step()
                for out in engine.step():
                    waiting = self._live[out.request_id]
                    stream = absorb_output(waiting.requests.streams, out, version)
                    if stream.finish_reason:
                        del self._live[out.request_id]
                        waiting.left -= 1
                        if not waiting.left:
                            waiting.done.set()
        except BaseException as exc:  # noqa: BLE001 - raised in every waiting call
            self._fail(engine, exc)

    def _add(self, engine, new: List[_Waiting]) -> None:
        if engine.has_unfinished_requests():
            self.joined += len(new)
            for waiting in new:
                waiting.joined = True
        else:
            self.refresh()
        for waiting in new:
            for rid in waiting.requests.ids:
                self._live[rid] = waiting
            waiting.requests.add_to(engine)

    def _fail(self, engine, exc: BaseException) -> None:
        with self._lock:
            calls = {id(w): w for w in [*self._live.values(), *self._inbox]}
            self._inbox, self._running = [], False
        unfinished = list(self._live)
        self._live.clear()
        if unfinished:
            try:
                engine.abort_request(unfinished)
            except Exception:  # noqa: BLE001 - the loop's own error is the one to raise
                pass
        for waiting in calls.values():
            waiting.fail(exc)
