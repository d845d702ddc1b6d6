"""Bounded work in direct calls of the math verifier (verifiers/math_boxes.py, math_budget.py, math_arith.py).

Nothing here measures speed. Linear extraction is checked under a generous SIGALRM deadline (10 s for what
takes milliseconds; the quadratic version took minutes), answers whose evaluation would never end (a power
tower computed inside C, which no signal interrupts) run in a child process with a timeout, and the time
budget is checked on work that would run for minutes, so the budget, not the work, must end it.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import sympy

from reasonrl.verifiers import get_verifier
from reasonrl.verifiers.math_arith import evaluate
from reasonrl.verifiers.math_boxes import find_boxes
from reasonrl.verifiers.math_budget import MAX_NODES, TooComplex, check_expression, time_budget

LINEAR_DEADLINE_S = 10


class Overtime(BaseException):
    """Raised by the test deadline (a BaseException, so no ``except Exception`` inside the code swallows it)."""


@contextlib.contextmanager
def own_alarm_timer():
    """Take SIGALRM and the real-time timer from pytest-timeout for the block; give back what was left."""
    handler, (remaining, interval) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if remaining:
            signal.setitimer(signal.ITIMER_REAL, max(remaining - (time.monotonic() - started), 0.001), interval)


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail loudly when the block runs past ``seconds`` (main thread only)."""
    def fail(signum, frame):
        raise Overtime(f"still running after {seconds} s")

    with own_alarm_timer():
        signal.signal(signal.SIGALRM, fail)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


# -- 1. extraction is linear ------------------------------------------------------------------------
REPEATED_OPENINGS = "\\boxed{" * 28_572  # 200,004 characters; each opening used to scan to the end
TRUNCATED = [  # (response of about 200 KB, what the verdict must say)
    (REPEATED_OPENINGS, "unclosed_box"),
    ("\\boxed{1" * 25_000, "unclosed_box"),
    ("\\fbox{" * 33_334, "unclosed_box"),
]


@pytest.mark.parametrize("response, method", TRUNCATED, ids=["boxed{", "boxed{1", "fbox{"])
def test_200kb_of_unclosed_boxes_is_verified_under_a_generous_deadline(verifier, response, method):
    assert len(response) >= 200_000
    with deadline(LINEAR_DEADLINE_S):
        result = verifier.verify(response, "1")
    assert result.score == 0.0 and result.info["method"] == method


def test_200kb_of_closed_and_bare_boxes_is_read_under_a_generous_deadline(verifier):
    nested = "\\boxed{" * 50_000 + "7" + "}" * 50_000       # 400 KB: the innermost box is the answer
    bare = "\\boxed 1" * 25_000 + "\nso \\boxed 7"            # no spaces: every bare argument ran to the end
    listed = "\\boxed{1}" * 22_000                            # one list of 22,000 boxes: an answer too long
    with deadline(LINEAR_DEADLINE_S):
        assert verifier.verify(nested, "7").correct
        assert verifier.verify(bare, "7").correct
        too_long = verifier.verify(listed, "1")
    assert too_long.info["too_complex"] and too_long.info["reason"].startswith("too_complex")


def test_boxes_are_indices_not_copies():
    # 28,572 openings, none closed: each box runs to the end of the text, none of them is sliced
    boxes = find_boxes(REPEATED_OPENINGS)
    assert len(boxes) == 28_572
    assert all(not box.closed and box.content_end == len(REPEATED_OPENINGS) for box in boxes)
    assert [box.start for box in boxes[:3]] == [0, 7, 14]  # "\boxed{" is 7 characters


# -- 2. answers that would run for minutes (or forever) ---------------------------------------------
NEVER_ENDING = [  # each of these hung a direct call (2^(2^65536) and 10^(10^10) inside C; the rest in sympy)
    "2^{2^{2^{2^{2^{2}}}}}",
    "10^{10^{10}}",
    "9^{9^{9}}",
    "(10^{100})!",
    "100000!",
    "\\binom{10^{9}}{5 \\cdot 10^{8}}",
    "x^{10^{12}}",
    "\\sum_{k=1}^{10^{6}} \\frac{1}{k^{2}}",
]
_CHILD = """
import json, sys
from reasonrl.verifiers import get_verifier
verifier = get_verifier("math")
results = [verifier.verify("so \\\\boxed{" + answer + "}", "5").info for answer in json.loads(sys.argv[1])]
print(json.dumps(results))
"""


def test_power_towers_and_huge_numbers_score_too_complex_without_being_computed():
    # A child process, because a broken budget would hang this one in C, where no alarm can stop it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(NEVER_ENDING)], env=env, timeout=120,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail("verifying a power tower / huge factorial still runs after 120 s")
    assert done.returncode == 0, done.stderr[-2000:]
    infos = json.loads(done.stdout.strip().splitlines()[-1])
    for answer, info in zip(NEVER_ENDING, infos):
        assert info.get("too_complex") is True and info["reason"].startswith("too_complex"), (answer, info)


def test_the_largest_computable_powers_are_still_computed(verifier):
    # 2^{2^{2^{2^{2}}}} = 2^65536: 65,536 bits, within MAX_BITS = 2^17 = 131,072 -> compared exactly
    assert verifier.verify("\\boxed{2^{2^{2^{2^{2}}}}}", "2^{65536}").correct
    assert not verifier.verify("\\boxed{2^{2^{2^{2^{2}}}}}", "2^{65535}").correct
    assert verifier.verify("\\boxed{\\frac{1}{2004!}}", "\\frac{1}{2004!}").correct  # 2004! ~ 19,000 bits


def test_check_expression_estimates_sizes_without_computing():
    pow_ = lambda base, exponent: sympy.Pow(base, exponent, evaluate=False)  # noqa: E731
    # bits(2) * 65536 = 65,536 <= 131,072; log2(3) * 65536 = 103,872 <= 131,072; log2(3) * 100000 = 158,496 >
    check_expression(pow_(2, 65536))
    check_expression(pow_(3, 65536))
    with pytest.raises(TooComplex, match="power"):
        check_expression(pow_(3, 100000))
    with pytest.raises(TooComplex, match="power"):  # 2^(2^65536): the exponent alone is 65,536 bits
        check_expression(pow_(2, pow_(2, 65536)))
    # n! is about n log2(n) bits: 5000! ~ 5000 * 12.3 = 61,439 bits passes; 20000! ~ 285,754 bits does not
    check_expression(sympy.factorial(sympy.Integer(5000), evaluate=False))
    with pytest.raises(TooComplex, match="factorial"):
        check_expression(sympy.factorial(sympy.Integer(20000), evaluate=False))
    # nodes: an Add of n symbols has n + 1 nodes; 599 symbols -> 600 = MAX_NODES passes, 600 -> 601 does not
    assert MAX_NODES == 600
    check_expression(sympy.Add(*sympy.symbols("a0:599"), evaluate=False))
    with pytest.raises(TooComplex, match="parts"):
        check_expression(sympy.Add(*sympy.symbols("a0:600"), evaluate=False))
    check_expression(pow_(sympy.Symbol("x"), 10_000))  # a symbolic base may have an exponent up to 10^4
    with pytest.raises(TooComplex, match="exponent"):
        check_expression(pow_(sympy.Symbol("x"), 10_001))


# -- long answers -----------------------------------------------------------------------------------
LONG_SUM = "+".join(str(k) for k in range(1, 401))  # 1 + 2 + ... + 400, 1,491 characters
LONG_PAIRS = [  # (gold, prediction, expected_equal)
    ("80200", "\\boxed{" + LONG_SUM + "}", True),                     # 400 * 401 / 2 = 80,200
    ("80201", "\\boxed{" + LONG_SUM + "}", False),
    ("\\frac{150}{151}", "\\boxed{" + "+".join(f"\\frac{{1}}{{{k}\\cdot{k + 1}}}" for k in range(1, 151)) + "}",
     True),                                                            # telescoping: 1 - 1/151 = 150/151
    ("1024", "\\boxed{2^{10}}", True),
    ("1024", "\\boxed{(3 - 1)^{5} \\cdot 32}", True),                 # 32 * 32
    ("6", "\\boxed{3×2}", True),
]


@pytest.mark.parametrize("gold, prediction, expected_equal", LONG_PAIRS)
def test_long_plain_arithmetic_is_compared_exactly(verifier, gold, prediction, expected_equal):
    result = verifier.verify(prediction, gold)
    assert result.correct is expected_equal, result.info
    assert result.info["reason"].endswith("(exact arithmetic)") or result.info["reason"].endswith("(numeric)")


def test_a_long_symbolic_answer_is_too_complex_at_once(verifier):
    long_polynomial = "+".join(f"{k}x^{{{k}}}" for k in range(1, 101))  # 883 characters, over the 400 limit
    with deadline(LINEAR_DEADLINE_S):
        result = verifier.verify("\\boxed{" + long_polynomial + "}", "x^2+1")
    assert result.score == 0.0 and result.info["too_complex"] is True
    assert result.info["reason"] == "too_complex: the answer is 883 characters of non-arithmetic math (limit 400)"
    # a gold as long as the answer raises the limit to twice its length: the same answer against itself
    assert verifier.verify("\\boxed{" + long_polynomial + "}", long_polynomial).correct


def test_evaluate_reads_only_plain_arithmetic():
    assert evaluate("1+2\\cdot 3") == 7 and evaluate("-2^{2}") == -4 and evaluate("\\frac{3}{4}\\div\\frac12") == 1.5
    assert evaluate("0.\\overline{3}+\\frac{2}{3}") == 1                        # 1/3 + 2/3
    for not_arithmetic in ("2(3)", "2 3", "x+1", "\\sqrt{4}", "2^{1/2}", "1,000+1", "1/0", "2^10", ""):
        assert evaluate(not_arithmetic) is None, not_arithmetic
    with pytest.raises(TooComplex):
        evaluate("7^{100000}")                                                  # 280,736 bits > 131,072
    assert evaluate("-" * 5000 + "5") == 5                                      # an even number of signs


# -- the time budget --------------------------------------------------------------------------------
def _spin_sympy(give_up_after_s: float = 30.0) -> None:
    """Pure-Python sympy work that never ends by itself; fails the test if nothing stops it."""
    started, x = time.monotonic(), sympy.Symbol("x")
    while time.monotonic() - started < give_up_after_s:
        sympy.expand((x + 1) ** 3)
    pytest.fail("the time budget did not stop the work")


def test_time_budget_stops_work_in_the_main_thread_and_cleans_up():
    assert threading.current_thread() is threading.main_thread()
    with own_alarm_timer():  # as in a pool worker: nobody else holds SIGALRM, so the budget uses the timer
        with pytest.raises(TooComplex, match="0.2 s time budget"):
            with time_budget(0.2):
                assert signal.getitimer(signal.ITIMER_REAL)[1] > 0  # the timer path, re-firing after the deadline
                _spin_sympy()
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
        with time_budget(0.2):  # work that ends in time is not disturbed
            sympy.expand((sympy.Symbol("y") + 1) ** 2)
    # with SIGALRM taken (here by pytest-timeout) the budget falls back to its watchdog thread
    with pytest.raises(TooComplex, match="0.2 s time budget"):
        with time_budget(0.2):
            assert "math-time-budget" in _watchdog_names()
            _spin_sympy()


def _watchdog_names() -> list:
    return [thread.name for thread in threading.enumerate()]


def test_a_budget_that_ends_in_time_leaves_nothing_behind():
    with time_budget(0.3):  # the watchdog path (pytest-timeout holds SIGALRM here)
        sympy.expand((sympy.Symbol("z") + 1) ** 2)
    for thread in threading.enumerate():  # its watchdog ends when the block does: nothing fires later
        if thread.name == "math-time-budget":
            thread.join(10)
    assert "math-time-budget" not in _watchdog_names()
    assert sum(range(100_000)) == 4_999_950_000  # bytecode runs on: no exception was left pending


def test_time_budget_stops_work_in_another_thread():
    outcome = {}

    def work():
        try:
            with time_budget(0.2):
                _spin_sympy()
        except TooComplex as exc:
            outcome["stopped"] = str(exc)
        outcome["after"] = sum(range(1000))  # the thread runs on normally

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert outcome == {"stopped": "verification ran past its 0.2 s time budget", "after": 499_500}


SLOW = ("\\boxed{(x+y+z+w)^{40}}", "(x+y+z+w)^{39}")  # sympy expands both: about 3 minutes without a budget


def test_a_slow_comparison_scores_too_complex_within_the_budget_in_both_kinds_of_thread():
    verifier = get_verifier("math", time_budget_s=0.5)
    with own_alarm_timer():
        main = verifier.verify(*SLOW)
    found = {}
    thread = threading.Thread(target=lambda: found.setdefault("result", verifier.verify(*SLOW)))
    thread.start()
    thread.join(120)
    assert not thread.is_alive()
    for result in (main, found["result"]):
        assert result.score == 0.0 and result.info["too_complex"] is True
        assert result.info["reason"] == "too_complex: verification ran past its 0.5 s time budget"


def test_time_budget_option_is_checked():
    assert get_verifier("math", time_budget_s=0).time_budget_s is None
    with pytest.raises(ValueError, match="time_budget_s"):
        get_verifier("math", time_budget_s=-1)


def test_a_swallowed_raise_off_the_main_thread_is_raised_again():
    """An asynchronous raise can land where Python swallows it (a weakref callback during garbage collection: the
    fresh-clone CI of 2026-12-04 saw the slow comparison above run 66 s to a plain score that way). The watchdog raises
    again until the block ends: here the block swallows the first raise itself and must still be stopped."""
    from reasonrl.verifiers.math_budget import TooComplex, time_budget

    outcome = {"swallowed": 0}

    def work():
        deadline = time.monotonic() + 30  # without a second raise the block would run to here
        try:
            with time_budget(0.2):
                while time.monotonic() < deadline:
                    try:
                        while time.monotonic() < deadline:
                            sum(range(100))
                    except TooComplex:
                        outcome["swallowed"] += 1
                        if outcome["swallowed"] > 1:
                            raise
        except TooComplex as exc:
            outcome["stopped"] = str(exc)
        outcome["seconds_left"] = deadline - time.monotonic()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert outcome["swallowed"] == 2 and outcome["stopped"] == "verification ran past its 0.2 s time budget"
    assert outcome["seconds_left"] > 20  # stopped about 0.05 s after the first raise, not at the 30 s deadline
