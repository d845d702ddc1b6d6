"""An example third-party verifier: multiple-choice answers.

Installed with ``pip install examples/custom_verifier``, it is found through the ``reasonrl.verifiers``
entry-point group (see this package's pyproject.toml) by ``get_verifier("choice")``, by the
VerifierPool workers, and by a training config with ``reward.verifier=choice``.
"""
from __future__ import annotations

import re
from typing import Any

from reasonrl.verifiers import Verifier, VerifyResult

_CHOICE_PATTERNS = (
    re.compile(r"\\boxed\{\s*\(?([A-Z])\)?\s*\}"),                          # \boxed{C} or \boxed{(C)}
    re.compile(r"answer\s*(?:is|:)\s*\(?([A-Z])\)?(?![A-Za-z])", re.IGNORECASE),  # "the answer is (C)"
    re.compile(r"^\s*\(?([A-Z])\)?[.)]?\s*$", re.MULTILINE),                # a line holding only "C" / "(C)"
)


class MultipleChoiceVerifier(Verifier):
    """Scores 1.0 when the response's chosen letter equals the gold letter.

    Options:
        choices: the letters that count as choices (default "ABCDE").
    """

    def __init__(self, choices: str = "ABCDE", **options: Any) -> None:
        super().__init__(choices=choices, **options)
        self.choices = str(choices).upper()

    def extract_choice(self, response: str):
        """The last choice letter the response commits to, or None."""
        for pattern in _CHOICE_PATTERNS:
            letters = [m.group(1).upper() for m in pattern.finditer(response)
                       if m.group(1).upper() in self.choices]
            if letters:
                return letters[-1]
        return None

    def verify(self, response: str, ground_truth: Any, **extra: Any) -> VerifyResult:
        """Compare the extracted letter with ``ground_truth`` (a letter such as "C")."""
        if not isinstance(response, str):
            return VerifyResult.incorrect("response is not a string", extracted=None)
        gold = str(ground_truth).strip().strip("()").upper()
        if gold not in self.choices or len(gold) != 1:
            return VerifyResult.incorrect(f"ground truth {ground_truth!r} is not one of {self.choices}",
                                          extracted=None)
        choice = self.extract_choice(response)
        if choice is None:
            return VerifyResult.incorrect("no choice letter found", extracted=None)
        correct = choice == gold
        return VerifyResult(score=1.0 if correct else 0.0, correct=correct,
                            info={"extracted": choice, "reason": "choice matches" if correct else "wrong choice"})
