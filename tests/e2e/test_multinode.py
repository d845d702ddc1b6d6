"""Multi-node placement on a real two-node Ray cluster started on this machine (Ray's own test cluster: two raylets,
one CPU each, distinct node ids): workers spread over the nodes, torch's rendezvous is found on rank 0's node, too
many workers fail at start-up with both numbers named, and the training command trains over the two nodes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import ray
import torch
import torch.distributed as dist

from helpers import ray_test_cluster
from reasonrl.controller import ClusterTooSmallError, WorkerGroup
from reasonrl.controller.placement import check_capacity, ranks_that_fit
from reasonrl.workers.dispatch import ONE_TO_ALL, dispatch
from reasonrl.workers.distributed import init_distributed
from paths import REPO


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ProbeWorker travels to the workers by value


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head and a worker node of one CPU each; the test process is the driver."""
    env = {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "REASONRL_DATA_DIR", "PYTHONPATH") if k in os.environ}
    with ray_test_cluster({"num_cpus": 1, "resources": {"node_a": 1}}, [{"num_cpus": 1, "resources": {"node_b": 1}}],
                          env) as cluster:
        yield cluster


class ProbeWorker:
    """The WorkerGroup contract (rank, world size, rendezvous address) without a model: joins the gloo group and
    reports where it runs."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, num_threads: int) -> None:
        self.rank, self.master_addr = rank, master_addr
        init_distributed(rank, world_size, master_addr, master_port, "cpu")

    @dispatch(ONE_TO_ALL)
    def where(self) -> dict:
        total = torch.tensor([self.rank + 1.0])
        dist.all_reduce(total)  # 1 + 2: both ranks reached each other through the rendezvous
        return {"rank": self.rank, "node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address(), "master_addr": self.master_addr,
                "rank_sum": float(total.item())}


@pytest.mark.slow
def test_group_spreads_over_nodes_and_meets_on_rank0_node(two_node_cluster):
    group = WorkerGroup(ProbeWorker, 2, use_gpu=False, cpus_per_worker=1, init_kwargs={})
    try:
        info = group.where()
    finally:
        group.shutdown()
    assert [i["rank"] for i in info] == [0, 1]
    assert info[0]["node_id"] != info[1]["node_id"], "PACK did not spill the second bundle onto the second node"
    assert all(i["master_addr"] == info[0]["node_ip"] for i in info)  # rank 0's node address, not a constant
    assert [i["rank_sum"] for i in info] == [3.0, 3.0]


@pytest.mark.slow
def test_more_workers_than_cluster_cpus_fails_at_start_up(two_node_cluster):
    with pytest.raises(ClusterTooSmallError, match=r"num_workers=3 .*need 3 CPUs.* has 2 CPUs over 2 node"):
        WorkerGroup(ProbeWorker, 3, use_gpu=False, cpus_per_worker=1, init_kwargs={})


def test_capacity_counts_whole_bundles_per_node():
    # Two nodes of 1 and 3 GPUs hold 4 one-GPU ranks, or 8 half-GPU ranks (2 + 6); a bundle never spans nodes, so
    # two nodes of 1.5 GPUs each hold only 2 one-GPU ranks although the cluster has 3 GPUs.
    assert ranks_that_fit([{"GPU": 1, "CPU": 8}, {"GPU": 3, "CPU": 8}], {"GPU": 1, "CPU": 1}) == 4
    assert ranks_that_fit([{"GPU": 1, "CPU": 8}, {"GPU": 3, "CPU": 8}], {"GPU": 0.5, "CPU": 1}) == 8
    assert ranks_that_fit([{"GPU": 1.5, "CPU": 8}, {"GPU": 1.5, "CPU": 8}], {"GPU": 1, "CPU": 1}) == 2
    # CPUs bound too: 2 GPUs but 1 CPU on the node -> 1 rank
    assert ranks_that_fit([{"GPU": 2, "CPU": 1}], {"GPU": 1, "CPU": 1}) == 1
    with pytest.raises(ClusterTooSmallError, match=r"num_workers=3 workers need 3 GPUs .* has 2 GPUs"):
        check_capacity(3, {"GPU": 1, "CPU": 1}, [{"GPU": 1, "CPU": 4}, {"GPU": 1, "CPU": 4}])
    check_capacity(2, {"GPU": 1, "CPU": 1}, [{"GPU": 1, "CPU": 4}, {"GPU": 1, "CPU": 4}])  # fits: no error


@pytest.mark.slow
def test_train_two_steps_one_worker_per_node(two_node_cluster, tmp_path, tiny_policy):
    """The training command joins the cluster (trainer.ray_address) and trains two steps with one worker on each
    node over gloo; Ray's actor table says where the two ActorRolloutRef workers ran. Placement is plumbing: the
    tiny random policy (conftest's ``tiny_policy``) stands in for SmolLM2."""
    out = tmp_path / "run"
    args = ["task=gsm8k", f"model.path={tiny_policy}", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_new_tokens=8", "actor.micro_batch_size_per_worker=2", "reward.workers=1",
            "trainer.logger=[jsonl]", "trainer.device=cpu", "trainer.num_workers=2", "trainer.total_steps=2",
            "trainer.save_every=0", f"trainer.ray_address={two_node_cluster.address}", f"trainer.output_dir={out}"]
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", *args], capture_output=True, text=True,
                          timeout=1800, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    # Ray's actor table in the GCS (ray.util.state would need the dashboard, which the test cluster lacks)
    workers = [a for a in ray._private.state.actors().values() if a["ActorClassName"] == "ActorRolloutRefWorker"]
    assert len(workers) == 2
    nodes = {a["Address"]["NodeID"] for a in workers}
    assert len(nodes) == 2, workers
    assert nodes == {n.node_id for n in two_node_cluster.list_all_nodes()}
