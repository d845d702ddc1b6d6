"""Rewards: from a dataset row and a response to a score, through the sources the row names.

``verify_item`` builds a row's item, ``make_pool`` the router that scores items (the rule verifier pool, a reward
model on its own Ray actors, an LLM judge endpoint, a remote endpoint; combined per row), ``verifier_for`` the name a
row's rewards are logged under, ``check_verifiers`` the check of a data split before anything loads.
docs/rewards.md describes the sources, the per-row combination and the failure rules.
"""
from __future__ import annotations

from typing import Any, Optional

from reasonrl.config.reward_sources_schema import reward_sources
from reasonrl.config.schema import RewardConfig

from .items import (SOURCE_LABELS, RewardItem, check_verifiers, prompt_messages, prompt_text, rule_verifier_for,
                    source_label, sources_for, verifier_for, verify_item)
from .router import RewardRouter, combine

__all__ = ["RewardItem", "RewardRouter", "SOURCE_LABELS", "check_verifiers", "combine", "make_pool",
           "prompt_messages", "prompt_text", "rule_verifier_for", "source_label", "sources_for", "verifier_for",
           "verify_item"]


def make_pool(reward: RewardConfig, layout: Optional[Any] = None) -> RewardRouter:
    """The reward router a run uses, built from the ``reward`` section of its config: the rule verifier pool, plus
    each source that is configured (``reward.model.path``, ``reward.judge.url``, ``reward.remote.url``). ``layout``:
    the run's ``controller.layout.Layout`` (``check_layout``), whose ``reward_model`` pool the reward model's actors
    take; None gives the reward model one worker (a GPU of its own when the cluster has GPUs)."""
    from reasonrl.verifiers import VerifierPool

    typed = reward_sources(reward)
    sources: dict = {"rule": VerifierPool(workers=reward.workers, timeout_s=reward.timeout_s,
                                          verifier_options=dict(reward.verifier_options) or None,
                                          score_range=reward.score_range)}
    try:
        if typed.judge.url:
            from .judge import JudgeSource

            sources["judge"] = JudgeSource(typed.judge, reward.score_range)
        if typed.remote.url:
            from .remote import RemoteRewardSource

            sources["remote"] = RemoteRewardSource(typed.remote, reward.score_range)
        if typed.model.path:
            from .reward_model import RewardModelSource

            sources["model"] = RewardModelSource(typed.model, reward.score_range, layout)
    except BaseException:
        for backend in sources.values():
            backend.close()
        raise
    return RewardRouter(sources)
