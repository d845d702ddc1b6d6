"""Named fault points: a deterministic way for tests (and curious users) to interrupt a run at an exact place.

``REASONRL_FAULT_AT`` holds comma-separated ``point[#count]=action`` entries; when the process reaches ``point`` for
the ``count``-th time (default 1), the action runs:

- ``sigint``: SIGINT (as Ctrl-C would), raised in the calling thread so that its Python handler has run when the
  fault point returns (``os.kill`` of the process may deliver it to another thread, and the handler later);
- ``sigkill``: SIGKILL to the process's group when it leads one (so Ray's processes die with it, as ``kill -9`` of
  a terminal's job does), else to the process itself;
- ``hang``: block forever (a stuck worker; used through ``WorkerGroup`` on a worker, see ``hang_here``);
- ``skip``: the call about to be made at the point is left out (only ``fleet.replica<r>.load_published``: the
  replica keeps the weights it holds, a stale replica for the weight-sync check; elsewhere it does nothing);
- ``raise``: raise ``FaultRaised`` (a call that fails while its process lives; used through
  ``fleet.prompt<id>.generate``, see below, where ``sigkill`` and ``hang`` run in the replica too);
- ``pause``: block until the file named by ``REASONRL_FAULT_RELEASE`` exists, signal handlers running meanwhile (a
  step held in flight while a test signals the run; the printed ``fault point ...: pause`` line says it is held).

Points in the code: ``group.<method>`` (the controller has sent ``<method>`` to every worker and waits),
``worker<rank>.<method>`` (the worker of that rank blocks before running ``<method>``: ``hang`` only),
``rollout<rank>.generate_stream`` (the async trainer starts a batch's generation; the action runs in the rollout
worker of that rank, before it generates: ``sigkill`` is a crashed worker),
``checkpoint.written`` (the workers wrote their checkpoint files; ``trainer_state.json`` not yet),
``checkpoint.saved`` (a checkpoint is complete), ``step.begin`` (the trainer is about to start a step),
``step.round_taken`` (the step's round is verified, before the update), ``step.updated`` (the actor updated, the
weights not published yet), ``step.published`` (the weights published; with the fleet the round is ``trained`` in its
ledger; the metrics row and the checkpoint not written yet), ``eval.batch_stored`` (eval appended a verified batch to
``samples.jsonl``). The fleet (``trainer/fleet_source.py``): ``fleet.replica<r>.generate``,
``fleet.replica<r>.load_published`` and ``fleet.replica<r>.check_weights`` (the trainer is about to send that call
to the replica; the action runs in the replica's process first: ``sigkill`` is a crashed replica, ``hang`` a stuck
one), ``fleet.prompt<id>.generate`` (a ``generate`` call holding
the prompt of ledger id ``<id>`` is about to be sent, counted per call holding it; ``raise``: that call raises in the
replica, which lives on; ``sigkill`` or ``hang``: run in the replica just before that call, queued ahead of it, so the
replica dies or hangs when it reaches the call holding the prompt (an engine the prompt crashes); a test lists ``#1``,
``#2``, ... to make the prompt fail on every call: a poison prompt, ``fleet.poison``), ``fleet.round_issued`` (every
prompt of the round handed to
a replica, none answered yet), ``fleet.replica_lost`` (a lost replica's prompts revoked and its restart booked, not
issued again yet), ``fleet.ledger_saved`` (a checkpoint being written holds the ledger's journals; the workers' files
not yet). docs/fleet.md's fault matrix kills the trainer, a replica or both at these points.
Without the variable nothing happens.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from typing import Dict, Optional, Tuple

ENV = "REASONRL_FAULT_AT"
RELEASE_ENV = "REASONRL_FAULT_RELEASE"
ACTIONS = ("sigint", "sigkill", "hang", "pause", "skip", "raise")
PAUSE_POLL_S = 0.05
"""How often ``pause`` looks for its release file (its wait also wakes for every signal, whose handler then runs)."""

_hits: Counter = Counter()


class FaultRaised(RuntimeError):
    """What the ``raise`` action raises."""


def parse(spec: str) -> Dict[Tuple[str, int], str]:
    """``"group.generate#2=sigint,checkpoint.saved=sigkill"`` -> {("group.generate", 2): "sigint", ...}."""
    out: Dict[Tuple[str, int], str] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        point, _, action = entry.partition("=")
        name, _, count = point.partition("#")
        if action not in ACTIONS or not name or (count and not count.isdigit()):
            raise ValueError(f"{ENV}: bad entry {entry!r}; expected point[#count]=action with action in {ACTIONS}")
        out[(name, int(count or 1))] = action
    return out


def planned(point: str, hit: int) -> Optional[str]:
    """The action planned for the ``hit``-th arrival at ``point`` (None: nothing)."""
    spec = os.environ.get(ENV)
    return parse(spec).get((point, hit)) if spec else None


def arrive(point: str) -> Optional[str]:
    """Count an arrival at ``point``; the action planned for it (None: nothing)."""
    if not os.environ.get(ENV):
        return None
    _hits[point] += 1
    action = planned(point, _hits[point])
    if action is not None:
        print(f"fault point {point}#{_hits[point]}: {action}", flush=True)
    return action


def fault_point(point: str) -> None:
    """Count an arrival at ``point`` and run the action ``REASONRL_FAULT_AT`` plans for it, if any."""
    action = arrive(point)
    if action is not None:
        run_action(action)


def run_action(action: str) -> None:
    """Run one of ``ACTIONS`` in this process, now."""
    if action == "sigint":
        signal.raise_signal(signal.SIGINT)
    elif action == "sigkill":
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "hang":
        hang_here()
    elif action == "pause":
        pause_until_released()
    elif action == "raise":
        raise FaultRaised("fault point: raise")


def pause_until_released() -> None:
    """Block until the file ``REASONRL_FAULT_RELEASE`` names exists (a step held in flight)."""
    release = os.environ.get(RELEASE_ENV)
    if not release:
        raise ValueError(f"{ENV}: the pause action needs {RELEASE_ENV}=<a file whose creation releases it>")
    while not os.path.exists(release):
        time.sleep(PAUSE_POLL_S)


def run_in_actor(_instance, action: str) -> None:
    """Run ``action`` in a Ray actor's process: ``actor.__ray_call__.remote(run_in_actor, action)`` (Ray passes the
    actor instance first), issued just before the call it should precede (an actor runs calls in the order issued)."""
    run_action(action)


def hang_here(_instance=None) -> None:
    """Block forever on an event nobody sets (a worker that never answers). Callable through Ray's
    ``actor.__ray_call__`` (which passes the actor instance first)."""
    threading.Event().wait()
