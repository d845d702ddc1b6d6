"""``rule``: the registered verifiers (math, code, lean, plugins), scored in the VerifierPool's worker processes.

Its settings are the ``reward`` section's own keys (``reward.workers``, ``reward.timeout_s``,
``reward.verifier_options``, ``reward.score_range``); it is always on. A row's outcome is logged under its verifier's
name, and in a row with several sources its verdict is the row's ``correct``.
"""
from __future__ import annotations

from typing import Any, Dict, List

from .items import rule_verifier_for
from .registry import RewardSource, register_reward_source


@register_reward_source("rule")
class RuleSource(RewardSource):
    """The VerifierPool, as a reward source (the pool takes plain ``(verifier, response, ground_truth, extra)``
    tuples and counts its own ``verify/*`` metrics)."""

    order = 0
    settings_key = None
    decides_correct = True
    counted = False

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    @classmethod
    def label_for(cls, row: Dict[str, Any], reward: Any) -> str:
        return rule_verifier_for(row, reward)

    @classmethod
    def from_config(cls, settings: Any, reward: Any, layout: Any = None) -> "RuleSource":
        from reasonrl.verifiers import VerifierPool

        return cls(VerifierPool(workers=reward.workers, timeout_s=reward.timeout_s,
                                verifier_options=dict(reward.verifier_options) or None,
                                score_range=reward.score_range))

    def submit(self, items: List[Any]) -> Any:
        return self.pool.submit([item.pool_item() for item in items])  # the pool takes plain 4-tuples

    def pop_stats(self) -> Dict[str, float]:
        return self.pool.pop_stats()

    def close(self) -> None:
        self.pool.close()
