"""The Lean 4 proof verifier: ``get_verifier("lean").verify(response, ground_truth=<formal statement>, header=...)``.

A response is correct only when all of these hold:

1. a proof is found in it (a fenced lean block, the model's own copy of the theorem, or the text after ``:= by``),
   and where the response restates the theorem, its signature equals the given statement;
2. the model's text holds no cheat that Lean itself would accept (``sorry``/``admit``, ``axiom``, ``#exit``,
   ``set_option debug.skipKernelTC``, ``native_decide`` unless allowed, macros/notation/meta code);
3. Lean (through the REPL, on an environment that already holds the header's imports) reports no error and
   no ``sorry`` for the given statement followed by the model's proof;
4. ``#print axioms`` lists nothing beyond propext, Classical.choice and Quot.sound;
5. the theorem's elaborated type (printed with ``pp.all``) equals that of the given statement elaborated in a
   clean header environment, so helper code cannot change what the statement means.

``info["reason"]`` says which check failed. Nothing here raises for a bad response, a missing REPL, a REPL
timeout or crash: each scores 0 with its reason. Imports neither torch nor ray.
"""
from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .base import Verifier, VerifyResult, register_verifier
from .lean_checks import (assemble, disallowed_axioms, extract_proof, find_cheats, parse_axioms, split_header,
                          statement_head, strip_comments_and_strings, theorem_name)
from .lean_repl import (LeanRepl, ReplConfig, ReplError, ReplTimeout, describe, find_repl_command, messages_of,
                        shared_pool, standin_note)

DEFAULT_HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat Topology Rat\n"
"""Header used when neither the row nor the statement brings one (the usual miniF2F header)."""

_USES_SORRY = re.compile(r"declaration uses ['`‘]sorry['`’]")
_REFERENCE_TYPES: "OrderedDict[Tuple[Tuple[str, ...], str, str], str]" = OrderedDict()
_REFERENCE_LOCK = threading.Lock()
_REFERENCE_MAX = 4096


def _header_scope(header: str) -> str:
    """The header without its imports (``set_option``/``open`` lines), put before every command run on the header
    environment so that those settings hold whether or not the REPL carries scopes over between commands."""
    kept = [l for l in header.splitlines() if not re.match(r"^\s*import\s", l)]
    text = "\n".join(kept).strip()
    return text + "\n\n" if text else ""


def _declarations_in(preamble: str) -> bool:
    """Whether ``preamble`` holds more than ``open``/``set_option`` lines, comments and blank lines."""
    text = strip_comments_and_strings(preamble)
    return any(l.strip() and not re.match(r"^\s*(open|set_option)\s", l) for l in text.splitlines())


def _probe_code(name: str) -> str:
    """Lean commands that print the theorem's fully explicit type and its axioms."""
    return f"set_option pp.all true in\n#check @{name}\n\n#print axioms {name}\n"


@register_verifier("lean")
class LeanVerifier(Verifier):
    """Checks Lean 4 proofs with the leanprover-community REPL. Options (all picklable):

    * ``repl_command`` (list of str): argv of the REPL; default: ``$REASONRL_LEAN_REPL``, ``repl`` or
      ``lake env repl`` found on PATH (see :func:`lean_repl.find_repl_command`), or
      :func:`lean_repl.docker_repl_command` for the container recipe in ``sandboxes/images/lean``.
    * ``repl_cwd`` (str): working directory of the REPL (the Lean project for ``lake env repl``).
    * ``timeout_s`` (float, 60): hard limit for checking one proof; the REPL is killed and restarted after it.
    * ``header_timeout_s`` (float, 900): limit for building the header environment (importing Mathlib).
    * ``memory_mb`` (int, 16384): cap on the REPL's anonymous resident memory; passing it kills the REPL.
    * ``allow_native_decide`` (bool, False): accept ``native_decide`` (and the axioms it adds).
    * ``allow_preamble`` (bool, True): accept helper declarations the model writes before the theorem.
    * ``check_statement_type`` (bool, True): compare the theorem's ``pp.all`` type with the given statement's.
    * ``max_commands`` (int, 400): restart a REPL after this many requests (bounds its memory growth).
    * ``pool_size`` (int, 1): REPL processes per worker process.
    * ``default_header`` (str): header when the row gives none.
    """

    def __init__(self, repl_command: Optional[Sequence[str]] = None, repl_cwd: Optional[str] = None,
                 timeout_s: float = 60.0, header_timeout_s: float = 900.0, memory_mb: int = 16384,
                 allow_native_decide: bool = False, allow_preamble: bool = True, check_statement_type: bool = True,
                 max_commands: int = 400, pool_size: int = 1, default_header: str = DEFAULT_HEADER,
                 **options: Any) -> None:
        super().__init__(**options)
        self.repl_command = list(repl_command) if repl_command else None
        self.repl_cwd = repl_cwd
        self.timeout_s = float(timeout_s)
        self.header_timeout_s = float(header_timeout_s)
        self.memory_mb = int(memory_mb)
        self.allow_native_decide = bool(allow_native_decide)
        self.allow_preamble = bool(allow_preamble)
        self.check_statement_type = bool(check_statement_type)
        self.max_commands = int(max_commands)
        self.pool_size = int(pool_size)
        self.default_header = default_header

    # -- configuration -----------------------------------------------------------------------------
    def _command(self) -> Tuple[Optional[List[str]], str]:
        if self.repl_command:
            return self.repl_command, "repl_command"
        return find_repl_command()

    def _config(self, command: List[str]) -> ReplConfig:
        return ReplConfig(command=tuple(command), cwd=self.repl_cwd, memory_mb=self.memory_mb,
                          max_commands=self.max_commands)

    @staticmethod
    def _split(ground_truth: Any, header: Optional[str]) -> Tuple[str, Optional[str]]:
        """(statement, header) from a formal statement string or a ``{"formal_statement", "header"}`` dict."""
        if isinstance(ground_truth, dict):
            header = header if header is not None else ground_truth.get("header")
            ground_truth = ground_truth.get("formal_statement") or ground_truth.get("statement")
        statement = ground_truth if isinstance(ground_truth, str) else ""
        own_header, rest = split_header(statement)
        if header is None:
            return rest, own_header if own_header.strip() else None
        if own_header.strip():  # the row's header wins; the statement keeps its own open/set_option lines
            kept = "".join(l for l in own_header.splitlines(keepends=True) if not re.match(r"^\s*import\s", l))
            return kept + rest, header
        return rest, header

    # -- the check ---------------------------------------------------------------------------------
    def verify(self, response: str, ground_truth: Any, header: Optional[str] = None, **extra: Any) -> VerifyResult:
        """Check ``response`` as a proof of ``ground_truth`` (a formal statement ending in ``:= by``) under
        ``header`` (imports and options; from the row's extra_info)."""
        start = time.monotonic()
        try:
            result = self._verify(response, ground_truth, header)
        except Exception as exc:  # a bug here must cost one sample, not the training step
            result = VerifyResult.incorrect(f"internal error in the lean verifier: {type(exc).__name__}: {exc}",
                                            error_kind="internal")
        result.info["time_s"] = round(time.monotonic() - start, 4)
        return result

    def _verify(self, response: str, ground_truth: Any, header: Optional[str]) -> VerifyResult:
        statement, header = self._split(ground_truth, header)
        header = header if header is not None else self.default_header
        name = theorem_name(statement)
        if not statement.strip() or name is None:
            return VerifyResult.incorrect("the ground truth is not a Lean theorem statement (no `theorem NAME`)")
        extraction = extract_proof(response, statement)
        if extraction.reason:
            return VerifyResult.incorrect(extraction.reason, source=extraction.source)
        if not self.allow_preamble and _declarations_in(extraction.preamble):
            return VerifyResult.incorrect("code before the theorem is not allowed (allow_preamble=False)",
                                          source=extraction.source)
        code = assemble(statement, extraction)
        cheats = find_cheats(extraction.preamble + "\n" + extraction.body, self.allow_native_decide)
        if cheats:
            return VerifyResult.incorrect("; ".join(cheats), extracted=code, source=extraction.source)
        return self._lean_checks(header, statement, name, code, {"source": extraction.source})

    def _lean_checks(self, header: str, statement: str, name: str, code: str, info: Dict[str, Any]) -> VerifyResult:
        """Run ``code`` through a pooled REPL and judge the reply; REPL failures become a scored-0 result."""
        info = {"extracted": code, **info}
        command, found_how = self._command()
        if command is None:
            return VerifyResult.incorrect(found_how, **info, error_kind="not_found")
        info["repl"] = " ".join(command)
        if standin_note(command):
            info["standin"] = "checked by tests/lean_repl_standin.py, a stand-in that is NOT Lean"
        pool = shared_pool(self._config(command), self.pool_size)
        repl = pool.acquire(header)
        try:
            return self._check_with_repl(repl, header, statement, name, code, info)
        except ReplError as exc:
            return VerifyResult.incorrect(str(exc), **info, error_kind=exc.kind,
                                          timed_out=isinstance(exc, ReplTimeout))
        finally:
            pool.release(repl)

    def check_code(self, code: str, ground_truth: Any, header: Optional[str] = None) -> VerifyResult:
        """Only the Lean-side checks (errors, sorries, axioms, statement type) on ``code``, which must declare the
        statement's theorem: no extraction and no text scan. For trusted code, and to test the Lean layer alone."""
        statement, header = self._split(ground_truth, header)
        header = header if header is not None else self.default_header
        name = theorem_name(statement)
        if name is None:
            return VerifyResult.incorrect("the ground truth is not a Lean theorem statement (no `theorem NAME`)")
        return self._lean_checks(header, statement, name, code, {"source": "check_code"})

    def _check_with_repl(self, repl: LeanRepl, header: str, statement: str, name: str, code: str,
                         info: Dict[str, Any]) -> VerifyResult:
        base_env = repl.header_env(header, self.header_timeout_s)
        scope = _header_scope(header)
        reply = repl.run(scope + code, base_env, self.timeout_s)
        offset = scope.count("\n")  # report positions as lines of the checked code (info["extracted"])
        info["lean_messages"] = [f"{m.get('severity')}: {describe(m, offset)}" for m in messages_of(reply)][:10]
        if "env" not in reply:
            return VerifyResult.incorrect(f"Lean REPL refused the proof: {reply.get('message', reply)}", **info)
        errors = messages_of(reply, "error")
        if errors:
            return VerifyResult.incorrect(f"Lean error: {describe(errors[0], offset)[:500]}", **info)
        if reply.get("sorries") or any(_USES_SORRY.search(str(m.get("data", ""))) for m in messages_of(reply)):
            return VerifyResult.incorrect("proof contains sorry", **info)
        proved_type, axioms, problem = self._probe(repl, int(reply["env"]), name)
        if problem:
            return VerifyResult.incorrect(problem, **info)
        info["axioms"] = axioms
        bad = disallowed_axioms(axioms, self.allow_native_decide)
        if bad:
            if "sorryAx" in bad:
                why = "proof contains sorry (sorryAx)"
            elif any(a in ("Lean.ofReduceBool", "Lean.trustCompiler") for a in bad):
                why = "native_decide is not allowed (the proof depends on Lean.ofReduceBool)"
            else:
                why = f"the proof depends on axioms beyond propext, Classical.choice, Quot.sound: {', '.join(bad)}"
            return VerifyResult.incorrect(why, **info)
        if self.check_statement_type:
            reference = self._reference_type(repl, base_env, header, statement, name)
            if proved_type != reference:
                info["proved_type"], info["given_type"] = proved_type[:2000], reference[:2000]
                return VerifyResult.incorrect("statement changed: the theorem proved elaborates to a different type "
                                              "than the given statement (redefinition, instance or open?)", **info)
        return VerifyResult(score=1.0, correct=True, info={"reason": "proof checked", **info})

    def _probe(self, repl: LeanRepl, env: int, name: str) -> Tuple[str, List[str], Optional[str]]:
        """(pp.all type line, axioms, problem) for theorem ``name`` in environment ``env``."""
        reply = repl.run(_probe_code(name), env, self.timeout_s)
        if "env" not in reply:
            return "", [], f"Lean REPL refused the axiom check: {reply.get('message', reply)}"
        errors = messages_of(reply, "error")
        if errors:
            return "", [], f"theorem {name} is not in the environment after the proof: {describe(errors[0])[:300]}"
        axioms: Optional[List[str]] = None
        type_line = ""
        for m in messages_of(reply, "info"):
            data = str(m.get("data", ""))
            parsed = parse_axioms(data)
            if parsed is not None and axioms is None:
                axioms = parsed
            elif not type_line:
                type_line = data.strip()
        if axioms is None:
            return "", [], "could not read the output of #print axioms"
        return type_line, axioms, None

    def _reference_type(self, repl: LeanRepl, base_env: int, header: str, statement: str, name: str) -> str:
        """The pp.all type of the given statement elaborated in the clean header environment (cached)."""
        key = (tuple(repl.config.command), header, statement)
        with _REFERENCE_LOCK:
            if key in _REFERENCE_TYPES:
                _REFERENCE_TYPES.move_to_end(key)
                return _REFERENCE_TYPES[key]
        reply = repl.run(_header_scope(header) + statement_head(statement) + " := by sorry\n", base_env,
                         self.timeout_s)
        if "env" not in reply:
            raise ReplError(f"Lean REPL refused the given statement: {reply.get('message', reply)}")
        errors = messages_of(reply, "error")
        if errors:
            raise ReplError(f"the given statement does not elaborate: {describe(errors[0])[:300]}")
        type_line, _, problem = self._probe(repl, int(reply["env"]), name)
        if problem:
            raise ReplError(f"cannot read the given statement's type: {problem}")
        with _REFERENCE_LOCK:
            _REFERENCE_TYPES[key] = type_line
            while len(_REFERENCE_TYPES) > _REFERENCE_MAX:
                _REFERENCE_TYPES.popitem(last=False)
        return type_line

    def warm_up(self, header: Optional[str] = None) -> Optional[str]:
        """Start a REPL in this process and build ``header``'s environment now (importing Mathlib takes a while);
        returns None on success or the reason it failed."""
        command, found_how = self._command()
        if command is None:
            return found_how
        pool = shared_pool(self._config(command), self.pool_size)
        repl = pool.acquire(header or self.default_header)
        try:
            repl.header_env(header or self.default_header, self.header_timeout_s)
            return None
        except ReplError as exc:
            return str(exc)
        finally:
            pool.release(repl)
