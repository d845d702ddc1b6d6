"""``bench_random``: a reward for the GPU step benchmark's random-weight model, which writes no answers.

The score is a fixed function of the response text (the first 8 bytes of its SHA-256 as a fraction of 2^64), so it
costs microseconds, spreads over [0, 1) within every group (GRPO's advantages are not all zero) and is the same on
every run. Found by the trainer and its verifier pool through the ``reasonrl.verifiers`` entry point of the
``reasonrl_bench_reward-0.1.dist-info`` beside this file, once ``benchmarks/plugins`` is on ``sys.path``.
"""
from __future__ import annotations

import hashlib

from reasonrl.verifiers import Verifier, VerifyResult


class RandomRewardVerifier(Verifier):
    """Score = a hash of the response in [0, 1); correct when it is at least 0.5."""

    def verify(self, response, ground_truth, **extra) -> VerifyResult:
        digest = hashlib.sha256(str(response).encode()).digest()
        score = int.from_bytes(digest[:8], "big") / 2.0 ** 64
        return VerifyResult(score=score, correct=score >= 0.5, info={"reason": "benchmark: random reward"})
