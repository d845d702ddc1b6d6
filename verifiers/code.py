"""The code verifier: run the program in a response against a task's tests, in a sandbox, with a harness that the
program cannot forge (see ``code_harness.py`` for the trust model).

Ground truth, MBPP style: ``{"tests": ["assert f(1) == 2", ...], "test_imports": ["import math"]}``; each
assert is one test. HumanEval style: ``{"test": "def check(candidate): ...", "entry_point": "f"}`` plus an
optional ``"prefix"`` (code run before the program, e.g. the prompt's imports and helper functions); the
``check`` call is one test. Imports neither torch nor ray; the sandbox is built lazily once per process and
reused (warm docker containers stay warm across calls), so the verifier works inside VerifierPool workers.
"""
from __future__ import annotations

import ast
import builtins
import json
import marshal
import re
import secrets
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .base import Verifier, VerifyResult, register_verifier

HARNESS_SOURCE = (Path(__file__).resolve().parent / "code_harness.py").read_text()
# Compiling the harness costs more CPU than anything else it does (~10 ms), so it also travels pre-compiled,
# tagged with this interpreter's version; the loader compiles the source instead when the sandbox's differs.
HARNESS_CODE = (f"{sys.version_info[0]}.{sys.version_info[1]}\n".encode()
                + marshal.dumps(compile(HARNESS_SOURCE, "harness.py", "exec", dont_inherit=True)))
HARNESS_LOADER = ("import sys, marshal\n"
                  "tag, _, code = open('harness.bin', 'rb').read().partition(b'\\n')\n"
                  "if tag == b'%d.%d' % sys.version_info[:2]:\n    code = marshal.loads(code)\n"
                  "else:\n    code = compile(open('harness.py').read(), 'harness.py', 'exec')\n"
                  "exec(code, {'__name__': '__main__', '__builtins__': __builtins__})\n")
HARNESS_COMMAND = ["python3", "-I", "-S", "-c", HARNESS_LOADER]
VERDICT_TAG = "@@REASONRL-VERDICT"
MAX_PROGRAM_CHARS = 100_000
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:\n?[ \t]*```|\Z)", re.DOTALL)
PYTHON_TAGS = {"", "python", "py", "python3", "py3"}

_SANDBOXES: Dict[Tuple, Any] = {}
_SANDBOX_LOCK = threading.Lock()


def shared_sandbox(backend: str, timeout_s: float, memory_mb: int, pool_size: int):
    """One sandbox per (backend, limits) per process, built on first use and then reused."""
    from reasonrl.sandboxes import Limits, get_sandbox

    key = (backend, timeout_s, memory_mb, pool_size)
    with _SANDBOX_LOCK:
        if key not in _SANDBOXES:
            limits = Limits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s + 0.999)), memory_mb=memory_mb)
            options: Dict[str, Any] = {"limits": limits}
            if backend == "docker":
                options["pool_size"] = pool_size
            _SANDBOXES[key] = get_sandbox(backend, **options)
        return _SANDBOXES[key]


def defined_names(source: str) -> set:
    """Top-level names a program defines (functions, classes, assignments); empty if it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences in the program's strings
            tree = ast.parse(source)
    except Exception:  # SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def called_names(tests: List[str]) -> set:
    """Names the tests call that are not built-ins: the functions the program must define."""
    names = set()
    for test in tests:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(test)
        except Exception:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
                names.add(node.func.id)
    return names


def extract_program(response: str, entry_points: set) -> Optional[str]:
    """The program in a response: the last fenced Python block that defines an entry point; else the last
    Python block; else the whole response if it parses as Python; else None."""
    blocks = [m.group(2) for m in FENCE.finditer(response or "") if m.group(1).lower() in PYTHON_TAGS]
    if blocks:
        for block in reversed(blocks):
            if entry_points & defined_names(block):
                return block
        return blocks[-1]
    if response and response.strip() and defined_names(response):
        return response
    return None


FUTURE_IMPORT = re.compile(r"^from __future__ import [^\n]*$", re.MULTILINE)


def join_prefix(prefix: str, program: str) -> str:
    """``prefix`` then the program; the program's ``from __future__`` imports move to the very top."""
    if not prefix:
        return program
    futures = FUTURE_IMPORT.findall(program)
    body = FUTURE_IMPORT.sub("", program) if futures else program
    return "\n".join(futures + [prefix, "", body])


def parse_ground_truth(ground_truth: Any) -> Dict[str, Any]:
    """Accept a dict or its JSON text; normalise to kind/tests/imports/entry_point/prefix."""
    if isinstance(ground_truth, str):
        ground_truth = json.loads(ground_truth)
    if not isinstance(ground_truth, dict):
        raise ValueError(f"code ground truth must be a dict, got {type(ground_truth).__name__}")
    if ground_truth.get("test"):
        entry = ground_truth.get("entry_point")
        if not entry:
            raise ValueError("HumanEval-style ground truth needs 'entry_point'")
        return {"kind": "check", "tests": [str(ground_truth["test"])], "imports": [], "entry_point": str(entry),
                "prefix": str(ground_truth.get("prefix") or ""), "entry_points": {str(entry)}}
    tests = [str(t) for t in (ground_truth.get("tests") or ground_truth.get("test_list") or [])]
    if not tests:
        raise ValueError("code ground truth has neither 'tests' nor 'test'")
    imports = [str(t) for t in (ground_truth.get("test_imports") or [])]
    return {"kind": "asserts", "tests": tests, "imports": imports, "entry_point": None,
            "prefix": str(ground_truth.get("prefix") or ""), "entry_points": called_names(tests)}


@register_verifier("code")
class CodeVerifier(Verifier):
    """Scores a response by running its program against the task's tests in a sandbox.

    Options (all picklable): ``sandbox`` ("auto" | "bwrap" | "docker" | "subprocess"; "auto" = bwrap when usable,
    else docker), ``score_mode`` ("fraction": passed/total, "all": 1 only if every test passed), ``timeout_s``
    (wall-clock limit of one run; the harness stops calling the program one second earlier), ``memory_mb``,
    ``pool_size`` (docker: warm containers per process)."""

    def __init__(self, sandbox: str = "auto", score_mode: str = "fraction", timeout_s: float = 10.0,
                 memory_mb: int = 512, pool_size: int = 1, **options: Any) -> None:
        if score_mode not in ("fraction", "all"):
            raise ValueError(f"score_mode must be 'fraction' or 'all', got {score_mode!r}")
        super().__init__(sandbox=sandbox, score_mode=score_mode, timeout_s=timeout_s, memory_mb=memory_mb,
                         pool_size=pool_size, **options)
        self.sandbox_name, self.score_mode = sandbox, score_mode
        self.timeout_s, self.memory_mb, self.pool_size = float(timeout_s), int(memory_mb), int(pool_size)

    def _sandbox(self):
        name = self.sandbox_name
        if name == "auto":
            from reasonrl.sandboxes import default_backend
            name = default_backend()
        return shared_sandbox(name, self.timeout_s, self.memory_mb, self.pool_size)

    def verify(self, response: str, ground_truth: Any, **extra: Any) -> VerifyResult:
        """Extract the program, run the tests in the sandbox, score by ``score_mode``. Never raises for a bad
        response; a sandbox that cannot run at all is a failure (``VerifyResult.failed``, ``reason="sandbox error"``): no
        verdict, not a wrong answer."""
        start = time.monotonic()
        try:
            task = parse_ground_truth(ground_truth)
        except (ValueError, TypeError) as exc:
            return VerifyResult.incorrect("bad ground truth", error=str(exc))
        program = extract_program(response if isinstance(response, str) else "", task["entry_points"])
        if program is None:
            return VerifyResult.incorrect("no code found in the response", total=len(task["tests"]))
        if len(program) > MAX_PROGRAM_CHARS:
            return VerifyResult.incorrect("program too long", extracted=program[:2000], total=len(task["tests"]))
        source = join_prefix(task["prefix"], program)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compile(source, "solution.py", "exec", dont_inherit=True)
        except Exception as exc:  # SyntaxError, ValueError, RecursionError, MemoryError: all the program's fault
            return VerifyResult.incorrect("syntax error", error=f"{type(exc).__name__}: {exc}"[:500],
                                          extracted=program[:4000], total=len(task["tests"]))
        secret = secrets.token_hex(16)
        stdin = json.dumps({"secret": secret, "kind": task["kind"], "tests": task["tests"], "imports": task["imports"],
                            "entry_point": task["entry_point"], "deadline_s": max(0.5, self.timeout_s - 1.0)})
        try:
            sandbox = self._sandbox()
            result = sandbox.run({"harness.py": HARNESS_SOURCE, "harness.bin": HARNESS_CODE, "solution.py": source},
                                 HARNESS_COMMAND, stdin=stdin)
        except Exception as exc:  # the backend, not the program, failed
            return VerifyResult.failure("sandbox error", error=f"{type(exc).__name__}: {exc}"[:1000],
                                          extracted=program[:4000], total=len(task["tests"]))
        verdict = read_verdict(result.stdout, secret)
        info: Dict[str, Any] = {"extracted": program[:4000], "total": len(task["tests"]), "sandbox": sandbox.name,
                                "exit_code": result.exit_code, "timed_out": result.timed_out}
        signal = 0 if result.timed_out else killed_by_signal(result.exit_code)
        if verdict is None or signal:  # a harness killed even after its verdict was attacked: the verdict is void
            info.update(passed=0, stderr=result.stderr[-1000:])
            if result.timed_out:
                info["reason"] = "time limit"
            elif signal:
                info["reason"] = f"the test harness was killed by signal {signal} (an attack on the harness scores 0)"
            else:
                info["reason"] = "no verdict from the test harness"
            info["verify_s"] = round(time.monotonic() - start, 4)
            return VerifyResult(score=0.0, correct=False, info=info)
        info["timed_out"] = result.timed_out or verdict.get("timed_out") is True  # the harness's own deadline
        results = verdict.get("results", [])
        passed = sum(1 for r in results if r.get("passed") is True)
        total = len(task["tests"])
        all_passed = passed == total and len(results) == total
        score = (passed / total if total else 0.0) if self.score_mode == "fraction" else float(all_passed)
        failed = [{"index": i, "test": r.get("test", ""), "error": r.get("error", "")}
                  for i, r in enumerate(results) if r.get("passed") is not True]
        info.update(passed=passed, failed=failed[:5], load_error=verdict.get("load_error"),
                    output=str(verdict.get("output", ""))[:1000], harness_s=verdict.get("elapsed_s"))
        if all_passed:
            info["reason"] = "all tests passed"
        elif verdict.get("load_error"):
            info["reason"] = f"program failed to load: {verdict['load_error']}"[:300]
        else:
            first = failed[0] if failed else {"index": "?", "error": "missing results"}
            info["reason"] = f"test {first['index']} failed: {first['error']}"[:300]
        info["verify_s"] = round(time.monotonic() - start, 4)
        return VerifyResult(score=float(score), correct=all_passed, info=info)


def killed_by_signal(exit_code: int) -> int:
    """The signal that ended the harness (Docker reports -N, the bwrap PID-1 warden exits 128+N), else 0."""
    if exit_code < 0:
        return -exit_code
    return exit_code - 128 if 128 < exit_code < 160 else 0


def read_verdict(stdout: str, secret: str) -> Optional[Dict[str, Any]]:
    """The harness's verdict: exactly one line tagged with this run's secret, else None."""
    prefix = f"{VERDICT_TAG} {secret} "
    lines = [line for line in stdout.splitlines() if line.startswith(prefix)]
    if len(lines) != 1:
        return None
    try:
        verdict = json.loads(lines[0][len(prefix):])
    except ValueError:
        return None
    return verdict if isinstance(verdict, dict) and isinstance(verdict.get("results"), list) else None
