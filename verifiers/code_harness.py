"""The test harness that runs inside a sandbox: ``python3 -I -S harness.py`` in a work dir holding ``solution.py``.

Standard library only; it is copied into the sandbox as a file and is never imported by the verifier.

Trust model. Two processes:

* the **judge** (this script's first process) never runs a line of the untrusted program. It forks the
  **candidate** process first, and only then reads the task from stdin: the tests, the expected values and a
  per-run secret never exist in the candidate's memory. It marks itself non-dumpable, so a process of the same
  uid can neither ptrace it nor open its ``/proc/<pid>/fd`` or ``mem``.
* the **candidate** closes stdin, points stdout/stderr at a file, keeps only its two RPC pipes, then executes
  ``solution.py``. From then on it only answers calls: "call function NAME with these plain arguments". Arguments
  and return values cross as tagged JSON holding plain built-in values (int, float, str, list, tuple, dict, set,
  ...), so an object whose ``__eq__`` always says True cannot reach the judge: the judge compares real values.

The judge evaluates every test itself (with pristine builtins and modules, stubs in place of the program's
functions) and, after the last test or the deadline, writes exactly one line to *its own* stdout::

    @@REASONRL-VERDICT <secret> <json>

The candidate cannot write to that stream (it holds no descriptor for it) and cannot end it early: exiting,
``sys.exit(0)``, ``os._exit(0)``, printing fake lines, or killing the judge all lead to failed tests or to no
verdict at all, which the verifier scores as 0. Policy: a program that attacks the harness scores 0, even if it
then returns the right answers. Any signal that reaches the judge ends it (SIGINT included), and the judge is
reachable on every sandbox: where the harness starts as PID 1 of a pid namespace (bwrap), which the kernel
shields from signals sent from inside, that process only waits and the judge runs as its child
(:func:`warden_main`).

stdin (JSON): ``secret``, ``kind`` ("asserts": each test is a statement; "check": ``tests[0]`` defines
``check(candidate)``), ``tests``, ``imports`` (statements run before the tests), ``entry_point``, ``deadline_s``.
"""
import _signal
import builtins
import os
import select
import sys
import time

VERDICT_TAG = "@@REASONRL-VERDICT"
MAX_MESSAGE = 32 << 20  # largest RPC message the judge accepts from the candidate, bytes
OUTPUT_FILE = "candidate_output.txt"
REQ_FD, RESP_FD = 3, 4  # the candidate's ends of the two pipes after it rearranges its descriptors
TIME_LIMIT = "time limit reached"


# ----------------------------------------------------------------------------------------------------------------
# plain-value codec (tagged JSON). The candidate encodes, the judge decodes into fresh built-in objects.

def encode(value, depth=0):
    """Turn a plain value into JSON-able data; anything else raises TypeError."""
    if depth > 200:
        raise TypeError("value nested too deeply")
    d = depth + 1
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return ["i", str(int(value))]
    if isinstance(value, float):
        return ["f", float.__repr__(float(value))]
    if isinstance(value, complex):
        return ["c", float.__repr__(value.real), float.__repr__(value.imag)]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return ["b" if isinstance(value, bytes) else "ba", bytes(value).decode("latin-1")]
    if isinstance(value, list):
        return ["l", [encode(v, d) for v in list.__iter__(value)]]
    if isinstance(value, tuple):
        return ["t", [encode(v, d) for v in tuple.__iter__(value)]]
    if isinstance(value, dict):
        return ["d", [[encode(k, d), encode(v, d)] for k, v in dict.items(value)]]
    if isinstance(value, (set, frozenset)):
        return ["s" if isinstance(value, set) else "fs", [encode(v, d) for v in value]]
    if isinstance(value, range):
        return ["r", value.start, value.stop, value.step]
    if hasattr(type(value), "__next__") and iter(value) is value:  # map, filter, zip, generators, ...
        return ["it", [encode(v, d) for v in value]]
    # Any other object crosses as an opaque token that keeps only its type name and truthiness (so that
    # ``assert re.search(...)`` style tests work); the judge compares such tokens by identity only.
    return ["o", type(value).__name__[:100], bool(value)]


class Opaque:
    """Stands in for a non-plain object the program returned: truthy or not, equal only to itself."""

    __slots__ = ("type_name", "truth")

    def __init__(self, type_name, truth):
        self.type_name, self.truth = str(type_name), truth is True

    def __bool__(self):
        return self.truth

    def __repr__(self):
        return f"<{self.type_name} object from the program>"


def decode(data):
    """Inverse of :func:`encode`, building only built-in objects; raises ValueError on anything malformed."""
    if data is None or type(data) in (bool, str):
        return data
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError("malformed value")
    tag, rest = data[0], data[1:]
    if tag == "i":
        return int(rest[0])
    if tag == "f":
        return float(rest[0])
    if tag == "c":
        return complex(float(rest[0]), float(rest[1]))
    if tag in ("b", "ba"):
        raw = rest[0].encode("latin-1")
        return raw if tag == "b" else bytearray(raw)
    if tag in ("l", "t", "s", "fs", "it"):
        items = [decode(v) for v in rest[0]]
        return {"l": list, "t": tuple, "s": set, "fs": frozenset, "it": iter}[tag](items)
    if tag == "d":
        return {decode(k): decode(v) for k, v in rest[0]}
    if tag == "r":
        return range(int(rest[0]), int(rest[1]), int(rest[2]))
    if tag == "o":
        return Opaque(rest[0], rest[1])
    raise ValueError(f"unknown tag {tag!r}")


# ----------------------------------------------------------------------------------------------------------------
# JSON through the C accelerator directly: the ``json`` package imports ``re`` (and with it enum, functools,
# collections...), which would cost more start-up time than the rest of the judge.

def _no_constants(name):
    raise ValueError(f"{name} is not allowed")


def _not_serializable(obj):
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


try:
    import _json

    class _ScanContext:
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = staticmethod(_no_constants)

    _scan = _json.make_scanner(_ScanContext())
    _encode = _json.make_encoder(None, _not_serializable, _json.encode_basestring_ascii, None, ":", ",", False, False,
                                 False)

    def json_dumps(obj):
        """Compact JSON text of ``obj`` (plain JSON types only)."""
        return "".join(_encode(obj, 0))

    def json_loads(text):
        """Parse JSON text; ValueError on anything malformed or trailing."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            raise ValueError("malformed JSON") from None
        if text[end:].strip():
            raise ValueError("trailing data after JSON")
        return value
except (ImportError, AttributeError, TypeError):  # pragma: no cover - an interpreter without the accelerator
    import json as _json_module

    def json_dumps(obj):
        return _json_module.dumps(obj, separators=(",", ":"))

    def json_loads(text):
        return _json_module.loads(text)


# ----------------------------------------------------------------------------------------------------------------
# framing: 4-byte big-endian length + UTF-8 JSON

def _frame(obj):
    body = json_dumps(obj).encode()
    return len(body).to_bytes(4, "big") + body


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# ----------------------------------------------------------------------------------------------------------------
# the candidate process

def candidate_main(req_fd, resp_fd):
    """Runs in the forked child: load solution.py, then answer calls until the judge closes the pipe."""
    try:
        os.setsid()
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # the program's own SIGINT behaves as usual
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(req_fd, REQ_FD)
        os.dup2(resp_fd, RESP_FD)
        os.closerange(RESP_FD + 1, 1 << 16)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
    except BaseException:  # pragma: no cover - setup failure
        os._exit(70)


    def send_all(obj):
        data = _frame(obj)
        while data:
            data = data[os.write(RESP_FD, data):]

    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    before = set(namespace)
    try:
        with open("solution.py", encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), namespace)
        names = {}
        for name, value in list(namespace.items()):
            if name in before or name.startswith("__"):
                continue
            if type(value).__name__ == "module":
                names[name] = ["module", str(getattr(value, "__name__", ""))]
            elif callable(value):
                names[name] = None
            else:
                try:
                    names[name] = encode(value)
                except Exception:
                    pass
        send_all(["ready", names])
    except BaseException as exc:  # noqa: BLE001 - the program may raise anything, SystemExit included
        try:
            send_all(["load_error", type(exc).__name__, str(exc)[:2000], _tail(exc)])
        finally:
            os._exit(0)
    while True:
        try:
            size = int.from_bytes(_read_exact(REQ_FD, 4), "big")
            name, args, kwargs = json_loads(_read_exact(REQ_FD, size))
        except BaseException:
            os._exit(0)
        try:
            result = namespace[name](*[decode(a) for a in args], **{k: decode(v) for k, v in kwargs.items()})
            reply = ["ok", encode(result)]
        except BaseException as exc:  # noqa: BLE001
            reply = ["err", type(exc).__name__, str(exc)[:2000], _tail(exc)]
        try:
            send_all(reply)
        except BaseException:
            os._exit(0)


def _tail(exc):
    import traceback  # only on the error path: it imports a lot

    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines)[-1500:]


# ----------------------------------------------------------------------------------------------------------------
# the judge

class CandidateError(Exception):
    """The program raised an exception that has no built-in counterpart, or returned a non-plain value."""


class CandidateGone(BaseException):
    """The candidate process exited, broke the protocol or ran out of time; no further calls can succeed."""


class Judge:
    """Owns the candidate process and turns calls from test code into RPCs with a deadline."""

    def __init__(self, pid, req_w, resp_r, deadline):
        self.pid, self.req_w, self.resp_r, self.deadline = pid, req_w, resp_r, deadline
        self.gone = None  # reason string once the candidate cannot answer any more
        self.timed_out = False  # the deadline passed while waiting on the candidate
        os.set_blocking(req_w, False)

    def _remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._give_up(TIME_LIMIT)
        return left

    def _give_up(self, reason):
        if self.gone is None:
            self.gone = reason
            self.timed_out = reason == TIME_LIMIT
        raise CandidateGone(self.gone)

    def _recv_exact(self, n):
        chunks = []
        while n:
            if not select.select([self.resp_r], [], [], self._remaining())[0]:
                self._give_up(TIME_LIMIT)
            chunk = os.read(self.resp_r, min(n, 1 << 20))
            if not chunk:
                self._give_up("the program's process exited")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv(self):
        size = int.from_bytes(self._recv_exact(4), "big")
        if size > MAX_MESSAGE:
            self._give_up("the program sent an oversized reply")
        try:
            message = json_loads(self._recv_exact(size))
        except ValueError:
            self._give_up("the program broke the reply protocol")
        if type(message) is not list or not message or type(message[0]) is not str:
            self._give_up("the program broke the reply protocol")
        return message

    def send(self, obj):
        data = _frame(obj)
        while data:
            if not select.select([], [self.req_w], [], self._remaining())[1]:
                self._give_up(TIME_LIMIT)
            try:
                data = data[os.write(self.req_w, data):]
            except BrokenPipeError:
                self._give_up("the program's process exited")

    def call(self, name, args, kwargs):
        if self.gone is not None:
            raise CandidateGone(self.gone)
        try:
            payload = [name, [encode(a) for a in args], {str(k): encode(v) for k, v in kwargs.items()}]
        except TypeError as exc:
            raise TypeError(f"cannot pass argument to the program: {exc}") from None
        self.send(payload)
        reply = self.recv()
        if reply[0] == "ok" and len(reply) == 2:
            try:
                return decode(reply[1])
            except (ValueError, TypeError, IndexError, KeyError, RecursionError, OverflowError) as exc:
                self._give_up(f"the program sent a malformed value ({exc})")
        if reply[0] == "err" and len(reply) == 4 and all(type(x) is str for x in reply[1:]):
            exc_type = getattr(builtins, reply[1], None)
            message = reply[2]
            error = None
            if isinstance(exc_type, type) and issubclass(exc_type, Exception) and exc_type.__module__ == "builtins":
                try:
                    error = exc_type(message)
                except Exception:  # a type whose constructor wants other arguments (UnicodeDecodeError, ...)
                    error = None
            # raised outside the try: a TypeError the program raised must reach the test as a TypeError
            raise error if error is not None else CandidateError(f"{reply[1]}: {message}")
        self._give_up("the program broke the reply protocol")

    def stub(self, name):
        def program_function(*args, **kwargs):
            return self.call(name, args, kwargs)
        program_function.__name__ = program_function.__qualname__ = name
        return program_function

    def kill(self):
        try:
            os.killpg(self.pid, 9)  # SIGKILL; the signal module imports enum
        except OSError:
            pass
        try:
            os.kill(self.pid, 9)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass


def _make_undumpable():
    """prctl(PR_SET_DUMPABLE, 0): same-uid processes can no longer ptrace us or open /proc/<pid>/fd, mem, environ."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0
    except Exception:
        return False


_NO_IMPORT = {"antigravity", "this", "webbrowser", "turtle", "tkinter", "idlelib", "pydoc", "__hello__", "__phello__"}


def _stdlib_module(name):
    """The judge's own copy of a standard-library module the program imported (tests may use it, e.g. ``sys``)."""
    if type(name) is not str or name.split(".")[0] not in sys.stdlib_module_names or name.split(".")[0] in _NO_IMPORT:
        return None
    try:
        import importlib
        return importlib.import_module(name)
    except Exception:
        return None


def _describe(exc, source):
    if isinstance(exc, AssertionError):
        return f"assertion failed: {source.strip()[:300]}" + (f" ({exc})" if str(exc) else "")
    return f"{type(exc).__name__}: {str(exc)[:500]}"


def judge_main():
    protected = _make_undumpable()
    # Python turns SIGINT into KeyboardInterrupt, which a test's ``except BaseException`` would absorb: a program
    # that signals the judge could then fail one test and pass the rest. Like any other signal, it ends the judge.
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    start = time.monotonic()
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        os.close(resp_r)
        candidate_main(req_r, resp_w)
        os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    task = json_loads(sys.stdin.read())  # read only now: the candidate never had it in memory
    secret = str(task["secret"])
    tests = list(task["tests"])
    deadline = start + float(task.get("deadline_s", 10.0))
    judge = Judge(pid, req_w, resp_r, deadline)
    verdict = {"protected": protected, "results": [], "load_error": None}

    namespace = {"__name__": "__test__", "__builtins__": builtins}
    try:
        ready = judge.recv()
        if ready[0] == "load_error":
            verdict["load_error"] = f"{ready[1]}: {ready[2]}" if len(ready) > 2 else "error"
            judge.gone = "the program failed to load"
        elif ready[0] == "ready" and len(ready) == 2 and type(ready[1]) is dict:
            for name, value in ready[1].items():
                if value is None:
                    namespace[str(name)] = judge.stub(name)
                elif type(value) is list and len(value) == 2 and value[0] == "module":
                    module = _stdlib_module(value[1])
                    if module is not None:
                        namespace[str(name)] = module
                else:
                    namespace[str(name)] = decode(value)
        else:
            judge._give_up("the program broke the reply protocol")
    except (CandidateGone, ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        judge.gone = judge.gone or f"the program did not load ({exc})"
    verdict["load_s"] = round(time.monotonic() - start, 4)

    if task.get("kind") == "check":
        entry = str(task.get("entry_point") or "")
        setup_sources = list(task.get("imports") or []) + [tests[0]]
        tests = [f"check({entry})"]
        if entry not in namespace:
            judge.gone = judge.gone or f"the program does not define {entry!r}"
    else:
        setup_sources = list(task.get("imports") or [])
    setup_error = None
    for source in setup_sources:
        try:
            exec(compile(source, "<test setup>", "exec"), namespace)
        except BaseException as exc:  # noqa: BLE001 - a broken test setup fails every test, it does not crash us
            setup_error = f"test setup failed: {type(exc).__name__}: {exc}"
    for i, source in enumerate(tests):
        result = {"test": source[:300], "passed": False}
        if setup_error or judge.gone:
            result["error"] = setup_error or f"not run: {judge.gone}"
        else:
            try:
                exec(compile(source, f"<test {i}>", "exec"), namespace)
                result["passed"] = True
            except CandidateGone as exc:
                result["error"] = str(exc)
            except BaseException as exc:  # noqa: BLE001
                result["error"] = _describe(exc, source)
        verdict["results"].append(result)
    judge.kill()
    try:
        with open(OUTPUT_FILE, "rb") as f:
            verdict["output"] = f.read(2000).decode("utf-8", "replace")
    except OSError:
        verdict["output"] = ""
    verdict["timed_out"] = judge.timed_out
    verdict["elapsed_s"] = round(time.monotonic() - start, 4)
    sys.stdout.write(f"{VERDICT_TAG} {secret} {json_dumps(verdict)}\n")
    sys.stdout.flush()


def warden_main():
    """Run the judge as a child when this process is PID 1 of its pid namespace (bwrap ``--as-pid-1``).

    The kernel drops any signal sent to a namespace's PID 1 from inside it, so as PID 1 the judge would survive a
    program that tries to kill or stop it, and the program would score as if it had not tried. The policy is the
    same on every sandbox: a program that attacks the harness scores 0. So PID 1 only waits: the judge is its
    child, killable exactly as under Docker (where the judge is an ordinary process), and an attack on it leaves
    no verdict. PID 1 exits with the judge's status (128 + signal if it was killed); the kernel then kills
    whatever is left in the namespace. It gives up stdin/stdout/stderr once the judge has them, and is
    non-dumpable, so the program can read nothing through ``/proc/1``."""
    _make_undumpable()
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # no handler, so the kernel drops a SIGINT from inside too
    sys.stdout.flush()
    judge = os.fork()
    if judge == 0:
        code = 0
        try:
            judge_main()
        except BaseException:  # noqa: BLE001 - report the judge's own failure, then exit non-zero
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    for fd in (0, 1, 2):
        os.close(fd)
    while True:  # reap orphans re-parented to us until the judge ends
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == judge:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    if os.getpid() == 1:
        warden_main()
    else:
        judge_main()
