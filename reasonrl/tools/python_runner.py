"""Runs inside the sandbox (standard library only): replay a trajectory's earlier cells silently, then run its new
cell and show what it prints.

Input: ``cells.json`` in the work dir, ``{"cells": [source, ...], "timeout_s": float}``; the last cell is the new one.
Output on stdout: first the line ``MARKER <replay seconds>`` (written before the new cell runs, so the cell cannot
forge it), then the new cell's stdout and stderr together, then, if the cell's last statement is an expression, its
``repr`` (as in a notebook). Exit status: 0 the cell ran, 1 it raised, 3 it ran past ``timeout_s`` (an interval timer
raises in the cell; a cell that swallows it is killed from outside by the sandbox's own limit).
"""
import ast
import json
import linecache
import os
import random
import signal
import sys
import time
import traceback

MARKER = "@@reasonrl-replayed"
CELL_PREFIX = "<cell "
EXIT_RAISED, EXIT_TIMEOUT = 1, 3


class CellTimeout(BaseException):
    """Raised in the new cell when its time is up (a BaseException: ``except Exception`` in the cell won't eat it)."""


def compile_cell(source, index):
    """(code of all statements but a trailing expression, code of that expression or None)."""
    name = f"{CELL_PREFIX}{index}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    tree = ast.parse(source, name)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), name, "eval")
    return compile(tree, name, "exec"), last


def run_cell(source, index, namespace, echo):
    body, last = compile_cell(source, index)
    exec(body, namespace)
    if last is not None:
        value = eval(last, namespace)
        if echo and value is not None:
            print(repr(value))


def report(exc):
    """The traceback from the first frame inside a cell (the runner's own frames are not the model's business)."""
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(CELL_PREFIX):
        tb = tb.tb_next
    sys.stdout.write("".join(traceback.format_exception(type(exc), exc, tb)))


def replay_sink():
    """Where replayed cells write: an unlinked file in the work dir (their output was shown the first time)."""
    try:
        fd = os.open("replay.out", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.unlink("replay.out")
        return fd
    except OSError:
        return os.open(os.devnull, os.O_WRONLY)


def on_alarm(signum, frame):
    raise CellTimeout()


def main():
    with open("cells.json") as f:
        job = json.load(f)
    os.unlink("cells.json")
    cells, timeout = job["cells"], float(job["timeout_s"])
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    random.seed(0)  # replays draw the same numbers
    start = time.monotonic()
    out, sink = os.dup(1), replay_sink()
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    for index, source in enumerate(cells[:-1]):
        os.ftruncate(sink, 0)  # each cell writes into an empty file, as it wrote into an empty stdout the first time,
        os.lseek(sink, 0, os.SEEK_SET)  # so the file-size limit stops a flooding cell at the same point again
        try:
            run_cell(source, index, namespace, echo=False)
        except BaseException:  # it raised the first time too: its effects up to there are the state
            pass
        sys.stdout.flush()
        sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(out, 2)  # the new cell's errors interleave with its prints, as in a terminal
    for fd in (out, sink):
        os.close(fd)
    sys.stdout.write(f"{MARKER} {time.monotonic() - start:.6f}\n")
    sys.stdout.flush()
    status = 0
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        run_cell(cells[-1], len(cells) - 1, namespace, echo=True)
    except CellTimeout:
        status = EXIT_TIMEOUT
    except SystemExit as exc:
        if exc.code not in (None, 0):
            report(exc)
            status = EXIT_RAISED
    except BaseException as exc:
        report(exc)
        status = EXIT_RAISED
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
