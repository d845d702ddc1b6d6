"""Config: presets, overrides, and fast failures that name the key."""
import re
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


def test_cpu_profile_shortens_lengths_but_never_lengthens_a_task():
    from reasonrl.config.presets import CPU_PROFILE
    from reasonrl.config.tasks import TASKS

    gsm8k, _ = load_config(["task=gsm8k"], cuda_available=False)
    assert gsm8k.rollout.max_new_tokens == CPU_PROFILE["rollout"]["max_new_tokens"] < 512  # shortened
    arith, notes = load_config(["task=arith"], cuda_available=False)
    assert notes["profile"] == "cpu" and arith.rollout.max_new_tokens == TASKS["arith"].max_new_tokens == 64


def test_laptop_profile_resolves_to_the_settings_that_learned_on_a_cpu():
    # The command README.md documents, on a machine with a GPU too: the profile is asked for, not inferred.
    from reasonrl.config.presets import LAPTOP_COMMAND

    args = LAPTOP_COMMAND.split()[3:]
    assert args == ["task=arith", "trainer.profile=laptop"]
    for cuda in (False, True):
        cfg, notes = load_config(args, cuda_available=cuda)
        assert notes["profile"] == "laptop"
        # The CPU learning-parity run (benchmarks/README.md): 8 prompts x 4, T=0.7, lr 1e-5, 4 mini-batches, no KL.
        assert (cfg.data.train_batch_size, cfg.rollout.n, cfg.rollout.temperature) == (8, 4, 0.7)
        assert cfg.actor.lr == 1e-5 and cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size == 4
        assert cfg.algorithm.use_kl_loss is False and cfg.algorithm.kl_in_reward is False  # no reference model
        assert cfg.rollout.max_new_tokens == 64 and cfg.data.val_limit == 64  # arith's own length; 64 held out
        assert (cfg.trainer.total_steps, cfg.trainer.val_every, cfg.trainer.val_before_train) == (10, 5, True)
    mine, _ = load_config(args + ["actor.lr=2e-6", "trainer.total_steps=3"], cuda_available=False)
    assert mine.actor.lr == 2e-6 and mine.trainer.total_steps == 3 and mine.rollout.temperature == 0.7


def test_the_cpu_profile_on_gsm8k_says_it_scores_about_zero_and_points_to_the_laptop_command():
    from reasonrl.config.presets import LAPTOP_COMMAND, profile_notice

    _, notes = load_config(["task=gsm8k"], cuda_available=False)
    notice = profile_notice(notes["profile"], notes["task"])
    assert "scores about 0 on GSM8K" in notice and notice.endswith(LAPTOP_COMMAND)
    _, arith = load_config(["task=arith"], cuda_available=False)
    assert "GSM8K" not in profile_notice(arith["profile"], arith["task"])
    assert profile_notice("", "gsm8k") == ""  # no profile, no notice


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


def test_every_numeric_field_has_a_range():
    import dataclasses
    import typing

    from reasonrl.config.ranges import FIELD_RANGES
    from reasonrl.config.schema import Config

    numeric = (int, float, typing.List[int], typing.List[float], typing.Optional[int], typing.Optional[float])

    def numeric_keys(cls, prefix):
        """section.field and section.subsection.field (actor.lora's numbers are checked by validate_lora)."""
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]) and f"{prefix}{f.name}" != "actor.lora":
                yield from numeric_keys(hints[f.name], f"{prefix}{f.name}.")
            elif hints[f.name] in numeric and prefix:
                yield f"{prefix}{f.name}"

    keys = set(numeric_keys(Config, ""))
    assert keys - set(FIELD_RANGES) == set()  # a new numeric field needs its interval
    assert set(FIELD_RANGES) - keys == set()  # and no interval names a field that is gone


@pytest.mark.parametrize("arg,key", [("actor.lr=-1", "actor.lr"), ("reward.timeout_s=0", "reward.timeout_s"),
                                     ("rollout.top_p=1.5", "rollout.top_p"), ("actor.betas=[0.9,1.0]", "actor.betas"),
                                     ("algorithm.gamma=nan", "algorithm.gamma"), ("rollout.n=0", "rollout.n"),
                                     ("trainer.watchdog_factor=1", "trainer.watchdog_factor")])
def test_out_of_range_numbers_are_refused_naming_the_key(arg, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'.*out of range"):
        load_config([arg], cuda_available=False)


def test_range_edges_follow_the_brackets():
    from reasonrl.config.load import in_interval

    assert in_interval(0, "[0, inf)") and not in_interval(0, "(0, inf)")
    assert in_interval(1, "(0, 1]") and not in_interval(1, "[0, 1)") and not in_interval(float("inf"), "[0, inf)")


def test_every_preset_combination_is_in_range():
    from reasonrl.config.presets import ALGORITHM_PRESETS, TASK_PRESETS

    for task in TASK_PRESETS:
        for algorithm in ALGORITHM_PRESETS:
            for cuda in (False, True):
                load_config([f"task={task}", f"algorithm={algorithm}"], cuda_available=cuda)


def test_repeated_task_and_algorithm_take_the_last_value():
    cfg, notes = load_config(["task=math", "algorithm=ppo", "task=gsm8k", "algorithm=dapo"], cuda_available=False)
    assert (cfg.task, notes["task"], cfg.algorithm.name, notes["algorithm"]) == ("gsm8k", "gsm8k", "dapo", "dapo")
    assert cfg.algorithm.dynamic_sampling is True  # the dapo preset was applied, not ppo's
    with pytest.raises(ConfigError, match="unknown task 'nope'"):  # the last value is checked too
        load_config(["task=gsm8k", "task=nope"], cuda_available=False)


def test_bad_range_fails_before_ray_with_exit_2():
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", "actor.lr=-1"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["reasonrl: config error: config key 'actor.lr': -1.0 is out of range; "
                                                "allowed: [0, inf)"]
    assert "ray" not in proc.stdout.lower()


@pytest.mark.parametrize("args, key, words", [
    (["rollout.tensor_parallel_size=2"], "rollout.tensor_parallel_size", "tensor-parallel rollout workers"),
    (["algorithm=ppo"], "trainer.mode", "PPO critic"),
    (["algorithm.dynamic_sampling=true"], "trainer.mode", "DAPO dynamic sampling"),
    (["algorithm=remax"], "trainer.mode", "ReMax"),
])
def test_async_mode_refuses_what_it_does_not_wire_naming_both_keys(args, key, words):
    """The combinations trainer.mode=async does not support fail at load time, naming the key and the reason (the tool
    loop and streaming are supported: tests/e2e/test_async.py)."""
    with pytest.raises(ConfigError, match=rf"config key '{re.escape(key)}'.*{words}"):
        load_config(["trainer.mode=async", *args], cuda_available=False)
    load_config(["trainer.mode=async", "task=math_tool", "rollout.stream_chunk_prompts=1"], cuda_available=False)


def test_adamw_impl_resolves_by_device_and_a_wrong_value_is_named():
    """``actor.adamw_impl``: auto is fused on CUDA and the for-loop on the CPU; a set value stays; anything else is
    refused naming the key and the choices."""
    from reasonrl.config import ConfigError, load_config
    from reasonrl.config.worker_plan import adamw_impl

    cfg, _ = load_config([])
    assert (adamw_impl(cfg, "cuda"), adamw_impl(cfg, "cpu")) == ("fused", "for_loop")
    cfg, _ = load_config(["actor.adamw_impl=foreach"])
    assert (adamw_impl(cfg, "cuda"), adamw_impl(cfg, "cpu")) == ("foreach", "foreach")
    with pytest.raises(ConfigError, match=r"actor.adamw_impl.*auto, fused, foreach, for_loop"):
        load_config(["actor.adamw_impl=apex"])


def test_merged_layers_name_the_one_that_fails():
    from reasonrl.config.load import _merge, _schema

    good, bad = ("task preset x", {"actor": {"lr": 0.5}}), ("laptop profile", {"actor": {"nope": 1}})
    assert _merge(_schema(), [good]).actor.lr == 0.5
    assert _schema().actor.lr != 0.5  # the cached schema is left as it was
    with pytest.raises(ConfigError, match=r"^laptop profile: config key 'actor.nope': Key 'nope' not in"):
        _merge(_schema(), [good, bad])
