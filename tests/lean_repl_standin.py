#!/usr/bin/env python3
"""STAND-IN for the leanprover-community Lean REPL.  THIS IS NOT LEAN.

It speaks the REPL's JSON protocol (a JSON request per blank-line-terminated block on stdin; a JSON reply
followed by a blank line on stdout; ``{"message": ...}`` for refused requests; ``env`` ids that can be
branched from) and fakes elaboration with a few fixed rules, so that the verifier's protocol handling
(messages, severities, sorries, environment reuse, timeouts, crashes, restarts, memory cap) can be tested on
machines where no Lean toolchain can be installed. It proves nothing about real Lean proofs.

Fake elaboration rules (per top-level command; commands start at column 0):
* ``import M``: M must be one of Init, Lean, Mathlib, Aesop (else an error); ``--import-delay`` seconds each.
* ``axiom N : T``: declares axiom N.  ``instance ...``: recorded; it changes how later statements "elaborate"
  (their pp.all type gets an ``[instance ...]`` suffix), standing in for an instance override.
* ``theorem/lemma N sig := proof``: "already declared" error if N exists; the proof fails with an error if
  it is empty or contains ``bogus`` (unknown identifier) or ``fail_tactic``; ``sorry``/``admit`` give the
  "declaration uses 'sorry'" warning, a ``sorries`` entry and the axiom sorryAx; ``native_decide`` adds
  Lean.ofReduceBool; naming a declared axiom or theorem adds its axioms; any tactic proof (``by``) uses
  propext, Classical.choice, Quot.sound.
* ``loop_forever`` in a proof: never answers.  ``crash_now``: exits with status 3.  ``eat_memory``: holds
  ~400 MiB of anonymous memory and never answers.
* ``#check @N`` (pp.all after ``set_option pp.all true in``): info ``@N : <normalised signature>``.
* ``#print axioms N``: info in Lean's wording.  ``#exit``: ignores the rest of the command.
Flags: ``--noise`` prints debug lines (with blank lines and braces) before every reply, as some REPL builds
do; ``--log FILE`` appends every request; ``--import-delay S``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

KNOWN_MODULES = {"Init", "Lean", "Mathlib", "Aesop"}
TACTIC_AXIOMS = ["propext", "Classical.choice", "Quot.sound"]
KEYWORDS = ("theorem", "lemma", "axiom", "instance", "def", "example", "#check", "#print", "#exit", "set_option",
            "open", "import", "namespace", "end", "section", "noncomputable", "private", "@[")


class Env:
    def __init__(self, decls=None, instances=None):
        self.decls = dict(decls or {})  # name -> {"type": str, "axioms": [..], "kind": str}
        self.instances = list(instances or [])

    def copy(self):
        return Env(self.decls, self.instances)


def split_commands(code):
    """Top-level commands: a line at column 0 starting with a keyword begins a new command."""
    cmds, current, start_line = [], [], 1
    for lineno, line in enumerate(code.split("\n"), start=1):
        starts = line[:1].strip() and line.startswith(KEYWORDS)
        if starts and current and not current[-1].rstrip().endswith(" in"):
            cmds.append((start_line, "\n".join(current)))
            current, start_line = [], lineno
        if not current:
            start_line = lineno
        current.append(line)
    if current:
        cmds.append((start_line, "\n".join(current)))
    return [(n, c) for n, c in cmds if c.strip() and not c.strip().startswith("--")]


def msg(severity, line, data, col=0):
    return {"severity": severity, "pos": {"line": line, "column": col}, "endPos": {"line": line, "column": col + 1},
            "data": data}


def elaborate(env, code, out):
    """Run ``code`` on a copy of ``env``; append messages/sorries to ``out``; return the new Env."""
    env = env.copy()
    for line, text in split_commands(code):
        pp_all = False
        m = re.match(r"set_option\s+(\S+)\s+(\S+)\s+in\s*\n?", text)
        if m:
            pp_all = m.group(1) == "pp.all" and m.group(2) == "true"
            text = text[m.end():]
        body = text.strip()
        if body.startswith("#exit"):
            break
        if body.startswith("import"):
            mod = body.split()[1]
            if mod.split(".")[0] not in KNOWN_MODULES:
                out["messages"].append(msg("error", line, f"unknown module prefix '{mod}'"))
            continue
        if body.startswith(("open", "set_option", "namespace", "end", "section", "def", "noncomputable")):
            if body.startswith("def"):
                env.decls[body.split()[1]] = {"type": "def", "axioms": [], "kind": "def"}
            continue
        if body.startswith("axiom"):
            name = body.split()[1]
            env.decls[name] = {"type": body.split(":", 1)[1].strip(), "axioms": [name], "kind": "axiom"}
            continue
        if body.startswith("instance"):
            env.instances.append(re.sub(r"\s+", " ", body.split(":=")[0]))
            continue
        if body.startswith("#check"):
            name = body.split()[1].lstrip("@")
            if name not in env.decls:
                out["messages"].append(msg("error", line, f"unknown identifier '{name}'"))
            else:
                prefix = "@" if pp_all else ""
                out["messages"].append(msg("info", line, f"{prefix}{name} : {env.decls[name]['type']}"))
            continue
        if body.startswith("#print"):
            name = body.split()[-1]
            if name not in env.decls:
                out["messages"].append(msg("error", line, f"unknown constant '{name}'"))
                continue
            axioms = sorted(set(env.decls[name]["axioms"]))
            data = (f"'{name}' depends on axioms: [{', '.join(axioms)}]" if axioms
                    else f"'{name}' does not depend on any axioms")
            out["messages"].append(msg("info", line, data))
            continue
        m = re.match(r"(?:@\[[^\]]*\]\s*)?(?:private\s+|protected\s+)?(theorem|lemma|example)\s*([^\s(\[{:]*)", body)
        if not m:
            out["messages"].append(msg("error", line, "unexpected token; expected command"))
            continue
        name = m.group(2) if m.group(1) != "example" else "_example"
        if ":=" not in body:
            out["messages"].append(msg("error", line, "unexpected end of input; expected ':='"))
            continue
        sig, proof = body[m.end():].split(":=", 1)
        if name in env.decls and m.group(1) != "example":
            out["messages"].append(msg("error", line, f"'{name}' has already been declared"))
            continue
        decl = check_proof(env, name, sig, proof, line, out)
        if decl is not None and m.group(1) != "example":
            env.decls[name] = decl
    return env


def check_proof(env, name, sig, proof, line, out):
    words = set(re.findall(r"[A-Za-z_][\w.']*", proof))
    if "loop_forever" in words:
        while True:
            time.sleep(3600)
    if "crash_now" in words:
        sys.stderr.write("INTERNAL PANIC: stand-in crash on request\n")
        sys.stderr.flush()
        os._exit(3)
    if "eat_memory" in words:
        hog = bytearray(b"x") * (400 << 20)  # touched pages: counted as anonymous RSS
        while hog:
            time.sleep(3600)
    tactics = proof.strip()
    if tactics in ("", "by"):
        out["messages"].append(msg("error", line, "unsolved goals"))
        return None
    if "bogus" in words:
        out["messages"].append(msg("error", line + 1, "unknown identifier 'bogus'", 2))
        return None
    if "fail_tactic" in words:
        out["messages"].append(msg("error", line + 1, "linarith failed to find a contradiction", 2))
        return None
    axioms = list(TACTIC_AXIOMS) if tactics.startswith("by") else []
    if words & {"sorry", "admit"}:
        out["messages"].append(msg("warning", line, "declaration uses 'sorry'", 8))
        out["sorries"].append({"pos": {"line": line + 1, "column": 2}, "endPos": {"line": line + 1, "column": 7},
                               "goal": "⊢ " + sig.split(":")[-1].strip(), "proofState": len(out["sorries"])})
        axioms.append("sorryAx")
    if "native_decide" in words:
        axioms.append("Lean.ofReduceBool")
    for word in words:
        if word in env.decls:
            axioms.extend(env.decls[word]["axioms"])
    pp_type = re.sub(r"\s+", " ", sig).strip()
    if env.instances:
        pp_type += " [instance " + "; ".join(env.instances) + "]"
    return {"type": pp_type, "axioms": axioms, "kind": "theorem"}


def read_request(stdin):
    """Lines until a blank line, joined (like the REPL's getLines); None at end of input."""
    lines = []
    while True:
        line = stdin.readline()
        if line == "":
            return "".join(lines) if "".join(lines).strip() else None
        if not line.strip():
            if lines:
                return "".join(lines)
            continue
        lines.append(line.rstrip())


def main(argv=None):
    parser = argparse.ArgumentParser(description="stand-in for the Lean REPL (NOT Lean)")
    parser.add_argument("--noise", action="store_true")
    parser.add_argument("--log", default=None)
    parser.add_argument("--import-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    envs = []
    while True:
        query = read_request(sys.stdin)
        if query is None:
            return 0
        if args.log:
            with open(args.log, "a") as f:
                f.write(query.replace("\n", " ") + "\n")
        try:
            request = json.loads(query)
        except json.JSONDecodeError as exc:
            sys.stderr.write(json.dumps({"message": f"Could not parse JSON:\n{exc}"}) + "\n")
            return 1
        cmd = request.get("cmd")
        if not isinstance(cmd, str):
            reply = {"message": "Could not parse as a valid JSON command"}
        elif "env" in request and not (isinstance(request["env"], int) and 0 <= request["env"] < len(envs)):
            reply = {"message": "Unknown environment."}
        else:
            out = {"messages": [], "sorries": []}
            base = envs[request["env"]] if "env" in request else Env()
            if "env" not in request and "import" in cmd:
                time.sleep(args.import_delay)
            elif "env" in request and re.search(r"^import\s", cmd, re.M):
                out["messages"].append(msg("error", 1, "invalid 'import' command, it must be used in the beginning "
                                                       "of the file"))
            new_env = elaborate(base, cmd, out)
            envs.append(new_env)
            reply = {"env": len(envs) - 1}
            for key in ("messages", "sorries"):
                if out[key]:
                    reply[key] = out[key]
        if args.noise:
            sys.stdout.write(f"Processing incremental state [pos: 0..{len(query)}]:\n{{ noise\n\n}}\n")
        sys.stdout.write(json.dumps(reply, indent=1, ensure_ascii=False) + "\n\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
