"""Which sources score a row (the forced config, the row's weights, its style, the default), the names rows are logged
under, the data check before anything loads, and the per-row combination with hand-computed numbers."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from reasonrl.config import load_config
from reasonrl.datasets import DataError
from reasonrl.rewards import check_verifiers, combine, sources_for, verifier_for, verify_item
from reasonrl.verifiers import VerifyResult
from paths import REPO

BASE = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2?"}], "extra_info": {"index": 1}}


def row(**reward_model):
    return {**BASE, "reward_model": {"ground_truth": "4", **reward_model}}


def reward(*args):
    return load_config(["task=gsm8k", *args], cuda_available=False)[0].reward


def test_sources_precedence_and_labels():
    plain = reward("reward.model.path=/rm", "reward.judge.url=http://127.0.0.1:1/v1", "reward.judge.model=j")
    assert sources_for(row(style="rule"), plain) == {"rule": 1.0}
    assert sources_for({**BASE}, plain) == {"rule": 1.0}  # no reward_model at all: rule
    assert sources_for(row(style="model"), plain) == {"model": 1.0}
    both = row(style="rule", sources={"rule": 0.7, "model": 0.3, "judge": None})  # None: a Parquet struct's gap
    assert sources_for(both, plain) == {"rule": 0.7, "model": 0.3}  # the row's weights win over its style
    assert [verifier_for(r, plain) for r in (row(style="rule"), row(style="model"), row(style="judge"), both)] == \
        ["math", "reward_model", "judge", "math+reward_model"]
    forced = reward("reward.model.path=/rm", "reward.sources={model: 2}")
    assert sources_for(both, forced) == {"model": 2.0}  # reward.sources forces every row
    item = verify_item(both, "\\boxed{4}", plain)
    assert item.pool_item() == ("math", "\\boxed{4}", "4", {"index": 1}) and item.sources == {"rule": 0.7, "model": 0.3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.response = "changed"  # frozen: what the sources score is what the trainer sent
    again = pickle.loads(pickle.dumps(item))  # to the reward model's Ray actors and the pool's workers
    assert again == item and again.row == both and again.row is not both
    assert verify_item(row(style="model"), "x", plain).verifier is None  # no rule source: no verifier
    # a model-only row needs no verifier for its data_source
    assert verifier_for({**row(style="model"), "data_source": "chat/preferences"}, plain) == "reward_model"


def test_check_verifiers_names_the_row_that_cannot_be_scored():
    cfg = reward()
    assert check_verifiers([row(style="rule"), {**row(style="rule"), "data_source": "mbpp"}], cfg, "train") == \
        ["code", "math"]
    with pytest.raises(DataError, match=r"train: row 1 \(data_source 'openai/gsm8k'\) is scored by the source "
                                        r"'model', but reward.model.path is not set"):
        check_verifiers([row(style="rule"), row(style="model")], cfg, "train")
    with pytest.raises(DataError, match=r"train: row 0: the row's reward_model.style is 'oracle'; known: rule, model"):
        check_verifiers([row(style="oracle")], cfg, "train")
    with pytest.raises(DataError, match=r"row 0: the row's reward_model.sources: the weight of 'rule' must be a "
                                        r"finite number >= 0, got -1"):
        check_verifiers([row(sources={"rule": -1})], cfg, "train")
    with pytest.raises(DataError, match=r"row 0: the row's reward_model.sources must give at least one source"):
        check_verifiers([row(sources={"rule": 0})], cfg, "train")


def test_combination_by_hand():
    right = VerifyResult(1.0, True, {"reason": "correct"})
    wrong = VerifyResult(0.0, False, {"reason": "wrong"})
    model = VerifyResult(0.8, True, {"reason": "reward model"})
    judge_no = VerifyResult(0.2, False, {"reason": "judge"})
    # one source: its result unchanged
    assert combine({"model": 1.0}, {"model": model}) is model
    # 0.5 x 1.0 + 0.5 x 0.8 = 0.9; correct is the rule's verdict
    mixed = combine({"rule": 0.5, "model": 0.5}, {"rule": right, "model": model})
    assert mixed.score == pytest.approx(0.9) and mixed.correct and mixed.info["sources"]["model"]["score"] == 0.8
    # unnormalised weights: 1 x 0 + 0.1 x 0.8 = 0.08; the rule says wrong
    bonus = combine({"rule": 1.0, "model": 0.1}, {"rule": wrong, "model": model})
    assert bonus.score == pytest.approx(0.08) and not bonus.correct
    # without a rule source: correct only when every source says so
    assert not combine({"model": 0.5, "judge": 0.5}, {"model": model, "judge": judge_no}).correct
    # any failed source fails the row, naming it and its reason (never a partial sum)
    timeout = VerifyResult.failure("judge at http://x: EndpointTimeout: no complete answer within 30s")
    failed = combine({"rule": 0.5, "judge": 0.5}, {"rule": right, "judge": timeout})
    assert failed.failed and failed.score == 0.0
    assert failed.info["reason"].startswith("no verdict from judge (judge: judge at http://x: EndpointTimeout")


def test_docs_list_every_key_of_the_reward_sections():
    import dataclasses

    from reasonrl.config.reward_sources_schema import EndpointConfig, JudgeConfig, RemoteRewardConfig, RewardModelConfig

    text = (REPO / "docs" / "rewards.md").read_text()
    endpoint = {f.name for f in dataclasses.fields(EndpointConfig)}
    missing = [f"reward.model.{f.name}" for f in dataclasses.fields(RewardModelConfig)
               if f"`reward.model.{f.name}`" not in text]
    for section, cls in (("judge", JudgeConfig), ("remote", RemoteRewardConfig)):
        missing += [f"reward.{section}.{f.name}" for f in dataclasses.fields(cls)
                    if f.name not in endpoint and f"`reward.{section}.{f.name}`" not in text]
    missing += [name for name in endpoint if f"| `{name}` |" not in text]
    assert not missing, f"docs/rewards.md does not describe {missing}"
