"""Runs inside the sandbox (standard library only): replay a trajectory's earlier cells silently, then run its new
cell and report what it printed and how it ended.

Two processes. The runner draws a random key, then forks; the child is *the program*: it runs the cells (the
replayed ones with stdout and stderr in a discarded file), and tells the parent over a control socket when it starts
replaying each cell, when the replay is done (passing with that message the read end of a pipe it opens only then for
the new cell's stdout and stderr) and when the new cell returned. Each control message starts with the key, which
exists only in the two processes' memory, drawn before any cell ran and never written to a file or descriptor the
program can read: a message without it (whatever a cell writes to the socket, however it guesses) is ignored. The
parent, *the supervisor*, never runs model code: it marks itself non-dumpable (so the program cannot open its
descriptors or memory through ``/proc``), reads a per-call nonce from stdin after the fork (so the program never had
it), enforces the new cell's time limit by killing the program, and is the only writer of the sandbox's stdout, where
every line it writes starts with the nonce:

    <nonce> started <index>         as each replayed cell starts (so a replay that dies names the cell it died in)
    <nonce> replayed <seconds>      as soon as the replay is done (so a supervisor killed later still tells that)
    <nonce> result <json>           at the end: {"status", "code", "cell_s", "head", "tail", "dropped", "started"}

``status``: ``ok``, ``raised`` (an exception, ``SystemExit`` included), ``timeout``, ``exited`` (the program ended
without returning from the cell: ``os._exit``, its control pipe closed), ``killed`` (a signal; ``code`` is minus the
signal number) or ``replay_failed`` (the program died before the new cell started; ``started``: the replayed cell
it died in, -1 when none had started). ``head``/``tail``: the first and
last bytes of what the new cell printed, ``dropped`` bytes left out between them. Nothing the program prints or
writes is read as the protocol: the control socket is none of its output streams, a message on it without the key
is ignored, and the output pipe does not exist while earlier cells replay.

Input: ``cells.json`` in the work dir, ``{"cells": [source, ...], "timeout_s": float, "keep_bytes": int}``; the last
cell is the new one. The nonce line comes on stdin.
"""
import ast
import json
import linecache
import os
import random
import select
import signal
import _socket  # not socket.py: it imports enum and selectors, ~8 ms per call of start-up
import array
import sys
import time
import traceback

CELL_PREFIX = "<cell "
READ_CHUNK = 65536
DRAIN_READS = 64  # after the program exits: at most this many reads of what is left in the pipes


# ---------------------------------------------------------------------------------------------- the program's side
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


def report(exc, fd):
    """The traceback from the first frame inside a cell (the runner's own frames are not the model's business),
    written straight to ``fd`` (the cell may have replaced or closed ``sys.stdout``)."""
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(CELL_PREFIX):
        tb = tb.tb_next
    write_all(fd, "".join(traceback.format_exception(type(exc), exc, tb)).encode("utf-8", "replace"))


def write_all(fd, data):
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the cell closed it: nothing more to say there
        pass


def replay_sink():
    """Where replayed cells write: an unlinked file in the work dir (their output was shown the first time)."""
    try:
        fd = os.open("replay.out", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.unlink("replay.out")
        return fd
    except OSError:
        return os.open(os.devnull, os.O_WRONLY)


def flush_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a closed or replaced stream
            pass


def tell(control, key, text, fds=()):
    """One control message to the supervisor, with the key in front (and descriptors attached, SCM_RIGHTS)."""
    message = f"{key} {text}".encode()
    if fds:
        send_fds(control, message, fds)
    else:
        control.send(message)


def program(cells, control, key):
    """The forked child: replay, then open the new cell's output pipe and hand its read end to the supervisor with
    the word that the replay is done, wait until the supervisor has passed that on (so the new cell cannot stop it
    before it did), run the new cell, say how it ended. Never returns.

    During the replay the program holds no descriptor the supervisor reads output from (only the control socket,
    where a message the runner does not send is ignored), so nothing a replayed cell writes can be shown."""
    try:
        os.setpgid(0, 0)  # the supervisor kills the whole group at the time limit
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the supervisor's stdin (the nonce) is not the program's
        os.close(devnull)
        sink = replay_sink()
        os.dup2(sink, 1)  # the sandbox's stdout and stderr are gone from this process from here on
        os.dup2(sink, 2)
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        random.seed(0)  # replays draw the same numbers
        start = time.monotonic()
        for index, source in enumerate(cells[:-1]):
            tell(control, key, f"start {index}")  # a replay that dies from here on dies in this cell (or later)
            control.recv(16)  # the supervisor has written the started line: a cell that kills it cannot undo that
            os.ftruncate(sink, 0)  # each cell writes into an empty file, as it wrote into an empty stdout the first
            os.lseek(sink, 0, os.SEEK_SET)  # time, so the file-size limit stops a flooding cell at the same point
            try:
                run_cell(source, index, namespace, echo=False)
            except BaseException:  # it raised the first time too: its effects up to there are the state
                pass
            flush_streams()
        os.dup2(sink, 1)  # a replayed cell may have closed them: the pipe must not take their numbers
        os.dup2(sink, 2)
        out_r, out_w = os.pipe()
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)  # the new cell's errors interleave with its prints, as in a terminal
        os.close(sink)
        tell(control, key, f"replayed {time.monotonic() - start:.6f}", [out_r])
        os.close(out_r)
        control.recv(16)  # the supervisor has written the replayed line
        status = "ok"
        try:
            run_cell(cells[-1], len(cells) - 1, namespace, echo=True)
        except BaseException as exc:  # SystemExit too: a cell that tries to end the interpreter failed
            flush_streams()
            report(exc, out_w)
            status = "raised"
        flush_streams()
        if not same_file(1, out_w):
            write_all(out_w, b"OSError: the code closed its standard output\n")
            status = "raised"
        tell(control, key, f"done {status}")
    finally:
        os._exit(0)


def same_file(fd, other):
    try:
        a, b = os.fstat(fd), os.fstat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def send_fds(sock, message, fds):
    """One message with descriptors attached (SCM_RIGHTS)."""
    sock.sendmsg([message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])


def recv_fds(sock, size, max_fds):
    """(message, descriptors that came with it)."""
    fds = array.array("i")
    msg, ancdata, _, _ = sock.recvmsg(size, _socket.CMSG_LEN(max_fds * fds.itemsize))
    for level, kind, data in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds)


# ------------------------------------------------------------------------------------------- the supervisor's side
def make_undumpable():
    """prctl(PR_SET_DUMPABLE, 0): same-uid processes can no longer ptrace us or open /proc/<pid>/fd, mem."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0
    except Exception:
        return False


class Capture:
    """The first and the last ``keep`` bytes of a stream, and how many bytes between them were left out."""

    def __init__(self, keep):
        self.keep, self.head, self.tail, self.dropped = keep, bytearray(), bytearray(), 0

    def add(self, data):
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.keep:
            self.dropped += len(self.tail) - self.keep
            del self.tail[:len(self.tail) - self.keep]


def read_line(fd):
    """One line from ``fd`` (the nonce), read byte by byte so nothing after it is consumed."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode("ascii", "replace").strip()


def kill_program(pid):
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def drain(fd, sink):
    """What is left in a pipe after the program ended (a stray child may still write: bounded)."""
    for _ in range(DRAIN_READS):
        try:
            os.set_blocking(fd, False)
            data = os.read(fd, READ_CHUNK)
        except OSError:  # empty for now (BlockingIOError), or not readable
            return
        if not data:
            return
        sink(data)


def supervise(pid, control, key, timeout, keep):
    """Watch the program; return (nonce, status, exit code or None, the new cell's seconds, its output Capture, the
    last replayed cell that started or -1)."""
    nonce = read_line(0)
    pidfd = os.pidfd_open(pid)
    output = Capture(keep)
    state = {"replayed_at": None, "deadline": None, "done": None, "started": -1}
    streams = {}

    def acknowledge():
        try:
            control.send(b"!")
        except OSError:  # the program is gone already
            pass

    def on_control():
        try:
            msg, fds = recv_fds(control, 256, 4)
        except BlockingIOError:
            raise
        except OSError:
            msg, fds = b"", []
        if not msg and not fds:
            del streams[control.fileno()]  # the program closed it
            return
        tag, _, text = msg.decode("ascii", "replace").partition(" ")
        word, _, arg = text.partition(" ")
        if tag != key:  # not the runner's: whatever it says, and whatever it carries, is dropped
            word = ""
        if word == "start" and state["replayed_at"] is None and arg == str(state["started"] + 1):
            state["started"] += 1
            emit(nonce, f"started {state['started']}")
            acknowledge()
            return
        if word == "replayed" and len(fds) == 1 and state["replayed_at"] is None:
            state["replayed_at"] = time.monotonic()
            state["deadline"] = state["replayed_at"] + timeout
            streams[fds[0]] = output.add
            emit(nonce, f"replayed {arg.strip()}")
            acknowledge()
            return
        for fd in fds:  # anything else is not the runner's: ignored
            os.close(fd)
        if word == "done" and arg in ("ok", "raised") and state["replayed_at"] is not None:
            state["done"] = arg

    streams[control.fileno()] = None
    timed_out = False
    while True:
        deadline = state["deadline"]
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select(list(streams) + [pidfd], [], [], wait)
        if deadline is not None and time.monotonic() >= deadline and pidfd not in ready:  # the new cell's time is up
            kill_program(pid)
            timed_out = True
            break
        for fd in ready:
            if fd == pidfd or fd not in streams:
                continue
            if fd == control.fileno():
                on_control()
                continue
            try:
                data = os.read(fd, READ_CHUNK)
            except OSError:  # not a readable pipe after all
                data = b""
            if data:
                streams[fd](data)
            else:
                del streams[fd]
        if pidfd in ready:
            break
    _, wait_status = os.waitpid(pid, 0)
    kill_program(pid)  # its stray children, if any are in its group
    for fd in list(streams):
        if fd == control.fileno():
            control.setblocking(False)
            for _ in range(DRAIN_READS):
                try:
                    on_control()
                except (BlockingIOError, KeyError):
                    break
                if fd not in streams:
                    break
        else:
            drain(fd, streams[fd])
    replayed_at, done = state["replayed_at"], state["done"]
    code = None if timed_out else os.waitstatus_to_exitcode(wait_status)
    cell_s = 0.0 if replayed_at is None else (timeout if timed_out else time.monotonic() - replayed_at)
    if replayed_at is None:
        status = "replay_failed"
    elif timed_out:
        status = "timeout"
    elif code != 0 or done is None:
        status = "killed" if code is not None and code < 0 else "exited"
    else:
        status = done
    return nonce, status, code, cell_s, output, state["started"]


def emit(nonce, text):
    write_all(1, f"{nonce} {text}\n".encode("utf-8", "replace"))


def main():
    with open("cells.json") as f:
        job = json.load(f)
    os.unlink("cells.json")
    cells, timeout, keep = job["cells"], float(job["timeout_s"]), int(job["keep_bytes"])
    key = os.urandom(16).hex()  # before the fork, so both processes have it and no cell ever ran where it was drawn
    make_undumpable()  # before the fork: the program's process is never one that may read ours
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1 (bwrap) a default disposition makes it immune
    control, program_end = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        control.close()
        program(cells, program_end, key)
    program_end.close()
    nonce, status, code, cell_s, output, started = supervise(pid, control, key, timeout, keep)
    head, tail = (output.head, output.tail) if output.dropped else (output.head + output.tail, b"")
    result = {"status": status, "code": code, "cell_s": round(cell_s, 6), "dropped": output.dropped,
              "started": started, "head": head.decode("utf-8", "replace"), "tail": tail.decode("utf-8", "replace")}
    emit(nonce, "result " + json.dumps(result))
    os._exit(0)


if __name__ == "__main__":
    main()
