"""``async_rollout.share_devices`` placed by the trainer's own ``RayBackend.start`` on a real Ray cluster that declares
2 logical GPUs: with it, rollout replica r lands on actor rank r's placement-group bundle and GPU (half a GPU each;
with two replicas a rank, replica r on rank r mod 2 and a third each); without it, the replica gets a GPU and a
placement group of its own. The workers are probes that report where they
run (the backend, WorkerGroup and Ray are the real ones; no model is loaded)."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
import ray

from helpers import ray_test_cluster
from reasonrl.config import load_config
from reasonrl.config.device_defaults import Hardware
from reasonrl.config.plan import RunPlan
from reasonrl.trainer.backends import RayBackend
from reasonrl.workers.dispatch import ONE_TO_ALL, dispatch

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the probes travel to the workers by value


class Probe:
    """Stands in for a worker class: takes the backend's arguments and says where it runs."""

    def __init__(self, config, model_path, rank, world_size, master_addr="", master_port=0, num_threads=0, *,
                 plan) -> None:
        self.rank = rank

    @dispatch(ONE_TO_ALL)
    def info(self):
        """Rank, GPU ids (Ray's, which CUDA_VISIBLE_DEVICES follows), placement group id, the GPU share assigned."""
        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "gpus": [str(g) for g in ray.get_gpu_ids()], "group": ctx.get_placement_group_id(),
                "GPU": ctx.get_assigned_resources().get("GPU", 0.0), "saw": getattr(self, "saw", [])}


class ActorProbe(Probe):
    pass


class ReplicaProbe(Probe):
    ready_dir = ""
    """Where each replica probe leaves a file once its start is done; a probe records which it found at its start."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.ready_dir:
            self.saw = sorted(os.listdir(self.ready_dir))
            Path(self.ready_dir, f"replica{self.rank}").touch()


@pytest.fixture(scope="module")
def two_gpus():
    with ray_test_cluster({"num_cpus": 6, "num_gpus": 2}, []) as cluster:
        yield cluster


def start(*args):
    cfg, _ = load_config(["trainer.profile=none", "trainer.mode=async", "fleet.enabled=true", "data.train_batch_size=4",
                          "rollout.n=2", "algorithm.use_kl_loss=false", *args], cuda_available=True)
    plan = RunPlan.build(cfg, Hardware("cuda", gpu_count=2))
    backend = RayBackend(actor_worker=ActorProbe, rollout_worker=ReplicaProbe)
    groups = backend.start(cfg, plan, "/no/model", lambda phase: contextlib.nullcontext())
    return groups, groups.actor_info, groups.rollouts.info()


@pytest.mark.slow  # one raylet and four probe actors: about 30 s on the shared 2-core machine
def test_replicas_share_their_actor_ranks_bundle_and_gpu_or_get_their_own(two_gpus):
    groups, actors, replicas = start("async_rollout.share_devices=true", "async_rollout.num_rollout_workers=2")
    try:
        assert [a["rank"] for a in actors] == [r["rank"] for r in replicas] == [0, 1]
        for a, r in zip(actors, replicas):
            assert a["group"] == r["group"] == groups.actor.placement_group.id.hex()  # one placement group
            assert len(a["gpus"]) == 1 and a["gpus"] == r["gpus"]  # replica r on actor rank r's bundle's GPU
            assert a["GPU"] == r["GPU"] == 0.5
        assert actors[0]["gpus"] != actors[1]["gpus"]  # the two ranks on the two GPUs
    finally:
        groups.rollouts.shutdown()  # leaves the actor's placement group to the actor group
        groups.actor.shutdown()
    groups, actors, replicas = start("async_rollout.num_rollout_workers=1")  # separate pools: 1 GPU each
    try:
        (a,), (r,) = actors, replicas
        assert a["group"] != r["group"] and a["GPU"] == r["GPU"] == 1.0
        assert len(a["gpus"]) == len(r["gpus"]) == 1 and a["gpus"] != r["gpus"]
    finally:
        groups.rollouts.shutdown()
        groups.actor.shutdown()


@pytest.mark.slow  # six probe actors on the module's raylet
def test_two_replicas_a_rank_share_its_bundle_in_thirds(two_gpus, tmp_path):
    ReplicaProbe.ready_dir = str(tmp_path)  # travels with the class (pickled by value)
    try:
        groups, actors, replicas = start("async_rollout.share_devices=true", "async_rollout.num_rollout_workers=4")
    finally:
        ReplicaProbe.ready_dir = ""
    try:
        assert [r["rank"] for r in replicas] == [0, 1, 2, 3]
        for r in replicas:  # replica r on actor rank r mod 2: its placement group, its bundle's GPU
            a = actors[r["rank"] % 2]
            assert r["group"] == a["group"] == groups.actor.placement_group.id.hex()
            assert r["gpus"] == a["gpus"] and len(r["gpus"]) == 1
            assert r["GPU"] == a["GPU"] == pytest.approx(1 / 3, abs=1e-4)  # Ray keeps 4 decimals
        assert actors[0]["gpus"] != actors[1]["gpus"]
        # the second wave (replicas 2 and 3, each beside one of the first on a GPU) started after the first was up:
        # the first wave's files are touched in its constructors, done before the group's __ray_ready__ wait returns
        # (which wave holds which ranks: test_start_waves)
        assert replicas[2]["saw"][:2] == replicas[3]["saw"][:2] == ["replica0", "replica1"]
    finally:
        groups.rollouts.shutdown()
        groups.actor.shutdown()


def test_a_cluster_short_of_cpus_for_the_replicas_room_is_named_so():
    from reasonrl.controller import ClusterTooSmallError
    from reasonrl.controller.placement import check_capacity

    # two ranks, each bundle 1 GPU and 3 CPUs (the actor rank and two replicas): the GPUs suffice, the CPUs do not
    with pytest.raises(ClusterTooSmallError, match=r"need 6 CPUs \(3 each\) but the Ray cluster has 4 CPUs"):
        check_capacity(2, {"CPU": 3, "GPU": 1.0}, [{"CPU": 4, "GPU": 2}])
    check_capacity(2, {"CPU": 2, "GPU": 1.0}, [{"CPU": 4, "GPU": 2}])  # fits: no error
