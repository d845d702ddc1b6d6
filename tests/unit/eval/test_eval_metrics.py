"""pass@k against exact combinatorics; maj@k and the summary on hand-made cases."""
from fractions import Fraction
from math import comb

import pytest

from reasonrl.eval.metrics import (ProblemOutcome, maj_at_k, majority_vote, metric_block, pass_at_k, summarize)


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """1 - C(n-c, k) / C(n, k) in exact rational arithmetic (math.comb gives 0 when n-c < k)."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


@pytest.mark.parametrize("n", list(range(1, 21)) + [50, 100])
def test_pass_at_k_matches_exact_combinatorics_for_every_c_and_k(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_values():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=10, c=3, k=4: 1 - C(7,4)/C(10,4) = 1 - 35/210 = 5/6
    assert pass_at_k(10, 3, 4) == pytest.approx(5 / 6)
    # k=1 is the plain fraction correct: n=16, c=5 -> 5/16
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)


def test_pass_at_k_edge_cases_n_equals_k_c_zero_c_n():
    # n = k: the only k-subset is all samples, so pass@n is 1 iff any sample is correct.
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0
    # c = 0: never passes, for any k.
    assert all(pass_at_k(16, 0, k) == 0.0 for k in range(1, 17))
    # c = n: always passes, for any k.
    assert all(pass_at_k(16, 16, k) == 1.0 for k in range(1, 17))
    # n = k = c = 1
    assert pass_at_k(1, 1, 1) == 1.0


def test_pass_at_k_large_n_stays_accurate():
    # C(1000, 500) has ~300 digits: the product form must still match the exact value.
    for c in (1, 7, 500, 993):
        assert pass_at_k(1000, c, 500) == pytest.approx(float(exact_pass_at_k(1000, c, 500)), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_majority_vote_most_votes_wins():
    # "4" has 2 votes against 1 for "5"; the first "4" (sample 0) is correct.
    assert majority_vote(["4", "5", "4"], [True, False, True]) == ("4", True)
    assert maj_at_k(["5", "4", "5"], [False, True, False], 3) == 0.0


def test_majority_vote_tie_goes_to_the_earliest_answer():
    # One vote each: the answer voted first wins, whatever the sort order of the strings.
    assert majority_vote(["5", "4"], [False, True]) == ("5", False)
    assert majority_vote(["4", "5"], [True, False]) == ("4", True)
    # 2-2 tie between "b" (first at 1) and "a" (first at 2): "b" wins.
    assert majority_vote([None, "b", "a", "a", "b"], [False, True, False, False, True]) == ("b", True)


def test_maj_at_k_uses_the_first_k_samples():
    answers, correct = ["5", "4", "4"], [False, True, True]
    assert maj_at_k(answers, correct, 1) == 0.0  # only "5"
    assert maj_at_k(answers, correct, 2) == 0.0  # "5" vs "4" tie -> "5" (earliest)
    assert maj_at_k(answers, correct, 3) == 1.0  # "4" has 2 votes


def test_samples_without_an_answer_do_not_vote():
    # Two unparsable samples (None, "") cast no vote, so the single "7" wins.
    assert majority_vote([None, "", "7"], [False, False, True]) == ("7", True)
    assert majority_vote([None, "  "], [False, False]) == (None, False)
    assert maj_at_k([None, None], [False, False], 2) == 0.0


def test_votes_compare_stripped_strings_and_use_the_first_voters_verdict():
    assert majority_vote([" 7", "7 ", "8"], [True, True, False]) == ("7", True)
    # Inconsistent verdicts for one answer: the first sample that voted for it decides.
    assert majority_vote(["7", "7"], [False, True]) == ("7", False)


def test_metric_block_and_breakdowns_by_hand():
    p1 = ProblemOutcome(correct=[True, False], answers=["1", "2"], timed_out=[False, False],
                        groups={"data_source": "a", "level": "2"})
    p2 = ProblemOutcome(correct=[False, False], answers=[None, "3"], timed_out=[True, False],
                        groups={"data_source": "a", "level": "10"})
    p3 = ProblemOutcome(correct=[True, True], answers=["5", "5"], timed_out=[False, False],
                        groups={"data_source": "b", "level": "2"})
    s = summarize([p1, p2, p3], [1, 2])
    o = s["overall"]
    # 3 correct of 6 samples; one timeout.
    assert (o["problems"], o["samples"], o["correct"], o["timed_out"]) == (3, 6, 3, 1)
    assert o["mean_accuracy"] == pytest.approx(0.5)
    # pass@1 per problem: 1/2, 0, 1 -> mean 1/2; pass@2: 1, 0, 1 -> 2/3.
    assert o["pass@1"] == pytest.approx(0.5)
    assert o["pass@2"] == pytest.approx(2 / 3)
    # maj@1: "1" ok, None -> 0, "5" ok -> 2/3; maj@2: p1 tie -> "1" ok, p2 "3" wrong, p3 ok -> 2/3.
    assert o["maj@1"] == pytest.approx(2 / 3)
    assert o["maj@2"] == pytest.approx(2 / 3)
    assert list(s["by_data_source"]) == ["a", "b"]
    assert s["by_data_source"]["a"]["pass@2"] == pytest.approx(0.5)
    assert s["by_data_source"]["b"]["mean_accuracy"] == 1.0
    # levels sort numerically ("2" before "10"); no problem has a subject, so there is no by_subject.
    assert list(s["by_level"]) == ["2", "10"]
    assert s["by_level"]["2"]["problems"] == 2 and s["by_level"]["2"]["pass@1"] == pytest.approx(0.75)
    assert "by_subject" not in s


def test_metric_block_of_no_problems_is_zero_not_an_error():
    assert metric_block([], [1])["pass@1"] == 0.0
