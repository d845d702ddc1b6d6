"""The placement section: presets and the user's pools resolved into a layout, the fit against a cluster (totals or
per node) with errors naming the roles and numbers, bad input at load time, and the layout placed on a real Ray
cluster of two nodes that declare logical GPUs, with tiny actors reporting where each role's ranks landed."""
from __future__ import annotations

import sys

import pytest
import ray

from helpers import ray_test_cluster
from reasonrl.config import ConfigError, load_config
from reasonrl.controller.layout import LayoutError, check_layout, reserve_pool, role_options

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Probe travels to the workers by value

FOUR_GPUS = {"CPU": 16.0, "GPU": 4.0}


def cfg_of(*args):
    return load_config(["trainer.profile=none", *args], cuda_available=True)[0]


def test_default_layouts_are_todays():
    grpo = check_layout(cfg_of("algorithm=grpo"), FOUR_GPUS)
    assert grpo.roles == {"actor": "main", "reference": "main"}  # GRPO's KL loss needs the reference
    assert (grpo.pools["main"].workers, grpo.pools["main"].gpus) == (4, 1.0)  # one rank per GPU
    assert grpo.share("actor") == {"GPU": 1.0, "CPU": 1.0} and grpo.share("reference") == {"GPU": 0.0, "CPU": 0.0}
    ppo = check_layout(cfg_of("algorithm=ppo"), FOUR_GPUS)
    assert ppo.share("critic") == {"GPU": 0.5, "CPU": 0.5} == ppo.share("actor")  # the critic shares at half
    # async: the rollout workers on GPUs of their own, the actor on the rest (4 - 1)
    asy = check_layout(cfg_of("trainer.mode=async", "async_rollout.num_rollout_workers=1"), FOUR_GPUS)
    assert asy.roles["async_rollout"] == "rollout" and asy.pools["rollout"].workers == 1
    assert asy.pools["main"].workers == 3
    # a reward model takes one GPU of its own: the actor gets 3
    rm = check_layout(cfg_of("reward.model.path=/rm"), FOUR_GPUS)
    assert rm.roles["reward_model"] == "reward" and rm.pools["main"].workers == 3
    # on a cluster without GPUs every role time-shares the cores (the reward pool asks no CPU of its own)
    cpu = check_layout(cfg_of("reward.model.path=/rm"), {"CPU": 2.0})
    assert (cpu.pools["main"].workers, cpu.pools["main"].gpus, cpu.pools["reward"].cpus) == (1, 0.0, 0.0)


def test_user_pools_and_roles_over_the_preset():
    layout = check_layout(cfg_of("reward.model.path=/rm", "placement.pools.rm={workers: 2, gpus: 1}",
                                 "placement.roles.reward_model=rm", "trainer.num_workers=2"), FOUR_GPUS)
    assert layout.pool_of("reward_model").workers == 2 and layout.pools["main"].workers == 2
    # the reward model next to the actor: both share each main GPU at half
    shared = check_layout(cfg_of("reward.model.path=/rm", "placement.roles.reward_model=main"), FOUR_GPUS)
    assert set(shared.pools) == {"main"} and shared.share("reward_model") == {"GPU": 0.5, "CPU": 0.5}


def test_layouts_that_do_not_fit_name_roles_and_numbers():
    with pytest.raises(LayoutError, match=r"the pools need 5 GPUs in all \(main: 4 worker\(s\) x 1 GPU, 1 CPU "
                                          r"\(actor, reference\); reward: 1 worker\(s\) x 1 GPU, 1 CPU "
                                          r"\(reward_model\)\) but the Ray cluster has 4"):
        check_layout(cfg_of("trainer.num_workers=4", "reward.model.path=/rm"), FOUR_GPUS)
    with pytest.raises(LayoutError, match=r"pool reward: 8 worker\(s\) x 1 GPU, 1 CPU \(reward_model\) needs 8 "
                                          r"GPUs, more than the Ray cluster's 4: lower placement.pools.reward"):
        check_layout(cfg_of("reward.model.path=/rm", "placement.pools.reward.workers=8"), FOUR_GPUS)
    # 4 GPUs in total, but a 3-GPU worker fits on no node of 2
    nodes = [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 2.0}]
    with pytest.raises(LayoutError, match=r"a worker of pool rm: 1 worker\(s\) x 3 GPU.*fits on no node.*"
                                          r"2 GPU/8 CPU, 2 GPU/8 CPU"):
        check_layout(cfg_of("reward.model.path=/rm", "trainer.num_workers=1", "placement.pools.rm={gpus: 3}",
                            "placement.roles.reward_model=rm"), nodes)
    assert check_layout(cfg_of("trainer.num_workers=4"), nodes).pools["main"].workers == 4


@pytest.mark.parametrize("args, message", [
    (["placement.roles.planner=main"], "config key 'placement.roles.planner': unknown role 'planner'; known: actor"),
    (["placement.roles.critic=gpu9"], "config key 'placement.roles.critic': names the pool 'gpu9', which"),
    (["placement.pools.rm={gpus: -1}"], "config key 'placement.pools.rm.gpus': must be a number >= 0, got -1"),
    (["placement.pools.rm={nodes: 2}"], "config key 'placement.pools.rm.nodes': unknown key"),
    (["placement.preset=spread"], "config key 'placement.preset': unknown preset 'spread'"),
    (["reward.judge.url=ftp://judge:21/v1", "reward.judge.model=m"],
     "config key 'reward.judge.url': 'ftp://judge:21/v1' is not an http(s) URL"),
    (["reward.remote.url=localhost:9000"], "config key 'reward.remote.url': 'localhost:9000' is not an http(s) URL"),
    (["reward.judge.url=http://127.0.0.1:1/v1", "reward.judge.model=m", "reward.judge.template='Grade: {prompt}'"],
     "config key 'reward.judge.template': has no {response} slot"),
    (["reward.judge.template='Grade {answer}: {response}'"],
     "config key 'reward.judge.template': unknown slot {answer}"),
    (["reward.judge.template=Grade: {response}"],  # unquoted, YAML reads a mapping
     "config key 'reward.judge.template': must be a string, got dict (quote it on the command line"),
    (["reward.judge.parser=vibes"], "config key 'reward.judge.parser': must be scale, verdict or logprob"),
    (["reward.remote.concurrency=0"], "config key 'reward.remote.concurrency': 0 is out of range"),
    (["reward.model.tranform=raw"], "config key 'reward.model.tranform': unknown key"),
    (["reward.sources={rule: 1, judge: 1}"], "config key 'reward.sources': uses 'judge', which is not configured"),
    (["reward.sources={rule: 1, oracle: 1}"], "config key 'reward.sources': names the unknown source 'oracle'"),
])
def test_bad_input_fails_at_load_with_one_line_naming_it(args, message):
    with pytest.raises(ConfigError) as info:
        load_config(args, cuda_available=False)
    assert message in str(info.value) and "\n" not in str(info.value)


@ray.remote
class Probe:
    """Reports where it runs: node id and the logical GPUs Ray gave it."""

    def where(self):
        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]


@pytest.fixture(scope="module")
def two_gpu_nodes():
    """A two-node Ray cluster on this machine, each node declaring 2 logical GPUs and 2 CPUs."""
    with ray_test_cluster({"num_cpus": 2, "num_gpus": 2}, [{"num_cpus": 2, "num_gpus": 2}]) as cluster:
        yield cluster


@pytest.mark.slow  # two raylets and seven actor processes: about 2 minutes on a loaded 2-core machine
def test_roles_land_on_their_pools_bundles_and_nodes(two_gpu_nodes):
    from reasonrl.controller.placement import node_capacities

    # PPO (actor + critic colocated on main, 3 workers) and a reward model on a GPU of its own: 4 GPUs over 2 nodes
    cfg = cfg_of("algorithm=ppo", "reward.model.path=/rm")
    layout = check_layout(cfg, node_capacities())
    assert {n: p.workers for n, p in layout.pools.items()} == {"main": 3, "reward": 1}
    groups = {name: reserve_pool(pool) for name, pool in layout.pools.items()}
    try:
        where = {}
        for role in ("actor", "critic", "reward_model"):
            pool = layout.pool_of(role)
            probes = [Probe.options(**role_options(layout, role, rank, groups[pool.name])).remote()
                      for rank in range(pool.workers)]
            where[role] = ray.get([p.where.remote() for p in probes])
        table = {name: ray.util.placement_group_table(g)["bundles_to_node_id"] for name, g in groups.items()}
        for role in ("actor", "critic", "reward_model"):
            pool = layout.roles[role]
            for rank, (node, gpus) in enumerate(where[role]):
                assert node == table[pool][rank], (role, rank)  # rank i on bundle i's node
                assert len(gpus) == 1
        # the critic's rank i shares the actor's rank i GPU (0.5 each); the actor's ranks are on distinct GPUs
        assert where["critic"] == where["actor"]
        actor_gpus = {(node, gpus[0]) for node, gpus in where["actor"]}
        assert len(actor_gpus) == 3
        # the reward model's GPU is the fourth one: neither of the actor's
        (rm_node, rm_gpus), = where["reward_model"]
        assert (rm_node, rm_gpus[0]) not in actor_gpus
        assert len({node for node, _ in where["actor"]} | {rm_node}) == 2  # both nodes are used
    finally:
        for g in groups.values():
            ray.util.remove_placement_group(g)
    # one GPU more than the cluster has is refused before anything is asked of Ray, naming the numbers
    with pytest.raises(LayoutError, match="need 5 GPUs in all"):
        check_layout(cfg_of("algorithm=ppo", "reward.model.path=/rm", "trainer.num_workers=4"), node_capacities())
