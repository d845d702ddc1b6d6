"""The reward-source registry (reasonrl/rewards/registry.py): a source installed as a real distribution's entry point
(``reasonrl.reward_sources``) is found by name, its settings (``reward.source_options.<name>``) are checked before
anything loads, and it trains a real CPU step through the in-process backend, its scores reaching the advantages and
the metrics; an unknown source is a config error naming it; a taken name is refused."""
from __future__ import annotations

import json
import sys

import pytest
from verifier_plugins import write_plugin

from reasonrl.config import ConfigError, load_config
from reasonrl.rewards import REWARD_SOURCES, RewardSource, combine, register_reward_source
from reasonrl.verifiers import VerifyResult

PLUGIN = '''
from dataclasses import dataclass

from reasonrl.config.reward_sources_schema import SectionError
from reasonrl.rewards import RewardSource
from reasonrl.verifiers import VerifyResult

SCORED = []  # every score given, in the order of the items


@dataclass
class LengthSettings:
    unit: int = 16
    """Characters of a response that score 1."""

    def check(self, key):
        if self.unit < 1:
            raise SectionError(f"{key}.unit", f"must be >= 1, got {self.unit}")


class Ready:
    def __init__(self, results):
        self.results = results

    def done(self):
        return True

    def result(self):
        return self.results


class LengthSource(RewardSource):
    """Scores a response by its length: min(characters, unit) / unit."""

    schema = LengthSettings

    def __init__(self, settings, score_range):
        self.unit = settings.unit

    def submit(self, items):
        scores = [min(len(item.response), self.unit) / self.unit for item in items]
        SCORED.extend(scores)
        return Ready([VerifyResult(score, score >= 0.5, {"reason": "length"}) for score in scores])
'''


@pytest.fixture(scope="module")
def length_source(tmp_path_factory):
    """The ``length`` source, installed as the distribution ``lengthsrc`` (a dist-info with its entry point) on
    sys.path; the registry reads its entry-point group again."""
    root = write_plugin(tmp_path_factory.mktemp("reward_plugin"), "lengthsrc", PLUGIN, "length", "LengthSource",
                        group="reasonrl.reward_sources")
    sys.path.insert(0, str(root))
    REWARD_SOURCES.rescan_entry_points()
    try:
        yield sys.modules.get("lengthsrc")
    finally:
        sys.path.remove(str(root))
        REWARD_SOURCES.unregister("length")
        sys.modules.pop("lengthsrc", None)
        REWARD_SOURCES.rescan_entry_points()


def config(*args):
    return load_config(["task=gsm8k", *args], cuda_available=False)[0]


def test_an_unknown_source_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"reward.sources.*unknown source 'oracle'; known: rule, model, judge, "
                                          r"remote.*'reasonrl.reward_sources' entry-point group"):
        config("reward.sources={oracle: 1}")
    with pytest.raises(ConfigError, match=r"reward.source_options.*names 'oracle', which is not a reward source"):
        config("reward.source_options={oracle: {}}")
    with pytest.raises(ConfigError, match=r"names 'judge'.*\('judge' is set in reward.judge\)"):
        config("reward.source_options={judge: {url: 'http://127.0.0.1:1/v1'}}")


def test_a_taken_name_or_a_class_that_is_not_a_source_is_refused():
    class Other(RewardSource):
        pass

    with pytest.raises(ValueError, match=r"reward source 'judge' is already registered \(reasonrl.rewards.judge"):
        register_reward_source("judge")(Other)
    assert REWARD_SOURCES["judge"].__name__ == "JudgeSource" and REWARD_SOURCES["judge"].name == "judge"
    with pytest.raises(TypeError, match=r"needs a RewardSource subclass"):
        register_reward_source("callable")(lambda items: items)
    assert "callable" not in REWARD_SOURCES


def test_the_installed_source_is_found_and_its_settings_checked(length_source):
    assert "length" in REWARD_SOURCES and REWARD_SOURCES["length"].__module__ == "lengthsrc"
    on = config("reward.sources={rule: 0.5, length: 0.5}", "reward.source_options={length: {unit: 4}}")
    assert on.reward.source_options == {"length": {"unit": 4}}
    with pytest.raises(ConfigError, match=r"reward.sources.*uses 'length', which is not configured "
                                          r"\(reward.source_options.length is not set\)"):
        config("reward.sources={length: 1}")
    with pytest.raises(ConfigError, match=r"config key 'reward.source_options.length.unit': must be >= 1, got 0"):
        config("reward.sources={length: 1}", "reward.source_options={length: {unit: 0}}")
    with pytest.raises(ConfigError, match=r"'reward.source_options.length.units': unknown key; known: unit"):
        config("reward.source_options={length: {units: 4}}")
    with pytest.raises(ConfigError, match=r"'reward.source_options.length': must be a mapping of settings, got 4"):
        config("reward.source_options={length: 4}")
    # a row with the rule verifiers and the plugin: the weighted sum, the verifier's verdict (worked by hand)
    right, short = VerifyResult(1.0, True, {"reason": "correct"}), VerifyResult(0.25, False, {"reason": "length"})
    mixed = combine({"length": 0.5, "rule": 0.5}, {"rule": right, "length": short})
    assert mixed.score == pytest.approx(0.625) and mixed.correct
    assert mixed.info["reason"] == "0.5 x rule 1 + 0.5 x length 0.25"


@pytest.mark.slow
def test_a_step_trains_on_the_installed_source(length_source, tiny_policy, tmp_path):
    """One real GRPO step (in-process backend, a 2-layer random Llama, the hf engine) whose every row is scored by
    the plugin alone: the advantages are its scores minus their group's mean (norm_by_std off: worked by hand for
    groups of two, +-(a - b) / 2), and the metrics carry its scores."""
    from reasonrl.trainer.backends import InProcessBackend
    from reasonrl.config.plan import RunPlan
    from reasonrl.trainer.trainer import Trainer

    out = tmp_path / "run"
    cfg, _ = load_config(["task=arith", "algorithm=grpo", "algorithm.norm_by_std=false", "rollout.engine=hf",
                          "data.train_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8",
                          "actor.micro_batch_size_per_worker=4", "reward.workers=1", "trainer.logger=[jsonl]",
                          "trainer.total_steps=1", "trainer.device=cpu", "trainer.resume=never",
                          "trainer.save_every=0", "reward.sources={length: 1}",
                          "reward.source_options={length: {unit: 64}}", f"model.path={tiny_policy}",
                          f"trainer.output_dir={out}"], cuda_available=False)
    trainer = Trainer(cfg, RunPlan.build(cfg), InProcessBackend(num_threads=1))
    seen = []
    advantages = trainer.advantages

    def spy(batch, scores, verdicts, rnd, baseline):
        got = advantages(batch, scores, verdicts, rnd, baseline)
        seen.append((scores.tolist(), rnd.group_index().tolist(), batch["response_mask"], got[0]))
        return got

    trainer.advantages = spy
    try:
        trainer.fit()
    finally:
        trainer.close()
    scored = sys.modules["lengthsrc"].SCORED
    [(scores, groups, response_mask, adv)] = seen
    assert len(scores) == 4 and scores == pytest.approx(scored)  # the plugin's scores, in the items' order
    assert len(set(scores)) > 1  # the responses' lengths differ (seeded): the advantages below are not all 0
    for i, (score, group) in enumerate(zip(scores, groups)):
        [partner] = [s for j, (s, g) in enumerate(zip(scores, groups)) if g == group and j != i]
        expected = (score - partner) / 2
        assert adv[i][response_mask[i].bool()].tolist() == pytest.approx([expected] * int(response_mask[i].sum()))
    m = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()][-1]
    assert m["reward/mean"] == pytest.approx(sum(scored) / 4) and m["reward/length/count"] == 4.0
    assert m["reward/length/mean"] == pytest.approx(sum(scored) / 4)
    assert m["reward_source/length/scored"] == 4.0 and m["reward_source/length/failed"] == 0.0
    assert m["reward/accuracy"] == pytest.approx(sum(s >= 0.5 for s in scored) / 4)
