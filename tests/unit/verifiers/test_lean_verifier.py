"""The lean verifier: proof extraction, statement-tamper and cheat detection (pure text), verdicts through
tests/lean_repl_standin.py (a STAND-IN speaking the Lean REPL's JSON protocol; it is NOT Lean), the
miniF2F recipe, and real-Lean tests that run only where a `repl` or `lake` is on PATH."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import shutil
import sys
from pathlib import Path

import pytest
from components import needs

from reasonrl.verifiers import get_verifier
from reasonrl.verifiers.lean_checks import (assemble, disallowed_axioms, extract_proof, find_cheats,
                                            normalize_statement, parse_axioms, split_header, statement_head,
                                            theorem_name)
from reasonrl.verifiers.lean_repl import close_all_pools
from paths import TESTS

STANDIN = str(TESTS / "lean_repl_standin.py")
HEADER = "import Mathlib\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
STATEMENT = "theorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := by"


@pytest.fixture(autouse=True)
def _close_repls():
    yield
    close_all_pools()


def standin_verifier(*flags: str, **options):
    return get_verifier("lean", repl_command=[sys.executable, STANDIN, *flags], **options)


# ----------------------------------------------------------------------------------------------------
# Extraction (no Lean)
# ----------------------------------------------------------------------------------------------------
def test_fenced_block_with_restated_theorem_uses_the_given_statement():
    response = "Proof:\n```lean4\ntheorem swap_eq (a b:ℕ) (h₀ : a = b) : b = a := by\n  simp [h₀]\n```\nDone."
    ext = extract_proof(response, STATEMENT)
    assert ext.reason is None and ext.source == "block" and ext.preamble == ""
    # The checked code is the GIVEN statement (its original line break) followed by the model's proof.
    assert assemble(STATEMENT, ext) == "theorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := by\n  simp [h₀]\n"


def test_tactic_only_block_is_indented_under_by():
    ext = extract_proof("```lean\nsubst h₀\nrfl\n```", STATEMENT)
    assert assemble(STATEMENT, ext).endswith(":= by\n  subst h₀\n  rfl\n")


def test_text_after_colon_equals_by_without_fence():
    ext = extract_proof("so we finish with := by\n  exact h₀.symm", STATEMENT)
    assert ext.source == "after := by" and ext.body == "by\n  exact h₀.symm"


def test_completion_that_ends_with_a_closing_fence():
    ext = extract_proof("\n  exact h₀.symm\n```\nThat closes the goal.", STATEMENT)
    assert ext.source == "completion" and assemble(STATEMENT, ext).endswith(":= by\n  exact h₀.symm\n")


def test_term_proof_after_restated_theorem():
    ext = extract_proof("theorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := h₀.symm", STATEMENT)
    assert assemble(STATEMENT, ext) == "theorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := h₀.symm\n"


def test_last_block_declaring_the_theorem_wins_and_keeps_helpers_as_preamble():
    response = ("```lean\ntheorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  fail_tactic\n```\nBetter:\n"
                "```lean4\nimport Mathlib\nlemma helper (x y : ℕ) (h : x = y) : y = x := h.symm\n\n"
                "theorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  exact helper a b h₀\n```")
    ext = extract_proof(response, STATEMENT)
    assert ext.preamble.strip() == "lemma helper (x y : ℕ) (h : x = y) : y = x := h.symm"  # import dropped
    assert ext.body == "by\n  exact helper a b h₀"


@pytest.mark.parametrize("response, reason", [
    ("", "empty response"),
    ("```lean\ntheorem swap_eq (a b : ℕ) (h₀ : a = b) : a = a := by\n  rfl\n```", "statement changed"),
    ("```lean\ntheorem swap_eq (a b : ℕ) : b = a := by\n  sorry\n```", "statement changed"),
    ("```lean\ntheorem easier : True := by\n  trivial\n```", "proves a different theorem (easier)"),
    ("```lean\ntheorem swap_eq : True := trivial\ntheorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  simp\n```",
     "redefinition of the statement"),
    ("```lean\n```", "no proof found"),
    ("We are done := by", "empty proof after ':= by'"),
])
def test_extraction_failures_say_why(response, reason):
    assert reason in (extract_proof(response, STATEMENT).reason or "")


def test_normalization_ignores_spacing_and_comments_but_not_token_boundaries():
    assert normalize_statement("theorem t (x:ℕ) : x = x") == normalize_statement("theorem  t\n  (x : ℕ) -- c\n : x = x")
    assert normalize_statement("lemma t : 1 = 1") == normalize_statement("theorem t : 1 = 1")
    assert normalize_statement("theorem t (a b : ℕ) : a = b") != normalize_statement("theorem t (ab : ℕ) : ab = ab")
    assert normalize_statement('theorem t : "a b" = "a b"') != normalize_statement('theorem t : "ab" = "ab"')


def test_statement_helpers():
    assert theorem_name(STATEMENT) == "swap_eq"
    assert theorem_name("/-- doc with theorem fake -/\ntheorem real_one : True := by") == "real_one"
    assert statement_head(STATEMENT) == "theorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a"
    assert statement_head(STATEMENT + " sorry") == statement_head(STATEMENT)  # a lean_file-style statement
    assert split_header("import Mathlib\nopen Real\n\ntheorem t : True := by") == ("import Mathlib\nopen Real\n\n",
                                                                                 "theorem t : True := by")


def _minif2f_rows(data_dir: Path):
    from reasonrl.datasets.minif2f import build_rows

    return build_rows("valid", data_dir) + build_rows("test", data_dir)


def test_every_minif2f_statement_restated_with_other_line_breaks_is_recognised(data_dir):
    rows = _minif2f_rows(data_dir)
    assert len(rows) == 488  # 244 valid + 244 test (shared/data/README.md)
    for row in rows:
        statement = row["reward_model"]["ground_truth"]
        assert theorem_name(statement) == row["extra_info"]["name"]
        # Re-flow the statement (join its lines) as a model might; lines holding a -- comment stay separate.
        reflowed = re.sub(r"\n\s+(?![^\n]*--)", " ", statement) if "--" not in statement else statement
        response = f"```lean4\n{row['extra_info']['header']}{reflowed}\n  nlinarith [sq_nonneg 1]\n```"
        ext = extract_proof(response, statement)
        assert ext.reason is None, (row["extra_info"]["name"], ext.reason)
        assert find_cheats(ext.preamble + ext.body) == []  # the header's own lines are no cheat
        assert assemble(statement, ext).count(statement_head(statement)) == 1


# ----------------------------------------------------------------------------------------------------
# Cheat detection (no Lean)
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code, reason", [
    ("by\n  sorry", "sorry"),
    ("by\n  admit", "admit"),
    ("axiom cheat : False\n", "new axiom"),
    ("by\n  native_decide", "native_decide"),
    ("by\n  decide +native", "native_decide"),
    ("by simp\n#exit", "#exit"),
    ("by simp -- #exit", "#exit"),  # refused even in a comment
    ("set_option debug.skipKernelTC true in\ntheorem x : True := trivial", "skipKernelTC"),
    ("macro \"simp\" : tactic => `(tactic| sorry)", "metaprogramming"),
    ("local notation \"ℕ\" => Unit", "metaprogramming"),
    ("by\n  run_tac pure ()", "meta code"),
    ("#eval IO.println 1", "meta code"),
    ("by\n  exact by_elab return Lean.mkConst ``True.intro", "meta code"),
    ("open Lean in\ninitialize modifyEnv id", "metaprogramming"),
    ("@[implemented_by foo] def bar : Nat := 1", "implemented_by"),
    ("set_option pp.all true", "set_option pp.all is not allowed"),
])
def test_cheats_are_found(code, reason):
    found = find_cheats(code)
    assert any(reason in r for r in found), found


@pytest.mark.parametrize("code", [
    "by\n  -- no sorry needed here\n  simp /- admit nothing -/",
    'by\n  have h : "sorry" = "sorry" := rfl\n  simp',
    "by\n  have h' := sorry_free_lemma\n  exact h'",
    "set_option maxHeartbeats 400000 in\nby\n  nlinarith [sq_nonneg (a - b)]",
    "by\n  exact Nat.le_of_lt_succ h₀  -- 'native' in prose is fine",
])
def test_honest_code_is_not_flagged(code):
    assert find_cheats(code) == []


def test_native_decide_allowed_by_option():
    assert find_cheats("by\n  native_decide", allow_native_decide=True) == []


def test_axiom_lists():
    assert parse_axioms("'t' depends on axioms: [propext,\n Classical.choice, Quot.sound]") == [
        "propext", "Classical.choice", "Quot.sound"]
    assert parse_axioms("'t' does not depend on any axioms") == []
    assert parse_axioms("unrelated") is None
    assert disallowed_axioms(["propext", "sorryAx", "Lean.ofReduceBool"]) == ["sorryAx", "Lean.ofReduceBool"]
    assert disallowed_axioms(["Lean.ofReduceBool"], allow_native_decide=True) == []


# ----------------------------------------------------------------------------------------------------
# Verdicts through the REPL stand-in
# ----------------------------------------------------------------------------------------------------
def test_registered_and_picklable():
    verifier = standin_verifier(timeout_s=7)
    clone = pickle.loads(pickle.dumps(verifier))
    assert type(clone).__name__ == "LeanVerifier" and clone.timeout_s == 7.0


def test_correct_proof_scores_one_with_axioms_listed():
    result = standin_verifier().verify("```lean\nsimp [h₀]\n```", STATEMENT, header=HEADER)
    assert result.correct and result.score == 1.0, result.info
    assert result.info["reason"] == "proof checked"
    assert result.info["axioms"] == ["Classical.choice", "Quot.sound", "propext"]  # sorted by the stand-in
    assert "NOT Lean" in result.info["standin"]


def test_lean_error_is_reported_with_position():
    result = standin_verifier().verify("```lean\nexact bogus\n```", STATEMENT, header=HEADER)
    assert not result.correct and result.score == 0.0
    # The statement spans 2 lines, so the stand-in puts the error on line 1 + 1 = 2, column 2.
    assert result.info["reason"] == "Lean error: 2:2: unknown identifier 'bogus'"


@pytest.mark.parametrize("code, reason", [
    # A sorry that reaches Lean (check_code skips the text scan): the warning/sorries entry rejects it.
    ("theorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := by\n  sorry\n", "proof contains sorry"),
    ("axiom my_ax : ∀ a b : ℕ, a = b\n\ntheorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := by\n  exact my_ax b a\n",
     "depends on axioms beyond propext, Classical.choice, Quot.sound: my_ax"),
    ("theorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := by\n  native_decide\n", "native_decide is not allowed"),
    ("theorem other (a b : ℕ) (h₀ : a = b) :\n  b = a := by\n  simp\n", "swap_eq is not in the environment"),
    ("instance : Add ℕ := ⟨Nat.mul⟩\n\ntheorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := by\n  simp\n",
     "statement changed: the theorem proved elaborates to a different type"),
])
def test_lean_side_checks_catch_what_text_checks_could_miss(code, reason):
    result = standin_verifier().check_code(code, STATEMENT, header=HEADER)
    assert not result.correct and reason in result.info["reason"], result.info


def test_sorry_in_a_helper_lemma_is_caught_by_the_axiom_check():
    code = ("theorem helper : ∀ a b : ℕ, a = b := by\n  sorry\n\n"
            "theorem swap_eq (a b : ℕ) (h₀ : a = b) :\n  b = a := by\n  exact helper b a\n")
    result = standin_verifier().check_code(code, STATEMENT, header=HEADER)
    # helper's sorry warning is already a reason to reject (the command reports it).
    assert not result.correct and "sorry" in result.info["reason"]


def test_instance_override_in_preamble_passes_text_checks_but_is_rejected():
    response = ("```lean\ninstance : Add ℕ := ⟨Nat.mul⟩\n\n"
                "theorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  simp\n```")
    result = standin_verifier().verify(response, STATEMENT, header=HEADER)
    assert result.info["reason"].startswith("statement changed"), result.info
    assert "[instance" in result.info["proved_type"] and "[instance" not in result.info["given_type"]


def test_helper_lemmas_allowed_by_default_and_refused_by_option():
    response = ("```lean\nlemma helper (x y : ℕ) (h : x = y) : y = x := by\n  simp [h]\n\n"
                "theorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  exact helper a b h₀\n```")
    assert standin_verifier().verify(response, STATEMENT, header=HEADER).correct
    refused = standin_verifier(allow_preamble=False).verify(response, STATEMENT, header=HEADER)
    assert not refused.correct and "code before the theorem" in refused.info["reason"]
    # Restating the header (imports, set_option, open) is not "code before the theorem".
    restated = f"```lean4\n{HEADER}theorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  simp\n```"
    assert standin_verifier(allow_preamble=False).verify(restated, STATEMENT, header=HEADER).correct


def test_native_decide_policy():
    response = "```lean\nnative_decide\n```"
    assert "native_decide" in standin_verifier().verify(response, STATEMENT, header=HEADER).info["reason"]
    allowed = standin_verifier(allow_native_decide=True).verify(response, STATEMENT, header=HEADER)
    assert allowed.correct and "Lean.ofReduceBool" in allowed.info["axioms"]


@pytest.mark.parametrize("response, reason", [
    ("```lean\nsimp\nsorry\n```", "proof contains sorry"),
    ("```lean\naxiom ax : False\ntheorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  exact ax.elim\n```",
     "new axiom"),
    ("```lean\nsimp\n\n#exit\n```", "#exit"),
    ("```lean\nset_option debug.skipKernelTC true in\ntheorem swap_eq (a b : ℕ) (h₀ : a = b) : b = a := by\n  simp\n```",
     "skipKernelTC"),
])
def test_cheating_responses_are_rejected_with_reason(response, reason):
    result = standin_verifier().verify(response, STATEMENT, header=HEADER)
    assert not result.correct and reason in result.info["reason"], result.info


def test_header_environment_is_reused_across_checks(tmp_path):
    log = tmp_path / "requests.log"
    verifier = standin_verifier("--log", str(log))
    for tactic in ("simp", "rfl", "omega"):
        assert verifier.verify(f"```lean\n{tactic}\n```", STATEMENT, header=HEADER).correct
    requests = log.read_text().splitlines()
    imports = [r for r in requests if '"env"' not in r]
    assert len(imports) == 1  # Mathlib "imported" once for three checks
    # Per check: proof + probe (2 requests); once: reference statement + its probe (2). 1 + 3*2 + 2 = 9.
    assert len(requests) == 9
    # The header's open/set_option lines are repeated before each proof, whatever the REPL does with scopes.
    assert requests[1].startswith('{"cmd": "set_option maxHeartbeats 0\\n\\nopen BigOperators Real Nat Topology Rat')


def test_header_may_come_with_the_statement_or_as_a_dict():
    verifier = standin_verifier()
    assert verifier.verify("```lean\nsimp\n```", HEADER + STATEMENT).correct
    assert verifier.verify("```lean\nsimp\n```", {"formal_statement": STATEMENT, "header": HEADER}).correct
    broken = verifier.verify("```lean\nsimp\n```", STATEMENT, header="import NoSuchLib\n")
    assert "header does not elaborate" in broken.info["reason"]


def test_timeout_scores_zero_and_the_next_check_runs_on_a_fresh_repl():
    verifier = standin_verifier(timeout_s=1)
    slow = verifier.verify("```lean\nloop_forever\n```", STATEMENT, header=HEADER)
    assert not slow.correct and slow.info["timed_out"] is True and "timed out after 1s" in slow.info["reason"]
    assert verifier.verify("```lean\nsimp\n```", STATEMENT, header=HEADER).correct


def test_crash_scores_zero_and_the_next_check_recovers():
    verifier = standin_verifier()
    crashed = verifier.verify("```lean\ncrash_now\n```", STATEMENT, header=HEADER)
    assert not crashed.correct and crashed.info["error_kind"] == "crash" and "exit code 3" in crashed.info["reason"]
    assert verifier.verify("```lean\nsimp\n```", STATEMENT, header=HEADER).correct


def test_memory_cap_scores_zero():
    verifier = standin_verifier(memory_mb=150)
    result = verifier.verify("```lean\neat_memory\n```", STATEMENT, header=HEADER)
    assert not result.correct and result.info["error_kind"] == "memory", result.info


def test_no_repl_found_is_a_clear_incorrect_not_an_exception(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no repl, no lake
    monkeypatch.delenv("REASONRL_LEAN_REPL", raising=False)
    result = get_verifier("lean").verify("```lean\nsimp\n```", STATEMENT, header=HEADER)
    assert not result.correct and result.info["reason"].startswith("no Lean REPL found: ")
    missing = get_verifier("lean", repl_command=["/nonexistent/repl"]).verify("```lean\nsimp\n```", STATEMENT)
    assert missing.info["reason"].startswith("no Lean REPL found: ")


@pytest.mark.parametrize("response, ground_truth", [
    (None, STATEMENT), (12, STATEMENT), ("```lean\nsimp\n```", None), ("```lean\nsimp\n```", "def x := 1"),
])
def test_bad_inputs_score_zero_without_raising(response, ground_truth):
    result = standin_verifier().verify(response, ground_truth, header=HEADER)
    assert not result.correct and result.info["reason"]


def _verify_in_spawned_process(args):
    response, statement = args
    return standin_verifier().verify(response, statement, header=HEADER).to_dict()


def test_runs_in_a_spawned_worker_process_like_the_verifier_pool():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        results = pool.map(_verify_in_spawned_process, [("```lean\nsimp\n```", STATEMENT),
                                                        ("```lean\nexact bogus\n```", STATEMENT)])
    assert [r["correct"] for r in results] == [True, False]


# ----------------------------------------------------------------------------------------------------
# miniF2F recipe
# ----------------------------------------------------------------------------------------------------
def test_minif2f_rows_follow_the_schema(data_dir):
    from reasonrl.datasets.common import check_row
    from reasonrl.datasets.minif2f import build_rows

    rows = build_rows("valid", data_dir)
    assert len(rows) == 244
    row = rows[0]
    check_row(row, "row 0")
    assert row["data_source"] == "minif2f" and row["verifier"] == "lean" and row["ability"] == "theorem_proving"
    assert row["reward_model"]["ground_truth"].startswith("theorem aimeII_2001_p3")
    assert row["extra_info"] == {"split": "valid", "index": 0, "name": "aimeII_2001_p3", "header": HEADER}
    assert row["reward_model"]["ground_truth"] in row["prompt"][0]["content"]
    assert build_rows("val", data_dir)[5] == rows[5]  # "val" is an alias of "valid"


def test_minif2f_missing_inputs_raise_clear_errors(tmp_path):
    from reasonrl.datasets.minif2f import build_rows

    with pytest.raises(FileNotFoundError, match="minif2f_lean4_test.jsonl"):
        build_rows("test", tmp_path)
    with pytest.raises(FileNotFoundError):
        build_rows("test", None)
    with pytest.raises(ValueError, match="splits"):
        build_rows("train", tmp_path)


# ----------------------------------------------------------------------------------------------------
# Real Lean (only where a REPL is installed)
# ----------------------------------------------------------------------------------------------------
REAL_REPL = shutil.which("repl") or shutil.which("lake") or os.environ.get("REASONRL_LEAN_REPL")
needs_lean = needs("a Lean REPL", bool(REAL_REPL), "no Lean REPL on PATH (`repl`/`lake`/REASONRL_LEAN_REPL): "
                                                      "real Lean checking cannot run on this machine")
CORE_STATEMENT = "theorem add_comm' (a b : Nat) : a + b = b + a := by"


@pytest.mark.lean
@needs_lean
def test_real_lean_accepts_a_core_proof():
    result = get_verifier("lean", timeout_s=300).verify("```lean\nexact Nat.add_comm a b\n```", CORE_STATEMENT,
                                                        header="")
    assert result.correct, result.info


@pytest.mark.lean
@needs_lean
@pytest.mark.parametrize("code, reason", [
    ("theorem add_comm' (a b : Nat) : a + b = b + a := by\n  sorry\n", "sorry"),
    ("axiom ax (a b : Nat) : a + b = b + a\ntheorem add_comm' (a b : Nat) : a + b = b + a := ax a b\n",
     "beyond propext, Classical.choice, Quot.sound: ax"),
    ("theorem add_comm' (a b : Nat) : a + b = b + a := by\n  exact bogus\n", "Lean error"),
])
def test_real_lean_rejects(code, reason):
    result = get_verifier("lean", timeout_s=300).check_code(code, CORE_STATEMENT, header="")
    assert not result.correct and reason in result.info["reason"], result.info


@pytest.mark.lean
@needs_lean
def test_real_lean_native_decide_is_caught_by_axioms():
    statement = "theorem small : 10 < 20 := by"
    result = get_verifier("lean", timeout_s=300).check_code(statement + "\n  native_decide\n", statement, header="")
    assert not result.correct and "native_decide" in result.info["reason"], result.info
