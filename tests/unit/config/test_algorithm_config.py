"""algorithm.* config: names checked against the algorithm registries, policy-loss options, the split KL
estimator keys and the new presets."""

import pytest

from reasonrl.algorithms import ADV_ESTIMATORS, POLICY_LOSS_OPTIONS, POLICY_LOSSES, register_policy_loss
from reasonrl.config import ConfigError, load_config
from reasonrl.config.presets import ALGORITHM_PRESETS


def load(*args):
    return load_config(list(args), cuda_available=False)[0]


def test_defaults_of_the_two_kl_estimators_and_the_controller():
    alg = load().algorithm
    assert (alg.kl_loss_estimator, alg.kl_reward_estimator) == ("k3", "k1")
    assert (alg.kl_ctrl, alg.policy_loss_options) == ("fixed", {})


def test_the_old_kl_estimator_key_names_the_two_new_ones():
    with pytest.raises(ConfigError) as err:
        load("algorithm.kl_estimator=k3")
    assert "algorithm.kl_loss_estimator" in str(err.value) and "algorithm.kl_reward_estimator" in str(err.value)


@pytest.mark.parametrize("arg,key", [
    ("algorithm.policy_loss=nope", "algorithm.policy_loss"),
    ("algorithm.adv_estimator=nope", "algorithm.adv_estimator"),
    ("algorithm.loss_agg_mode=sum", "algorithm.loss_agg_mode"),
    ("algorithm.kl_loss_estimator=k4", "algorithm.kl_loss_estimator"),
    ("algorithm.kl_reward_estimator=k4", "algorithm.kl_reward_estimator"),
    ("algorithm.kl_ctrl=pid", "algorithm.kl_ctrl"),
    ("algorithm.kl_target=0", "algorithm.kl_target"),
])
def test_bad_algorithm_names_fail_naming_the_key(arg, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load(arg)


def test_policy_loss_options_are_validated_for_the_chosen_loss():
    cfg = load("algorithm=sapo", "algorithm.policy_loss_options.tau_neg=1.2")
    assert cfg.algorithm.policy_loss_options == {"tau_neg": 1.2}
    with pytest.raises(ConfigError, match=r"'algorithm.policy_loss_options'.*'sapo' has no option 'kl_cov_ratio'.*"
                                          r"tau_neg, tau_pos"):
        load("algorithm=sapo", "algorithm.policy_loss_options.kl_cov_ratio=0.1")
    with pytest.raises(ConfigError, match="'ppo_clip' has no option 'tau_neg'; its options: none"):
        load("algorithm.policy_loss_options.tau_neg=1.2")


def test_validation_reads_the_registries():
    @register_policy_loss("test_plugin_loss")
    def plugin(**unused):
        raise AssertionError("not called by config validation")

    try:
        assert load("algorithm.policy_loss=test_plugin_loss").algorithm.policy_loss == "test_plugin_loss"
    finally:
        POLICY_LOSSES.unregister("test_plugin_loss")
        POLICY_LOSS_OPTIONS.pop("test_plugin_loss")
    for name in ADV_ESTIMATORS:
        assert load(f"algorithm.adv_estimator={name}").algorithm.adv_estimator == name


def test_pass_at_k_settings():
    cfg = load("algorithm=pass_at_k", "rollout.n=4")
    assert (cfg.algorithm.adv_estimator, cfg.algorithm.pass_k) == ("pass_at_k", 4)
    with pytest.raises(ConfigError, match="'algorithm.pass_k': must not exceed rollout.n"):
        load("algorithm=pass_at_k", "rollout.n=4", "algorithm.pass_k=5")
    with pytest.raises(ConfigError, match="'algorithm.kl_in_reward'"):
        load("algorithm=pass_at_k", "algorithm.kl_in_reward=true")
    with pytest.raises(ConfigError, match="'algorithm.overlong_buffer'"):
        load("algorithm=pass_at_k", "algorithm.overlong_buffer=16")


def test_new_presets_set_their_loss_or_estimator():
    expected = {"cispo": ("grpo", "cispo"), "sapo": ("grpo", "sapo"), "gmpo": ("grpo", "gmpo"),
                "clip_cov": ("grpo", "clip_cov"), "kl_cov": ("grpo", "kl_cov"), "remax": ("remax", "ppo_clip"),
                "pass_at_k": ("pass_at_k", "ppo_clip")}
    for preset, (estimator, loss) in expected.items():
        alg = load(f"algorithm={preset}").algorithm
        assert (alg.name, alg.adv_estimator, alg.policy_loss) == (preset, estimator, loss)
    gmpo = load("algorithm=gmpo").algorithm
    assert (gmpo.clip_ratio_low, gmpo.clip_ratio_high, gmpo.loss_agg_mode) == (0.4, 0.4, "seq-mean-token-mean")
    assert set(expected) <= set(ALGORITHM_PRESETS)


def test_adaptive_kl_needs_a_kl_term_to_steer():
    cfg = load("algorithm=rloo", "algorithm.kl_ctrl=adaptive", "algorithm.kl_target=0.05")
    assert (cfg.algorithm.kl_ctrl, cfg.algorithm.kl_target, cfg.algorithm.kl_horizon) == ("adaptive", 0.05, 10000.0)
    for args in (("algorithm=dapo",), ("algorithm=grpo", "algorithm.kl_coef=0")):  # no KL term / coefficient 0
        with pytest.raises(ConfigError, match="'algorithm.kl_ctrl': adaptive needs algorithm.kl_coef > 0"):
            load(*args, "algorithm.kl_ctrl=adaptive")
