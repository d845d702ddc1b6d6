"""Evaluation metrics: pass@k (unbiased estimator), maj@k (majority vote), mean accuracy, and breakdowns.

Pure Python; no torch. Everything here works on per-problem lists of verdicts and extracted answers.

pass@k
    The unbiased estimator of Chen et al. (2021): with ``n`` samples of which ``c`` are correct,
    ``pass@k = 1 - C(n-c, k) / C(n, k)``, the chance that a random k-subset of the n samples holds at least one
    correct sample. It is computed in the product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which never builds
    the (huge) binomial coefficients.

maj@k
    Majority vote over the extracted answers of the **first k samples** (in sample order). Rules:

    * an answer is the verifier's extracted answer, compared as a string after stripping surrounding whitespace;
      a sample with no extracted answer (None or empty, e.g. a verification timeout or an unparsable response)
      casts no vote;
    * the answer with the most votes wins; a tie is broken in favour of the answer whose first vote came
      earliest (the lowest sample index) — deterministic and independent of hashing or sort order of answers;
    * the vote is correct when the first sample that voted for the winning answer was verified correct;
    * no votes at all scores 0.

mean accuracy
    The fraction of all samples verified correct (the same as pass@1 averaged over problems when every problem has
    the same n).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

BREAKDOWN_KEYS = ("data_source", "subject", "level")
"""Row fields the summary is broken down by, when problems carry them."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct (needs 0 <= c <= n, 1 <= k <= n)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def normalize_answer(answer: Any) -> Optional[str]:
    """The vote key of an extracted answer: its string form stripped of whitespace; None when empty/missing."""
    if answer is None:
        return None
    text = str(answer).strip()
    return text or None


def majority_vote(answers: Sequence[Any], correct: Sequence[bool]) -> Tuple[Optional[str], bool]:
    """``(winning answer, its verdict)`` over all given samples, by the rules in the module docstring."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} verdicts")
    votes: Dict[str, int] = {}
    first_index: Dict[str, int] = {}
    for i, answer in enumerate(answers):
        key = normalize_answer(answer)
        if key is None:
            continue
        votes[key] = votes.get(key, 0) + 1
        first_index.setdefault(key, i)
    if not votes:
        return None, False
    winner = min(votes, key=lambda a: (-votes[a], first_index[a]))
    return winner, bool(correct[first_index[winner]])


def maj_at_k(answers: Sequence[Any], correct: Sequence[bool], k: int) -> float:
    """1.0 when the majority vote over the first ``k`` samples is correct, else 0.0."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= n, got n={len(answers)}, k={k}")
    return 1.0 if majority_vote(answers[:k], correct[:k])[1] else 0.0


@dataclass
class ProblemOutcome:
    """The verified samples of one problem, as the metrics need them."""

    correct: List[bool]
    """Verdict of each sample, in sample order."""
    answers: List[Optional[str]]
    """Extracted answer of each sample (None when none was extracted)."""
    timed_out: List[bool] = field(default_factory=list)
    """Whether each sample's verification timed out (such samples count as incorrect)."""
    failed: List[bool] = field(default_factory=list)
    """Whether each sample got no verdict (a timeout, a crash, a non-finite score: counted as incorrect, and apart)."""
    groups: Dict[str, str] = field(default_factory=dict)
    """Breakdown keys of the problem, e.g. {"data_source": "openai/gsm8k", "level": "3"}."""


def metric_block(outcomes: Sequence[ProblemOutcome], ks: Iterable[int]) -> Dict[str, Any]:
    """Metrics over a set of problems: counts, mean accuracy, pass@k and maj@k (means over problems)."""
    ks = list(ks)
    num_samples = sum(len(o.correct) for o in outcomes)
    block: Dict[str, Any] = {
        "problems": len(outcomes),
        "samples": num_samples,
        "correct": sum(sum(bool(x) for x in o.correct) for o in outcomes),
        "timed_out": sum(sum(bool(x) for x in o.timed_out) for o in outcomes),
        "failed": sum(sum(bool(x) for x in o.failed) for o in outcomes),
    }
    block["mean_accuracy"] = block["correct"] / num_samples if num_samples else 0.0
    for k in ks:
        values = [pass_at_k(len(o.correct), sum(bool(x) for x in o.correct), k) for o in outcomes]
        block[f"pass@{k}"] = sum(values) / len(values) if values else 0.0
    for k in ks:
        values = [maj_at_k(o.answers, o.correct, k) for o in outcomes]
        block[f"maj@{k}"] = sum(values) / len(values) if values else 0.0
    return block


def _sort_key(value: str) -> Tuple[int, Any]:
    """Numbers in numeric order before other strings ("2" < "10" < "Level 1")."""
    try:
        return (0, float(value))
    except ValueError:
        return (1, value)


def summarize(outcomes: Sequence[ProblemOutcome], ks: Iterable[int]) -> Dict[str, Any]:
    """``{"overall": block, "by_<key>": {value: block}}`` for each breakdown key some problem carries."""
    ks = list(ks)
    summary: Dict[str, Any] = {"overall": metric_block(outcomes, ks)}
    for key in BREAKDOWN_KEYS:
        groups: Dict[str, List[ProblemOutcome]] = {}
        for o in outcomes:
            if o.groups.get(key) is not None:
                groups.setdefault(str(o.groups[key]), []).append(o)
        if groups:
            summary[f"by_{key}"] = {v: metric_block(groups[v], ks) for v in sorted(groups, key=_sort_key)}
    return summary
