"""Rewards: from a dataset row and a response to a score, through the sources the row names.

``verify_item`` builds a row's item, ``make_pool`` the router that scores items (each registered ``RewardSource`` the
run turns on: the rule verifier pool, a reward model on its own Ray actors, an LLM judge endpoint, a remote endpoint,
a plugin's source; combined per row), ``verifier_for`` the name a row's rewards are logged under, ``check_verifiers``
the check of a data split before anything loads. docs/rewards.md describes the sources, the per-row combination, the
failure rules and how a plugin registers a source.
"""
from __future__ import annotations

from typing import Any, Optional

from reasonrl.config.schema import RewardConfig

from .items import (RewardItem, check_verifiers, prompt_messages, prompt_text, rule_verifier_for, source_label,
                    sources_for, verifier_for, verify_item)
from .registry import REWARD_SOURCES, RewardSource, read_sources, register_reward_source
from .router import RewardRouter, combine

__all__ = ["REWARD_SOURCES", "RewardItem", "RewardRouter", "RewardSource", "check_verifiers", "combine", "make_pool",
           "prompt_messages", "prompt_text", "register_reward_source", "rule_verifier_for", "source_label",
           "sources_for", "verifier_for", "verify_item"]


def make_pool(reward: RewardConfig, layout: Optional[Any] = None) -> RewardRouter:
    """The reward router a run uses, built from the ``reward`` section of its config: every registered source that is
    on (the rule verifiers always; ``reward.model.path``, ``reward.judge.url``, ``reward.remote.url``, a plugin's
    ``reward.source_options.<name>``), each by its class's ``from_config``. ``layout``: the run's
    ``controller.layout.Layout`` (``check_layout``), whose ``reward_model`` pool the reward model's actors take; None
    gives the reward model one worker (a GPU of its own when the cluster has GPUs). A source that fails to start
    closes the ones already started."""
    sources: dict = {}
    try:
        for name, (settings, on) in read_sources(reward).items():
            if on:
                sources[name] = REWARD_SOURCES[name].from_config(settings, reward, layout)
    except BaseException:
        for backend in sources.values():
            backend.close()
        raise
    return RewardRouter(sources)
