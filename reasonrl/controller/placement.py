"""Where a WorkerGroup's ranks go: a capacity check against the Ray cluster, one placement-group bundle per rank,
and the torch rendezvous address on rank 0's node.

Strategy PACK: Ray fills one node first and puts the remaining bundles on other nodes when it is full, so a group
that fits on one machine stays there (NCCL over NVLink, not the network) and a larger one spreads over as many
machines as it needs. STRICT_PACK would refuse to spread; SPREAD would scatter even a group that fits on one node.

The capacity check runs before the placement group is created: a group Ray cannot place would otherwise wait
forever for resources that never come.
"""
from __future__ import annotations

import math
import socket
from typing import Dict, List, Tuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PLACEMENT_STRATEGY = "PACK"
PLACEMENT_TIMEOUT_S = 180.0
"""How long a placement group may wait for resources the cluster has but other groups hold; then an error says so."""


class ClusterTooSmallError(RuntimeError):
    """The Ray cluster lacks the GPUs (or CPUs) for the requested workers."""


def node_capacities() -> List[Dict[str, float]]:
    """Total resources of each alive node of the connected Ray cluster."""
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def ranks_that_fit(nodes: List[Dict[str, float]], bundle: Dict[str, float]) -> int:
    """How many copies of ``bundle`` the nodes hold, each copy inside one node (a bundle never spans nodes)."""
    total = 0
    for node in nodes:
        per_node = [math.floor(node.get(k, 0.0) / v + 1e-9) for k, v in bundle.items() if v > 0]
        total += min(per_node) if per_node else 0
    return total


def check_capacity(world_size: int, bundle: Dict[str, float], nodes: List[Dict[str, float]]) -> None:
    """Raise ``ClusterTooSmallError`` naming the requested workers and the cluster's resource that runs short (GPUs,
    or CPUs: on a CPU cluster, or where each bundle also holds room for replicas sharing its GPU) when the
    ``world_size`` bundles cannot all be placed."""
    if ranks_that_fit(nodes, bundle) >= world_size:
        return
    kinds = [k for k in ("GPU", "CPU") if bundle.get(k, 0) > 0] or ["CPU"]
    kind = min(kinds, key=lambda k: ranks_that_fit(nodes, {k: bundle[k]}))  # the kind that holds the fewest
    have = sum(n.get(kind, 0.0) for n in nodes)
    each = bundle.get(kind, 0.0)
    need = world_size * each
    per_node = ", ".join(f"{n.get(kind, 0.0):g}" for n in nodes)
    raise ClusterTooSmallError(
        f"trainer.num_workers={world_size} workers need {need:g} {kind}s ({each:g} each) but the Ray cluster "
        f"has {have:g} {kind}s over {len(nodes)} node(s) ({per_node} per node): lower trainer.num_workers or add nodes")


def reserve_bundles(world_size: int, bundle: Dict[str, float]) -> PlacementGroup:
    """Check capacity, then create and wait for a placement group of ``world_size`` copies of ``bundle``."""
    check_capacity(world_size, bundle, node_capacities())
    group = placement_group([dict(bundle) for _ in range(world_size)], strategy=PLACEMENT_STRATEGY)
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(group)
        raise ClusterTooSmallError(
            f"{world_size} workers of {bundle} could not be placed within {PLACEMENT_TIMEOUT_S:g} s: the cluster has "
            f"them in total, but other worker groups hold them (free now: {ray.available_resources()})") from None
    return group


def on_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def free_port(host: str = "") -> int:
    """A TCP port free on this machine now (bound on all interfaces by default)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@ray.remote(num_cpus=0)
def _address_here() -> Tuple[str, int, str]:
    return ray.util.get_node_ip_address(), free_port(), ray.get_runtime_context().get_node_id()


def rendezvous_address(group: PlacementGroup) -> Tuple[str, int]:
    """(IP, free port) on the node of bundle 0, where rank 0 will open the torch process group's TCP store."""
    ip, port, _ = ray.get(_address_here.options(scheduling_strategy=on_bundle(group, 0)).remote())
    return ip, port
