"""``async_rollout.share_devices``: the plan's numbers in both layouts (the actor's GPUs, the replicas', the Ray
fraction, the engine's memory share handed to the workers) and the combinations refused before anything starts,
naming the keys."""
from __future__ import annotations

import re

import pytest

from reasonrl.config import ConfigError, load_config
from reasonrl.config.device_defaults import Hardware
from reasonrl.config.plan import RunPlan
from reasonrl.controller.layout import check_layout

SHARED = ["trainer.mode=async", "fleet.enabled=true", "async_rollout.share_devices=true", "data.train_batch_size=8",
          "rollout.n=2"]


def gpu_cfg(*args):
    return load_config(["trainer.profile=none", *args], cuda_available=True)[0]


def test_shared_layout_gives_the_actor_every_gpu_and_a_replica_per_rank():
    shared = RunPlan.build(gpu_cfg(*SHARED, "async_rollout.num_rollout_workers=4"), Hardware("cuda", gpu_count=4))
    assert (shared.world_size, shared.rollout_workers, shared.share_devices) == (4, 4, True)
    assert shared.gpu_share == 0.5  # actor rank and replica each take half of the bundle's GPU in Ray
    separate = RunPlan.build(gpu_cfg("trainer.mode=async", "fleet.enabled=true", "data.train_batch_size=6",
                                     "rollout.n=2", "async_rollout.num_rollout_workers=1"), Hardware("cuda", 4))
    assert (separate.world_size, separate.rollout_workers, separate.share_devices, separate.gpu_share) == \
        (3, 1, False, 1.0)  # separate pools: 3 GPUs train, 1 generates
    one = RunPlan.build(gpu_cfg(*SHARED), Hardware("cuda", gpu_count=1))
    assert (one.world_size, one.rollout_workers) == (1, 1)  # the one-GPU case: both on GPU 0


def test_the_engine_gets_its_fraction_and_the_trainer_the_rest():
    cfg = gpu_cfg(*SHARED, "async_rollout.engine_memory_fraction=0.25", "rollout.gpu_memory_utilization=0.5")
    plan = RunPlan.build(cfg, Hardware("cuda", gpu_count=1))
    assert plan.run_config(cfg).rollout.gpu_memory_utilization == 0.25  # what the replica's vLLM is started with
    assert cfg.rollout.gpu_memory_utilization == 0.5  # the config itself is not written
    row, = [s for s in plan.device_settings if s.key == "rollout.gpu_memory_utilization"]
    assert row.value == 0.25 and "engine_memory_fraction" in row.why
    plain = gpu_cfg("rollout.gpu_memory_utilization=0.5")  # other modes: their own value, unchanged
    assert RunPlan.build(plain, Hardware("cuda", 1)).run_config(plain).rollout.gpu_memory_utilization == 0.5


def test_the_layout_puts_the_replicas_on_the_actors_pool():
    shared = check_layout(gpu_cfg(*SHARED, "async_rollout.num_rollout_workers=2", "algorithm.use_kl_loss=false"),
                          {"CPU": 8.0, "GPU": 2.0})
    assert shared.roles["async_rollout"] == shared.roles["actor"] == "main" and set(shared.pools) == {"main"}
    assert shared.pools["main"].workers == 2
    assert shared.share("async_rollout") == shared.share("actor") == {"GPU": 0.5, "CPU": 0.5}
    separate = check_layout(gpu_cfg("trainer.mode=async", "fleet.enabled=true", "data.train_batch_size=8",
                                    "algorithm.use_kl_loss=false"), {"CPU": 8.0, "GPU": 2.0})
    assert separate.roles["async_rollout"] == "rollout" and separate.share("actor") == {"GPU": 1.0, "CPU": 1.0}


@pytest.mark.parametrize("args, key, words", [
    (["async_rollout.share_devices=true"], "async_rollout.share_devices", "needs trainer.mode=async"),
    (["trainer.mode=async", "async_rollout.share_devices=true", "data.train_batch_size=8"],
     "async_rollout.share_devices", "needs fleet.enabled=true"),
    ([*SHARED, "trainer.num_workers=2", "async_rollout.num_rollout_workers=1"],
     "async_rollout.num_rollout_workers", "1 must be a multiple of trainer.num_workers (2)"),
    ([*SHARED, "trainer.num_workers=2", "async_rollout.num_rollout_workers=3"],
     "async_rollout.num_rollout_workers", "3 must be a multiple of trainer.num_workers (2)"),
    ([*SHARED, "placement.roles.async_rollout=rollout"], "placement.roles.async_rollout",
     "conflicts with async_rollout.share_devices=true"),
    ([*SHARED, "async_rollout.engine_memory_fraction=1"], "async_rollout.engine_memory_fraction",
     "out of range; allowed: (0, 1)"),
    ([*SHARED, "async_rollout.mps=always"], "async_rollout.mps",
     "unknown 'always'; choose one of auto, required, disabled"),
    (["async_rollout.mps=required"], "async_rollout.mps",
     "required is only read with async_rollout.share_devices=true"),
    ([*SHARED, "async_rollout.actor_sm_percent=0"], "async_rollout.actor_sm_percent", "allowed: [1, 100]"),
    ([*SHARED, "async_rollout.actor_sm_percent=101"], "async_rollout.actor_sm_percent", "allowed: [1, 100]"),
    ([*SHARED, "async_rollout.actor_mps_priority=high"], "async_rollout.actor_mps_priority",
     "unknown 'high'; choose one of normal, below_normal"),
    (["trainer.mode=async", "async_rollout.actor_sm_percent=60"], "async_rollout.actor_sm_percent",
     "only read with async_rollout.share_devices=true"),
    ([*SHARED, "async_rollout.mps=disabled", "async_rollout.actor_mps_priority=below_normal"],
     "async_rollout.actor_mps_priority", "has no effect with async_rollout.mps=disabled"),
])
def test_unsupported_shared_layouts_are_refused_naming_the_keys(args, key, words):
    with pytest.raises(ConfigError, match=rf"config key '{re.escape(key)}'.*{re.escape(words)}"):
        load_config(args, cuda_available=False)


def test_replicas_must_match_the_actor_ranks_the_gpus_give():
    for replicas in (2, 6):  # fewer than the 4 ranks, or not the same number on each
        cfg = gpu_cfg(*SHARED, "data.train_batch_size=24", f"async_rollout.num_rollout_workers={replicas}")
        with pytest.raises(ConfigError, match=re.escape(f"config key 'async_rollout.num_rollout_workers': {replicas} "
                                                        "must be a multiple of the 4 actor workers with "
                                                        "async_rollout.share_devices=true")):
            RunPlan.build(cfg, Hardware("cuda", gpu_count=4))


def test_several_replicas_a_gpu_split_its_bundle_evenly():
    # 2 GPUs, 4 replicas: two on each actor rank's GPU, so the actor rank and each replica take a third in Ray
    plan = RunPlan.build(gpu_cfg(*SHARED, "async_rollout.num_rollout_workers=4"), Hardware("cuda", gpu_count=2))
    assert (plan.world_size, plan.rollout_workers, plan.replicas_per_device) == (2, 4, 2)
    assert plan.gpu_share == pytest.approx(1 / 3)
    one = RunPlan.build(gpu_cfg(*SHARED), Hardware("cuda", gpu_count=1))
    assert (one.replicas_per_device, one.gpu_share) == (1, 0.5)
    # on a CPU the replicas are groups of their own sharing the cores: actor + 2 replicas = 3 groups
    cpu, _ = load_config(["trainer.profile=none", *SHARED, "async_rollout.num_rollout_workers=2"],
                         cuda_available=False)
    cpu_plan = RunPlan.build(cpu, Hardware("cpu", cpu_count=2))
    assert (cpu_plan.replicas_per_device, cpu_plan.cpu_groups, cpu_plan.ray_cpus) == (2, 3, 6)


def test_the_trainers_mps_priority_is_accepted_and_an_sm_limit_refused_on_a_shared_gpu():
    cfg = gpu_cfg(*SHARED, "async_rollout.actor_mps_priority=below_normal")
    assert (cfg.async_rollout.actor_sm_percent, cfg.async_rollout.actor_mps_priority) == (100, "below_normal")
    assert gpu_cfg(*SHARED, "async_rollout.actor_sm_percent=100").async_rollout.actor_sm_percent == 100
    # the limit that made the update alone non-finite on an H100 (docs/async.md), and any other below 100
    for percent in (60, 99):
        with pytest.raises(ConfigError, match=rf"config key 'async_rollout.actor_sm_percent': {percent} is refused for "
                                              r"now; leave it at 100: a limit of 60 made the actor's update alone"):
            gpu_cfg(*SHARED, f"async_rollout.actor_sm_percent={percent}",
                    "async_rollout.actor_mps_priority=below_normal")
