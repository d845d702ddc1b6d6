"""The math verifier: extraction, normalisation, equivalence, robustness, gold caching; the MATH recipe."""
from __future__ import annotations

import json
from fractions import Fraction

import pytest

from reasonrl.verifiers import get_verifier
from reasonrl.verifiers.math import MathVerifier, parse_gold
from reasonrl.verifiers.math_extract import extract_answer, last_boxed, last_number
from reasonrl.verifiers.math_normalize import normalize_answer, parse_number


@pytest.fixture(scope="module")
def verifier() -> MathVerifier:
    return get_verifier("math")


# -- extraction -------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, answer, method", [
    ("First 1, then \\boxed{3}. Finally \\boxed{72}.", "72", "boxed"),             # the last box wins
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}", "boxed"),           # nested braces
    ("so \\boxed{\\frac{a}{b", None, "unclosed_box"),                             # cut off: no answer
    ("\\fbox{12}", "12", "boxed"),
    ("\\boxed 5 is it", "5", "boxed"),
    ("$\\boxed{1}$, $\\boxed{2}$ and $\\boxed{3}$", "1, 2, 3", "boxed"),          # one list of boxes
    ("48 + 24 = 72\n#### 72", "72", "gsm8k"),
    ("The answer is 72.", "72", "answer_phrase"),
    ("Final Answer: The final answer is $14{,}916$. I hope it is correct.", "$14{,}916$", "answer_phrase"),
    ("\\boxed{255} in the example.\nFinal answer: 10455", "255", "boxed"),  # a box: prose after it is not read
    ("\\boxed{}. The answer is 14.", "14", "answer_phrase"),                  # an empty box states nothing
    ("Work...\nSo the volume is 120 cubic units", "120", "final_line"),
    ("Work...\n$\\frac{3}{4}$", "$\\frac{3}{4}$", "final_line"),
    ("I could not solve this problem, sorry about that.", None, "none"),
    ("", None, "none"),
])
def test_extract_answer(response, answer, method):
    assert extract_answer(response) == (answer, method)


def test_last_boxed_and_last_number():
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{(1, 2)}\n\nlater \\boxed{(3,4)}") == "(3,4)"  # a blank line ends a list
    assert last_number("12 apples and 3/4 of 1,000") == "1,000"
    assert last_number("p = 2/3") == "2/3"


# -- normalisation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, normalized", [
    ("1,000", "1000"),
    ("$1,000.50", "1000.5"),             # currency + thousands + trailing zero
    ("\\$18.00", "18"),
    ("50\\%", "50"),
    ("90^\\circ", "90"),
    ("10\\text{ cm}^2", "10"),
    ("12 dollars", "12"),
    ("x = 5", "5"),                      # a numeric assignment
    ("y = 2x + 1", "y = 2x + 1"),        # an equation stays an equation
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "( 3, \\frac{\\pi}{2} )"),
    ("11,\\! 111,\\! 100", "11111100"),
    ("0.250", "0.25"),
])
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_parse_number_fast_path():
    assert parse_number("-1000.5") == Fraction(-2001, 2)
    assert parse_number("3/4") == Fraction(3, 4)
    assert parse_number("\\frac{3}{4}") == Fraction(3, 4)
    assert parse_number("\\frac34") == Fraction(3, 4)
    assert parse_number("2\\frac{1}{2}") == Fraction(5, 2)      # mixed number: 2 + 1/2
    assert parse_number("1/0") is None and parse_number("x+1") is None


# -- equivalence ------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, gold, correct", [
    ("so \\boxed{72}", "72", True),
    ("#### 72", "72", True),
    ("The answer is 72.", "72", True),
    ("#### 1000", "1,000", True),                                    # GSM8K gold with separators
    ("The answer is $1,000.00.", "1000", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),                          # fast path: 1/2 == 0.5 exactly
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", True),  # sympy: sqrt(2)/2 == 1/sqrt(2)
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("\\boxed{(x+2)(x-2)}", "x^2-4", True),
    ("\\boxed{50\\%}", "50", True),
    ("\\boxed{73}", "72", False),
    ("\\boxed{0.3333}", "\\frac{1}{3}", False),                      # exact answers stay exact
    ("\\boxed{1 + \\frac{1}{e}}", "1 - \\frac{1}{e}", False),        # known math-verify false positive
    ("\\boxed{1 + \\frac{1}{\\mathrm{e}}}", "1 - \\frac{1}{\\mathrm{e}}", False),
    ("\\boxed{\\frac{1}{2006!}}", "\\frac{1}{2004!}", False),        # known false positive: both ~0
    ("\\boxed{\\frac{1}{2004!}}", "\\frac{1}{2004!}", True),
])
def test_verify_equivalence(verifier, response, gold, correct):
    result = verifier.verify(response, gold)
    assert result.correct is correct and result.score == (1.0 if correct else 0.0)
    assert "extracted" in result.info and result.info["reason"]


# A response that boxes one answer and states another is read by its (last) box: never credited for either.
# (gold, response, credited); each pair of lines differs only in the gold.
HEDGES = [
    ("14", "\\boxed{12}. Hmm, no wait, the answer is 14.", False),      # boxed wrong, prose right: the box is read
    ("12", "\\boxed{12}. Hmm, no wait, the answer is 14.", True),       # boxed right, prose wrong: the box is read
    ("14", "\\boxed{12}\nFinal answer: 14", False),                     # a "final answer" phrase after the box too
    ("14", "\\boxed{12}\n#### 14", False),                              # and a #### line after the box
    ("12", "\\boxed{12}\n#### 14", True),
    ("14", "\\boxed{12}.\nNo wait, it is \\boxed{14}.", True),         # two boxes on two lines: the last one
    ("12", "\\boxed{12}.\nNo wait, it is \\boxed{14}.", False),
    ("14", "\\boxed{12} or \\boxed{14}", False),                       # two boxes as one list: "12, 14" is not 14
    ("12", "\\boxed{12} or \\boxed{14}", False),
    ("14", "Hmm, no wait, the answer is 14.", True),                      # nothing boxed: the prose is the answer
]


@pytest.mark.parametrize("gold, response, credited", HEDGES)
def test_a_boxed_answer_is_the_answer_and_prose_after_it_is_not_a_second_one(verifier, gold, response, credited):
    result = verifier.verify(response, gold)
    assert result.correct is credited, result.info


@pytest.mark.parametrize("response", [None, 123, "", "   ", "\\boxed{", "}}}{{{", "\\boxed{\\frac{}{}}", "x" * 50_000])
def test_bad_responses_score_zero_with_a_reason(verifier, response):
    result = verifier.verify(response, "72")
    assert result.score == 0.0 and not result.correct and result.info["reason"]


def test_empty_ground_truth_is_a_recorded_zero(verifier):
    assert verifier.verify("\\boxed{1}", "").info["reason"] == "empty ground truth"
    assert verifier.verify("\\boxed{1}", None).score == 0.0


def test_gold_is_parsed_once_for_the_samples_of_a_prompt(verifier):
    parse_gold.cache_clear()
    results = verifier.verify_many(["\\boxed{\\frac{2}{4}}", "\\boxed{0.5}", "\\boxed{1}", "#### 0.5"], "\\frac12")
    assert [r.correct for r in results] == [True, True, False, True]
    info = parse_gold.cache_info()
    assert (info.misses, info.hits) == (1, 3)  # four responses, one parse


def test_options(verifier):
    loose = get_verifier("math", fallback_last_number=False)
    flexible = verifier.verify("we get 12 apples and no conclusion", "12")  # GSM8K "flexible": last number
    assert flexible.correct and flexible.info["method"] == "last_number"
    assert loose.verify("we get 12 apples and no conclusion", "12").info["method"] == "math_verify_extract"
    assert get_verifier("math", float_rounding=2).float_rounding == 2


def test_require_marked_answer_credits_only_a_marked_one(verifier):
    strict = get_verifier("math", require_marked_answer=True)
    # the search task's case: the right year stated on the final line, no mark. Read by default (and still read, as
    # the final line, with fallback_last_number=false); scored 0 when a mark is required
    ramble = "The search says the city was founded in 1204.\n1204"
    assert verifier.verify(ramble, "1204").correct
    assert get_verifier("math", fallback_last_number=False).verify(ramble, "1204").correct
    unmarked = strict.verify(ramble, "1204")
    assert (unmarked.score, unmarked.info["method"]) == (0.0, "final_line")
    assert unmarked.info["reason"].startswith("no marked answer")
    assert strict.verify("we get 12 apples and no conclusion", "12").score == 0.0  # the last number: not read
    # marked answers are read as before: a box, an answer phrase, a #### line; a wrong marked one is still wrong
    for marked in ("so \\boxed{1204}", "The answer is 1204.", "#### 1204"):
        assert strict.verify(marked, "1204").correct, marked
    assert not strict.verify("\\boxed{1205}", "1204").correct


def test_answer_kind_number_refuses_the_question_restated(verifier):
    # arith_chain's first held-out row: "What is 28 - 72 + 61?", 17. By default the answer's arithmetic is evaluated,
    # so the question copied into the box, before an empty box, alone on the final line, or as both sides of an
    # equation is credited; with answer_kind=number only a stated plain number is
    number = get_verifier("math", answer_kind="number")
    for copied in ("\\boxed{28 - 72 + 61}", "28 - 72 + 61 = \\boxed{}", "28 - 72 + 61",
                   "28 - 72 + 61 = 17 = 28 - 72 + 61"):
        assert verifier.verify(copied, "17").correct, copied
        refused = number.verify(copied, "17")
        assert refused.score == 0.0 and refused.info["reason"].startswith("not a number"), copied
        assert verifier.verify(copied, "17", answer_kind="number").score == 0.0  # the row's extra_info wins
    # a number stated alone, or as an equation's last side (only that side is compared), is credited
    for stated in ("28 - 72 = -44, -44 + 61 = 17, so \\boxed{17}", "The answer is 17.", "\\boxed{17.0}", "#### 17",
                   "\\boxed{28 - 72 + 61 = 17}", "So 28 - 72 + 61 = 17"):
        assert number.verify(stated, "17").correct, stated
    assert not number.verify("28 - 72 + 61 = 18", "17").correct
    assert number.verify("\\boxed{-55}", "-55").correct and not number.verify("\\boxed{55}", "-55").correct
    assert number.verify("\\boxed{3/4}", "0.75").correct  # a fraction is one number
    assert get_verifier("math", answer_kind="number").verify("\\boxed{17}", "17", answer_kind="any").correct
    with pytest.raises(ValueError, match="answer_kind must be one of any, number, got 'int'"):
        get_verifier("math", answer_kind="int")
    with pytest.raises(ValueError, match="extra_info.answer_kind must be one of any, number, got 'digits'"):
        verifier.verify("\\boxed{17}", "17", answer_kind="digits")


# -- fidelity on the real answer files -------------------------------------------------------------
def test_every_math500_solution_verifies_against_its_own_answer(verifier, data_dir):
    rows = [json.loads(line) for line in open(data_dir / "math500_test.jsonl")]
    wrong = [r["unique_id"] for r in rows if not verifier.verify(r["solution"], r["answer"]).correct]
    assert wrong == []


def test_shifted_math500_answers_are_rejected(verifier, data_dir):
    # Answer i checked against gold i+1: correct only where the two golds are the same answer.
    rows = [json.loads(line) for line in open(data_dir / "math500_test.jsonl")][:120]
    for gold_row, other in zip(rows, rows[1:]):
        result = verifier.verify(f"so \\boxed{{{other['answer']}}}", gold_row["answer"])
        same = normalize_answer(other["answer"]) == normalize_answer(gold_row["answer"])
        assert result.correct == same, (gold_row["answer"], other["answer"], result.info)


def test_gsm8k_solutions_verify(verifier, data_dir):
    rows = [json.loads(line) for line in open(data_dir / "gsm8k_test.jsonl")]
    assert all(verifier.verify(r["answer"], r["answer"].split("####")[-1].strip()).correct for r in rows)


# -- the MATH recipe --------------------------------------------------------------------------------
def test_math500_rows_follow_the_schema(data_dir):
    from reasonrl.datasets import check_row
    from reasonrl.datasets.math import build_rows

    rows = build_rows("test", data_dir)
    assert len(rows) == 500
    for i, row in enumerate(rows):
        check_row(row, f"row {i}")
    first = rows[0]  # test/precalculus/807.json: (0,3) in polar coordinates
    assert first["data_source"] == "math500" and first["verifier"] == "math" and first["ability"] == "math"
    assert first["reward_model"] == {"style": "rule", "ground_truth": "\\left( 3, \\frac{\\pi}{2} \\right)"}
    assert first["extra_info"]["subject"] == "Precalculus" and first["extra_info"]["level"] == 2
    assert first["extra_info"]["index"] == 0 and first["extra_info"]["split"] == "test"
    assert first["prompt"][0]["content"].endswith("put the final answer within \\boxed{}.")


def test_math_train_offline_names_the_file_it_needs(tmp_path, monkeypatch):
    from reasonrl.datasets.math import build_rows

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="math_train.jsonl"):
        build_rows("train", tmp_path)
    with pytest.raises(FileNotFoundError, match="math_train.jsonl"):
        build_rows("train", None)


def test_math_train_from_a_local_file(tmp_path):
    from reasonrl.datasets.math import build_rows

    examples = [  # hendrycks format (answer inside the solution) and prm800k format (explicit answer)
        {"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1", "type": "Algebra"},
        {"problem": "Half of 1?", "solution": "...", "answer": "\\frac{1}{2}", "level": 2, "subject": "Prealgebra"},
    ]
    (tmp_path / "math_train.jsonl").write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    rows = build_rows("train", tmp_path)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "\\frac{1}{2}"]
    assert [(r["extra_info"]["subject"], r["extra_info"]["level"]) for r in rows] == [("Algebra", 1), ("Prealgebra", 2)]


def test_task_math_offline_validates_on_math500_and_training_names_its_file(data_dir, tmp_path, monkeypatch):
    from reasonrl.datasets import DataError, read_rows, task_files

    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REASONRL_DATA_DIR", str(data_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (val_file,) = task_files("math", "val")
    rows = read_rows(val_file)
    assert len(rows) == 500 and rows[0]["data_source"] == "math500"
    with pytest.raises(DataError, match="math_train.jsonl"):
        task_files("math", "train")
