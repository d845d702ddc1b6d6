"""EngineThread: every call on one thread, in order; a call from that thread runs at once; errors come back."""
from __future__ import annotations

import threading

import pytest

from reasonrl.workers.engine_thread import EngineThread


def test_calls_from_several_threads_all_run_on_the_one_engine_thread():
    engine = EngineThread("t")
    seen = []
    callers = [threading.Thread(target=lambda: engine.call(lambda: seen.append(threading.get_ident())))
               for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    engine.call(lambda: seen.append(threading.get_ident()))  # and from this thread
    assert seen == [engine.ident] * 5
    assert engine.ident != threading.get_ident()
    engine.close()


def test_a_call_made_on_the_engine_thread_runs_at_once_instead_of_waiting_behind_itself():
    """The partial generator loads staged weights from inside a generate call: with one worker thread, queueing that
    call would wait forever for the call it is part of."""
    engine = EngineThread("t")
    order = []

    def outer():
        order.append("outer")
        inner = engine.call(lambda: order.append("inner") or threading.get_ident())
        order.append("after")
        return inner

    assert engine.call(outer) == engine.ident
    assert order == ["outer", "inner", "after"]
    engine.close()


def test_an_error_raised_on_the_engine_thread_is_raised_to_the_caller_and_the_thread_goes_on():
    engine = EngineThread("t")

    def fail():
        raise ValueError("engine said no")

    with pytest.raises(ValueError, match="engine said no"):
        engine.call(fail)
    assert engine.call(lambda a, b=0: a + b, 2, b=3) == 5
    engine.close()
