"""Bounding the work of one math verification, so that a direct call returns in bounded time.

Two bounds, both in the calling thread (a VerifierPool's kill-on-timeout is a third, outside):

- ``check_expression``: a static budget on a parsed (unevaluated) sympy expression before it is simplified or
  compared: at most ``MAX_NODES`` nodes, and every power, factorial and binomial small enough to compute.
  ``2^{2^{2^{2^{2^{2}}}}}`` is ``2^(2^65536)``: sympy evaluates it as one big-integer power inside C, which
  no timer or signal can interrupt, so such an answer is refused before sympy sees it. The check estimates
  the size in bits of every numeric subexpression from its parts (never computing it).
- ``time_budget``: a wall-clock limit on the sympy phase, for the slow cases the static budget lets through
  (simplifying a long expression). In the main thread it uses an interval timer (``SIGALRM``), as long as
  nobody else holds one; elsewhere a watchdog thread makes the budgeted thread raise at the deadline. Either
  way the work is stopped by raising ``TooComplex``, a ``BaseException``, so sympy's and math-verify's
  ``except Exception`` blocks do not swallow it.
"""
from __future__ import annotations

import ctypes
import math
import signal
import threading
from typing import Any, Optional

MAX_NODES = 600
"""Most nodes a parsed answer may have (a sum of about 150 products); more is ``too_complex``."""
MAX_BITS = 1 << 17
"""Largest number, in bits (about 40,000 digits), that an exact subexpression may evaluate to."""
MAX_SYMBOLIC_EXPONENT = 10_000
"""Largest integer exponent of a non-numeric base (``(x+1)^{n}`` is expanded by simplification)."""
MAX_TERMS = 10_000
"""Most terms of a ``\\sum``/``\\prod`` with numeric limits (sympy adds them one by one)."""
MAX_DEPTH = 100
"""Deepest nesting of a parsed answer."""
_TIMER_REFIRE_S = 0.05
"""After the deadline the timer fires again at this interval, in case one raise is caught and dropped."""


class TooComplex(BaseException):
    """The answer needs more work than the verifier allows; ``str(exc)`` says which budget it exceeded.

    A ``BaseException`` so that the ``except Exception`` blocks of sympy and math-verify let it through.
    """


def _bits_of_number(expr: Any) -> Optional[float]:
    """log2 of the size of an explicit sympy number (at least 1), or None when ``expr`` is not one."""
    import sympy

    if isinstance(expr, sympy.Rational):  # integers included
        return max(_log2(int(expr.p)), _log2(int(expr.q)), 1.0)
    if isinstance(expr, sympy.Float):
        value = float(expr)
        return max(abs(math.frexp(value)[1]), 1.0) if math.isfinite(value) else None
    if expr in (sympy.pi, sympy.E, sympy.I):
        return 2.0
    return None


def _log2(n: int) -> float:
    """log2 of ``|n|`` (0 for 0 and 1), exact enough for sizes."""
    n = abs(n)
    return math.log2(n) if 0 < n < (1 << 1000) else float(n.bit_length())


def _value_bound(expr: Any, bits: Optional[float]) -> Optional[float]:
    """An upper bound on ``|expr|`` given its size in bits; None when it is unknown or over 2^60."""
    import sympy

    if isinstance(expr, sympy.Rational) and abs(expr) < 2 ** 60:
        return float(abs(expr))
    if bits is None or bits > 60:
        return None
    return 2.0 ** bits


def _size_bits(expr: Any, depth: int, counter: list) -> Optional[float]:
    """log2 of an upper bound on ``|expr|`` when it is a number built from numbers, else None.

    Raises ``TooComplex`` when the expression has too many nodes or nests too deep, or when a power, a
    factorial or a binomial coefficient in it is too large to compute.
    """
    import sympy

    counter[0] += 1
    if counter[0] > MAX_NODES:
        raise TooComplex(f"the expression has more than {MAX_NODES} parts")
    if depth > MAX_DEPTH:
        raise TooComplex(f"the expression nests deeper than {MAX_DEPTH} levels")
    if not isinstance(expr, sympy.Basic):
        return None
    own = _bits_of_number(expr)
    if own is not None:
        return own
    args = expr.args
    child_bits = [_size_bits(arg, depth + 1, counter) for arg in args]
    if isinstance(expr, sympy.Pow) and len(args) == 2:
        return _power_bits(args, child_bits)
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma)) and args:
        if child_bits[0] is None:
            return None
        bound = _value_bound(args[0], child_bits[0])
        size = None if bound is None else max(bound * math.log2(max(bound, 2.0)), 1.0)
        if size is None or size > MAX_BITS:
            raise TooComplex("a factorial is too large to compute exactly")
        return size
    if isinstance(expr, sympy.binomial) and len(args) == 2:
        if child_bits[0] is None:
            return None
        bound = _value_bound(args[0], child_bits[0])
        if bound is None or bound > MAX_BITS:
            raise TooComplex("a binomial coefficient is too large to compute exactly")
        return max(bound, 1.0)
    if isinstance(expr, (sympy.Sum, sympy.Product)) and len(args) >= 2:
        for limits in args[1:]:  # (k, start, end); the ends were checked above, so float() is cheap
            if len(limits.args) == 3 and all(end.is_number for end in limits.args[1:]):
                try:
                    terms = abs(float(limits.args[2]) - float(limits.args[1]))
                except (TypeError, ValueError, OverflowError):
                    continue
                if terms > MAX_TERMS:
                    raise TooComplex(f"a sum or product of more than {MAX_TERMS} terms")
        return None
    if not args or any(bits is None for bits in child_bits):
        return None
    if isinstance(expr, sympy.Mul):
        return sum(child_bits)
    if isinstance(expr, sympy.Add):
        return max(child_bits) + math.log2(len(child_bits))
    return max(child_bits)  # functions of numbers (sqrt, sin, log, ...): no bigger than their arguments here


def _power_bits(args: tuple, child_bits: list) -> Optional[float]:
    """The size of ``base ** exponent`` (see ``_size_bits``)."""
    import sympy

    (base, exponent), (base_bits, exponent_bits) = args, child_bits
    if exponent_bits is None:  # a symbolic exponent: nothing is computed
        return None
    exponent_bound = _value_bound(exponent, exponent_bits)
    if base_bits is not None:  # a number to a numeric power: about bits(base) * exponent bits
        if base in (sympy.S.Zero, sympy.S.One, sympy.S.NegativeOne):
            return 1.0
        if exponent_bound is None or base_bits * exponent_bound > MAX_BITS:
            raise TooComplex("a power is too large to compute exactly")
        return max(base_bits * exponent_bound, 1.0)
    if exponent_bound is None or exponent_bound > MAX_SYMBOLIC_EXPONENT:
        raise TooComplex(f"an exponent of a non-numeric base is over {MAX_SYMBOLIC_EXPONENT}")
    return None


def check_expression(expr: Any) -> None:
    """Raise ``TooComplex`` when the parsed answer ``expr`` (or a list/tuple/set of them) is over budget."""
    counter = [0]
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif not isinstance(item, str):
            _size_bits(item, 0, counter)


def _can_use_timer() -> bool:
    """The interval timer is ours to use: main thread, default SIGALRM handler, no timer running."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return False
    return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None) and signal.getitimer(signal.ITIMER_REAL)[0] == 0


class _Expired(TooComplex):
    """What the watchdog thread raises in the budgeted thread (an exception class, so it carries no message)."""

    def __str__(self) -> str:
        return "verification ran past its time budget"


def _raise_in_thread(thread_id: int, exception: Optional[type]) -> None:
    """Make ``thread_id`` raise ``exception`` at its next bytecode; None cancels a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exception) if exception is not None else None)


class time_budget:  # noqa: N801  (used like a function: ``with time_budget(5): ...``)
    """``with time_budget(seconds):`` raises ``TooComplex`` in the calling thread when the block runs longer than
    ``seconds`` (None or 0: no limit).

    In the main thread, when SIGALRM is free, an interval timer whose handler raises (and fires again every
    ``_TIMER_REFIRE_S`` in case one raise is swallowed); it never raises inside ``__exit__``, which disarms
    first. Elsewhere a watchdog thread waits for the deadline and then makes the budgeted thread raise
    (``PyThreadState_SetAsyncExc``), again every ``_TIMER_REFIRE_S`` until the block ends; ``__exit__`` cancels it,
    or a raise it already requested. Neither costs
    anything while the work runs. Pure-Python work is interrupted between bytecodes; a single long C call (a
    huge integer power) is not, which is what ``check_expression`` is for.
    """

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = float(seconds) if seconds and seconds > 0 else None
        self.armed = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._fired = False
        self._thread_id = 0
        self._previous_handler: Any = None
        self._uses_timer = False

    def __enter__(self) -> "time_budget":
        if self.seconds is None:
            return self
        self._uses_timer = _can_use_timer()
        self.armed = True
        if self._uses_timer:
            self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.seconds, _TIMER_REFIRE_S)
        else:
            self._thread_id = threading.get_ident()
            threading.Thread(target=self._watch, name="math-time-budget", daemon=True).start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        if self.seconds is None:
            return False
        if self._uses_timer:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            signal.signal(signal.SIGALRM, self._previous_handler)
        else:
            with self._lock:
                self.armed = False
                if self._fired:  # requested but perhaps not raised yet: cancel it
                    _raise_in_thread(self._thread_id, None)
            self._done.set()
        if isinstance(exc, _Expired):
            raise TooComplex(self._message()) from None
        return False

    def _message(self) -> str:
        return f"verification ran past its {self.seconds:g} s time budget"

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.armed and (frame is None or frame.f_code is not _EXIT_CODE):
            raise TooComplex(self._message())

    def _watch(self) -> None:
        wait = self.seconds
        while not self._done.wait(wait):
            with self._lock:
                if not self.armed:
                    return
                self._fired = True
                _raise_in_thread(self._thread_id, _Expired)
            # Again every _TIMER_REFIRE_S, as the timer does: an asynchronous raise that lands where Python swallows
            # it (a weakref callback run by the garbage collector, a __del__) would otherwise leave the work unbounded.
            wait = _TIMER_REFIRE_S


_EXIT_CODE = time_budget.__exit__.__code__
