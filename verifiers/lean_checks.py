"""Text-level checks for Lean 4 proofs: find the proof in a response, catch tampered statements and cheats.

Everything here is pure string work (no Lean needed). The verdicts that need Lean (errors, sorries,
``#print axioms``, the elaborated type of the theorem) live in ``lean.py``; these checks run first, so a
cheat is rejected with a clear reason before any REPL time is spent, and they are the only guard against
cheats that the kernel cannot see (``#exit``, ``set_option debug.skipKernelTC``, metaprogramming).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

ALLOWED_AXIOMS = ("propext", "Classical.choice", "Quot.sound")
"""The axioms a proof may depend on (what ``#print axioms`` may list)."""
NATIVE_AXIOMS = ("Lean.ofReduceBool", "Lean.trustCompiler")
"""The axioms ``native_decide`` adds; allowed only with ``allow_native_decide``."""

# Identifier characters in Lean 4 (letters incl. Greek/unicode, digits, _, ', !, ?, and subscripts).
_ID = r"[\w'!?\u2080-\u209c\u1d62-\u1d6a.]"
_FENCE_LEAN = re.compile(r"```[ \t]*(?:lean4|lean|Lean4|Lean)[ \t]*\n(.*?)(?:```|\Z)", re.S)  # may be cut off
_FENCE_PLAIN = re.compile(r"```[ \t]*\n(.*?)```", re.S)  # an unlabeled block must be closed
_DECL = re.compile(r"(?m)^[ \t]*(?:@\[[^\]]*\][ \t]*)?(?:(?:private|protected|noncomputable|nonrec)[ \t]+)*"
                   r"(theorem|lemma)[ \t\n]+([^\s(\[{:]+)")
_HEADER_LINE = re.compile(r"^\s*(import\s+\S.*)?$")
_ALLOWED_OPTIONS = re.compile(r"^(maxHeartbeats|maxRecDepth|synthInstance\.\w+|linter\.[\w.]+|"
                              r"exponentiation\.threshold|tactic\.hygienic)$")


@dataclass
class Extraction:
    """The proof read from a response.

    ``preamble`` is the model's code before its theorem (helper lemmas, ``open``), ``body`` the text that
    follows ``:=`` (starting with ``by`` for a tactic proof), ``reason`` is set when nothing usable was found.
    """

    preamble: str = ""
    body: str = ""
    reason: Optional[str] = None
    source: str = ""
    """Where the proof came from: "block" (fenced lean block), "theorem", "after := by", "completion"."""


def strip_comments_and_strings(code: str, keep_strings: bool = False) -> str:
    """Blank out comments (``--``, nested ``/- -/``) and, unless ``keep_strings``, string, raw-string and char
    literals and «quoted» names. Every blanked character becomes a space (newlines stay), so indices into the
    result are indices into ``code``.
    """
    out = list(code)
    i, n = 0, len(code)

    def blank(a: int, b: int) -> None:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = code[i]
        if code.startswith("--", i):
            j = code.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
        elif code.startswith("/-", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if code.startswith("/-", j):
                    depth, j = depth + 1, j + 2
                elif code.startswith("-/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
        elif c == "r" and re.match(r'r#*"', code[i:i + 260]) and (i == 0 or not re.match(_ID, code[i - 1])):
            hashes = re.match(r'r(#*)"', code[i:]).group(1)
            end = code.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            if not keep_strings:
                blank(i, j)
        elif c == '"':
            j = i + 1
            while j < n and code[j] != '"':
                j += 2 if code[j] == "\\" else 1
            j = min(j + 1, n)
            if not keep_strings:
                blank(i, j)
        elif c == "'" and (i == 0 or not re.match(_ID, code[i - 1])) and re.match(r"'(\\.[^']*|[^\\'])'", code[i:i + 12]):
            j = i + re.match(r"'(\\.[^']*|[^\\'])'", code[i:i + 12]).end()
            if not keep_strings:
                blank(i, j)
        elif c == "«":
            j = code.find("»", i)
            j = n if j < 0 else j + 1
            if not keep_strings:
                blank(i, j)
        else:
            j = i + 1
        i = j
    return "".join(out)


def normalize_statement(text: str) -> str:
    """A whitespace- and comment-insensitive form of a statement, for comparing two spellings of it.

    Whitespace runs become one space, then spaces are dropped except between two identifier characters,
    so ``(x:ℕ)`` equals ``(x : ℕ)`` but ``(a b : ℕ)`` differs from ``(ab : ℕ)``; ``lemma`` reads as ``theorem``.
    """
    text = strip_comments_and_strings(text, keep_strings=True)
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"^lemma\b", "theorem", text)
    return re.sub(rf"(?<!{_ID}) | (?!{_ID})", "", text)


def theorem_name(statement: str) -> Optional[str]:
    """The name declared by the first ``theorem``/``lemma`` in ``statement``, or None."""
    found = _decls(statement)
    return found[0][0] if found else None


def split_header(statement: str) -> Tuple[str, str]:
    """Split leading ``import``/``open``/``set_option``/blank lines off a statement: ``(header, rest)``."""
    lines = statement.splitlines(keepends=True)
    k = 0
    while k < len(lines) and re.match(r"^\s*($|import\s|open\s|set_option\s)", lines[k]):
        k += 1
    return "".join(lines[:k]), "".join(lines[k:])


def statement_head(statement: str) -> str:
    """The statement without its trailing ``:= by`` / ``:=`` / ``by`` / ``:= by sorry`` (the signature that must
    not change)."""
    head = statement.rstrip()
    head = re.sub(r"\bsorry\s*$", "", head).rstrip()
    head = re.sub(r"\bby\s*$", "", head).rstrip()
    head = re.sub(r":=\s*$", "", head).rstrip()
    return head


def _decls(code: str) -> List[Tuple[str, int, int]]:
    """``(name, keyword_start, line_start)`` of each theorem/lemma declared in ``code`` (comments ignored)."""
    stripped = strip_comments_and_strings(code)
    return [(m.group(2), m.start(1), stripped.rfind("\n", 0, m.start(1)) + 1) for m in _DECL.finditer(stripped)]


def _match_signature(code: str, start: int, head: str) -> Optional[int]:
    """If the declaration at ``code[start:]`` has the signature ``head`` (modulo spelling), return the index just
    after its ``:=``; else None. Tries each ``:=`` in turn and compares the text before it with ``head``."""
    target = normalize_statement(head[theorem_keyword_index(head):])
    stripped = strip_comments_and_strings(code)
    for m in re.finditer(r":=", stripped[start:]):
        end = start + m.start()
        candidate = normalize_statement(code[start:end])
        if candidate == target:
            return end + 2
        if len(candidate) > len(target) + 64:
            break
    return None


def theorem_keyword_index(statement: str) -> int:
    """Index of the ``theorem``/``lemma`` keyword in ``statement`` (0 when there is none)."""
    m = _DECL.search(strip_comments_and_strings(statement))
    return m.start(1) if m else 0


def _drop_imports(code: str) -> str:
    return "".join(l for l in code.splitlines(keepends=True) if not re.match(r"^\s*import\s", l))


def _from_theorem_text(code: str, name: str, head: str, source: str) -> Extraction:
    """Split code holding the model's own ``theorem name ...`` into preamble and body, checking the signature."""
    mains = [d for d in _decls(code) if d[0] == name]
    if len(mains) > 1:
        return Extraction(reason=f"redefinition of the statement: {name!r} is declared {len(mains)} times", source=source)
    _, start, line_start = mains[-1]
    after = _match_signature(code, start, head)
    if after is None:
        stop = code.find(":=", start)
        given = code[start:stop if stop >= 0 else len(code)].strip()
        return Extraction(reason=f"statement changed: the response's theorem {name} differs from the given statement "
                                 f"(response: {given[:300]!r})", source=source)
    return Extraction(preamble=_drop_imports(code[:line_start]), body=code[after:].strip(" \t").rstrip(), source=source)


def _tactic_block(text: str) -> str:
    """A bare tactic script as a proof body: ``by`` on its own line, lines indented by two when at column 0."""
    lines = text.rstrip().split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines and not lines[0][0].isspace():
        lines = [("  " + l) if l.strip() else l for l in lines]
    return "by\n" + "\n".join(lines)


def extract_proof(response: str, statement: str) -> Extraction:
    """Find the proof of ``statement`` in ``response``.

    Order: the last fenced ``lean``/``lean4`` block that declares the theorem (its signature must match the
    statement), else the last lean block as a tactic script (or ``by ...`` / ``:= term``); with no fenced
    block, the model's own ``theorem name ...``, else the text after the first ``:= by``, else the text before
    a closing fence (a completion of a prompt that ended in ``:= by``).
    """
    name = theorem_name(statement) or ""
    head = statement_head(statement)
    if not isinstance(response, str) or not response.strip():
        return Extraction(reason="empty response")
    lean_blocks = [m.group(1) for m in _FENCE_LEAN.finditer(response)]
    lean_blocks = lean_blocks or [m.group(1) for m in _FENCE_PLAIN.finditer(response)]
    if lean_blocks:
        with_decl = [b for b in lean_blocks if name and any(d[0] == name for d in _decls(b))]
        if with_decl:
            return _from_theorem_text(with_decl[-1], name, head, "block")
        block = lean_blocks[-1]
        others = [d[0] for d in _decls(block)]
        if others:
            return Extraction(reason=f"the response proves a different theorem ({others[-1]}) instead of {name}",
                              source="block")
        return _body_only(block, "block")
    code = response.split("```")[0]
    if name and any(d[0] == name for d in _decls(code)):
        return _from_theorem_text(code, name, head, "theorem")
    idx = code.find(":= by")
    if idx >= 0:
        rest = code[idx + 5:].rstrip()
        if not rest.strip():
            return Extraction(reason="empty proof after ':= by'", source="after := by")
        return Extraction(body="by" + (rest if rest[0].isspace() else " " + rest), source="after := by")
    return _body_only(code, "completion")


def _body_only(text: str, source: str) -> Extraction:
    """A block or completion holding only a proof: a tactic script, ``by ...`` or ``:= term``."""
    body = _drop_imports(text).rstrip()
    if not body.strip():
        return Extraction(reason="no proof found in the response", source=source)
    lead = body.lstrip()
    if lead.startswith(":="):
        return Extraction(body=lead[2:].lstrip(), source=source)
    if re.match(r"by\b", lead):
        return Extraction(body=lead, source=source)
    return Extraction(body=_tactic_block(body), source=source)


def assemble(statement: str, extraction: Extraction) -> str:
    """The Lean code that is checked: the model's preamble, then the GIVEN statement, then the model's proof."""
    code = statement_head(statement) + " := " + extraction.body
    preamble = extraction.preamble.strip("\n")
    return (preamble + "\n\n" if preamble.strip() else "") + code + "\n"


# (pattern, reason). Searched in the code with comments and strings blanked out.
_CHEATS: List[Tuple[str, str]] = [
    (r"(?<![\w.'])sorry(?![\w'!?])", "proof contains sorry"),
    (r"(?<![\w.'])admit(?![\w'!?])", "proof contains admit"),
    (r"(?<![\w.'])axiom(?![\w'!?])", "the response declares a new axiom"),
    (r"#exit\b", "#exit is not allowed"),
    (r"debug\.skipKernelTC", "set_option debug.skipKernelTC is not allowed"),
    (r"(?<![\w.'])(macro|macro_rules|syntax|elab|elab_rules|notation|infix|infixl|infixr|prefix|postfix|"
     r"declare_syntax_cat|initialize|builtin_initialize)(?![\w'!?])",
     "metaprogramming (macros, syntax, notation) is not allowed"),
    (r"#eval|#exec|run_cmd|run_tac|run_elab|run_meta|by_elab|Lean\.Elab|Lean\.Meta|Lean\.Environment|"
     r"setEnv|modifyEnv|addDecl|addDeclWithoutChecking|unsafeCast|unsafeIO|unsafeBaseIO",
     "running meta code is not allowed"),
    (r"implemented_by|(?<![\w.'])extern(?![\w'!?])|(?<![\w.'])unsafe(?![\w'!?])", "unsafe/implemented_by/extern is not allowed"),
    (r"(?<![\w.'])import(?![\w'!?])", "import is not allowed after the header"),
]
_NATIVE = (r"native_decide|decide\s*\+\s*native|native\s*:=\s*true|ofReduceBool|reduceBool|trustCompiler",
           "native_decide is not allowed (it trusts the compiler)")
_RAW_ALWAYS = [(r"#exit\b", "#exit is not allowed"), (r"skipKernelTC", "set_option debug.skipKernelTC is not allowed")]


def find_cheats(code: str, allow_native_decide: bool = False) -> List[str]:
    """Reasons ``code`` (model-written Lean) is rejected before it reaches Lean; empty when none apply.

    Comments and strings are ignored, except that ``#exit`` and ``skipKernelTC`` are refused anywhere.
    ``set_option`` is allowed only for resource and linter options (``maxHeartbeats``, ``maxRecDepth``, ...).
    """
    reasons: List[str] = []
    text = strip_comments_and_strings(code)
    patterns = list(_CHEATS) + ([] if allow_native_decide else [_NATIVE])
    for pattern, reason in patterns:
        if re.search(pattern, text) and reason not in reasons:
            reasons.append(reason)
    for pattern, reason in _RAW_ALWAYS:
        if re.search(pattern, code) and reason not in reasons:
            reasons.append(reason)
    for option in re.findall(r"set_option\s+([^\s]+)", text):
        if not _ALLOWED_OPTIONS.match(option):
            reason = f"set_option {option} is not allowed"
            if option == "debug.skipKernelTC":
                continue  # already reported
            reasons.append(reason)
    return reasons


def parse_axioms(message: str) -> Optional[List[str]]:
    """The axiom names in a ``#print axioms`` message; [] for "does not depend on any axioms"; None if unrecognised."""
    if "does not depend on any axioms" in message:
        return []
    m = re.search(r"depends on axioms:\s*\[(.*?)\]", message, re.S)
    if not m:
        return None
    return [a.strip() for a in m.group(1).replace("\n", " ").split(",") if a.strip()]


def disallowed_axioms(axioms: List[str], allow_native_decide: bool = False) -> List[str]:
    """The axioms in ``axioms`` beyond propext, Classical.choice, Quot.sound (and native_decide's, if allowed)."""
    allowed = set(ALLOWED_AXIOMS) | (set(NATIVE_AXIOMS) if allow_native_decide else set())
    return [a for a in axioms if a not in allowed]
