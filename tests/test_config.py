"""Config: presets, overrides, and fast failures that name the key."""
import subprocess
import sys

import pytest

from reasonrl.config import ConfigError, from_dict, load_config, to_dict


def test_task_preset_and_override_layering():
    cfg, notes = load_config(["task=gsm8k", "rollout.n=3", "trainer.profile=none"], cuda_available=False)
    assert cfg.rollout.n == 3                      # user override wins
    assert cfg.rollout.max_new_tokens == 512       # gsm8k preset (the schema default is also 512)
    assert cfg.reward.verifier is None             # a task preset never forces a verifier: rows choose
    assert notes["profile"] is None
    code, _ = load_config(["task=mbpp", "trainer.profile=none"], cuda_available=False)
    assert code.reward.timeout_s == 30.0 and code.reward.verifier is None  # from the registry's mbpp entry


def test_rows_choose_their_verifier_unless_the_user_forces_one():
    from reasonrl.rewards import verifier_for

    cfg, _ = load_config(["task=gsm8k"], cuda_available=False)
    rows = [{"data_source": "openai/gsm8k"}, {"data_source": "mbpp"}, {"data_source": "mbpp", "verifier": "math"},
            {"data_source": "humaneval"}, {"data_source": "hendrycks_math"}]
    assert [verifier_for(r, cfg.reward) for r in rows] == ["math", "code", "math", "code", "math"]
    forced, _ = load_config(["task=gsm8k", "reward.verifier=code"], cuda_available=False)
    assert {verifier_for(r, forced.reward) for r in rows} == {"code"}
    with pytest.raises(ValueError, match="no verifier for data_source 'mystery'"):
        verifier_for({"data_source": "mystery"}, cfg.reward)


def test_cpu_profile_applies_without_gpu_and_yields_to_user_sizes():
    cfg, notes = load_config(["task=gsm8k", "rollout.max_new_tokens=40"], cuda_available=False)
    assert notes["profile"] == "cpu"
    assert cfg.data.train_batch_size == 4          # from the CPU profile
    assert cfg.rollout.max_new_tokens == 40        # the user's size wins over the profile
    cfg_gpu, notes_gpu = load_config(["task=gsm8k"], cuda_available=True)
    assert notes_gpu["profile"] is None and cfg_gpu.data.train_batch_size == 32


def test_algorithm_preset_sets_fields_and_user_still_overrides():
    cfg, _ = load_config(["algorithm=dapo", "algorithm.clip_ratio_high=0.3"], cuda_available=False)
    assert cfg.algorithm.name == "dapo" and cfg.algorithm.dynamic_sampling is True
    assert cfg.algorithm.clip_ratio_high == 0.3


@pytest.mark.parametrize("args,key", [
    (["trainer.totl_steps=3"], "trainer.totl_steps"),
    (["rollout.n=many"], "rollout.n"),
    (["nonsense=1"], "nonsense"),
    (["task=nope"], "task"),
    (["algorithm=nope"], "algorithm"),
    (["actor.ppo_mini_batch_size=3", "data.train_batch_size=4"], "actor.ppo_mini_batch_size"),
    (["eval.n=2", "eval.k=[1,4]"], "eval.k"),
])
def test_bad_keys_and_values_name_the_key(args, key):
    with pytest.raises(ConfigError) as err:
        load_config(args, cuda_available=False)
    assert f"'{key}'" in str(err.value)


def test_round_trip_through_dict():
    cfg, _ = load_config(["rollout.n=5", "trainer.logger=[console]"], cuda_available=False)
    again = from_dict(to_dict(cfg))
    assert again == cfg


@pytest.mark.parametrize("arg,key", [("trainer.foo=1", "trainer.foo"), ("data.train_batch_size=x", "data.train_batch_size")])
def test_train_command_fails_fast_naming_the_key(arg, key):
    # The real command: it must exit non-zero before loading any model or starting Ray.
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", "task=gsm8k", arg], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert key in proc.stderr and "config error" in proc.stderr
    assert "batch sizes" not in proc.stdout
