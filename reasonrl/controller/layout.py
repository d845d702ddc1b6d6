"""The whole run's layout: which pool each role runs on, checked against the Ray cluster before anything starts.

``resolve_layout(cfg, cluster)`` turns the ``placement`` section (its preset, then the user's pools and roles; see
``reasonrl/config/placement_schema.py``) and the roles the config uses into pools of concrete sizes;
``check_layout(cfg, cluster)`` also checks that they fit, and raises ``LayoutError`` naming the pools, their roles and
the numbers when they do not. Both are pure functions of the config and a resource dict (``ray.cluster_resources()``)
or a list of per-node dicts (``placement.node_capacities()``: then each bundle must also fit inside one node).

``reserve_pool`` and ``role_options`` place a layout on the cluster: one placement group per pool (one bundle per
worker, strategy PACK), and rank i of every role of a pool on bundle i, each role taking an equal share of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from reasonrl.config.placement_schema import PLACEMENT_PRESETS, placement_config

from .placement import ClusterTooSmallError

Cluster = Union[Mapping[str, float], Sequence[Mapping[str, float]]]
"""A cluster's resources: one dict of totals (``ray.cluster_resources()``) or one dict per node."""

SEPARATE_ROLES = ("actor", "critic", "reward_model", "async_rollout")
"""Roles that are Ray actors of their own (and so take a share of their bundle). The reference policy lives inside
the actor's workers: in the actor's pool it takes no share."""


class LayoutError(ClusterTooSmallError):
    """The layout does not fit the cluster (or names a role or pool it cannot use); the message names them."""


@dataclass(frozen=True)
class Pool:
    """A resolved pool: ``workers`` bundles of ``gpus`` GPUs and ``cpus`` CPUs, shared by ``roles``."""

    name: str
    workers: int
    gpus: float
    cpus: float
    roles: Tuple[str, ...]

    def bundle(self) -> Dict[str, float]:
        """One worker's placement-group bundle (zero entries left out; at least a sliver of CPU, as Ray wants one
        resource per bundle)."""
        bundle = {k: v for k, v in (("GPU", self.gpus), ("CPU", self.cpus)) if v > 0}
        return bundle or {"CPU": 0.01}

    def describe(self) -> str:
        per = ", ".join(f"{v:g} {k}" for k, v in (("GPU", self.gpus), ("CPU", self.cpus)) if v > 0) or "no devices"
        return f"{self.name}: {self.workers} worker(s) x {per} ({', '.join(self.roles)})"


@dataclass(frozen=True)
class Layout:
    """Pools by name and the pool of each role the run uses."""

    pools: Dict[str, Pool]
    roles: Dict[str, str]

    def pool_of(self, role: str) -> Pool:
        """The pool ``role`` runs on (KeyError naming the role when the run does not use it)."""
        if role not in self.roles:
            raise KeyError(f"the layout has no role {role!r} (roles: {', '.join(self.roles)})")
        return self.pools[self.roles[role]]

    def share(self, role: str) -> Dict[str, float]:
        """What one rank of ``role`` asks for inside its bundle: the bundle split evenly between the pool's roles
        that are actors of their own (``SEPARATE_ROLES``; the reference next to the actor takes none)."""
        pool = self.pool_of(role)
        separate = [r for r in pool.roles if r in SEPARATE_ROLES or "actor" not in pool.roles]
        if role not in separate:
            return {"GPU": 0.0, "CPU": 0.0}
        return {"GPU": pool.gpus / len(separate), "CPU": pool.cpus / len(separate)}

    def table(self) -> str:
        """One line per pool, as start-up prints it."""
        return "\n".join(p.describe() for p in self.pools.values())


def active_roles(cfg: Any) -> List[str]:
    """The roles ``cfg`` runs: actor; reference with a KL term; critic with GAE; reward_model with
    ``reward.model.path``; async_rollout with ``trainer.mode=async``."""
    from reasonrl.config.passes import needs_reference

    roles = ["actor"]
    if needs_reference(cfg):
        roles.append("reference")
    if cfg.algorithm.adv_estimator == "gae":
        roles.append("critic")
    if (cfg.reward.model or {}).get("path"):
        roles.append("reward_model")
    if cfg.trainer.mode == "async":
        roles.append("async_rollout")
    return roles


def _totals(cluster: Cluster) -> Dict[str, float]:
    if isinstance(cluster, Mapping):
        return {k: float(v) for k, v in cluster.items()}
    totals: Dict[str, float] = {}
    for node in cluster:
        for k, v in node.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    return totals


def resolve_layout(cfg: Any, cluster: Cluster) -> Layout:
    """The pools (sizes resolved) and roles of ``cfg`` on ``cluster``; LayoutError for a role mapped to a pool that
    has no size. A pool's ``workers: 0`` means: the actor's pool, ``trainer.num_workers`` or else the GPUs the other
    pools leave (1 on a cluster without GPUs); the async rollout pool, ``async_rollout.num_rollout_workers``. With
    ``async_rollout.share_devices`` the rollout replicas are on the actor's pool (the backend gives the actor rank and
    each replica on its bundle an equal share, ``RunPlan.gpu_share``)."""
    spec = placement_config(cfg.placement)
    preset = spec.preset if spec.preset != "auto" else cfg.trainer.mode
    base = PLACEMENT_PRESETS[preset]
    pools = {name: dict(p) for name, p in base["pools"].items()}
    for name, override in spec.pools.items():
        pools[name] = {**pools.get(name, {"workers": 1, "gpus": 0, "cpus": 1}), **override}
    mapping = {**base["roles"], **spec.roles}
    if cfg.trainer.mode == "async" and cfg.async_rollout.share_devices:  # replica r on actor rank r's bundle
        mapping["async_rollout"] = mapping["actor"]
    used = active_roles(cfg)
    roles = {role: mapping.get(role, mapping["actor"]) for role in used}
    total_gpus = _totals(cluster).get("GPU", 0.0)
    members: Dict[str, List[str]] = {}
    for role, pool in roles.items():
        if pool not in pools:
            raise LayoutError(f"placement.roles.{role}: the pool {pool!r} is not defined (placement.pools)")
        members.setdefault(pool, []).append(role)
    sized: Dict[str, Dict[str, float]] = {}
    for name in members:
        p = {"workers": 1, "gpus": 0.0, "cpus": 1.0, **pools[name]}
        if total_gpus <= 0:  # a CPU cluster: the roles time-share the cores, as the colocated critic does today
            p["gpus"] = 0.0
            if name not in spec.pools and "actor" not in members[name]:
                p["cpus"] = 0.0
        if p["workers"] == 0 and "async_rollout" in members[name] and "actor" not in members[name]:
            p["workers"] = cfg.async_rollout.num_rollout_workers  # (on the actor's pool, the actor sizes it)
        sized[name] = p
    main = roles["actor"]
    if sized[main]["workers"] == 0:
        if cfg.trainer.num_workers > 0:
            sized[main]["workers"] = cfg.trainer.num_workers
        elif total_gpus > 0 and sized[main]["gpus"] > 0:
            others = sum(p["workers"] * p["gpus"] for n, p in sized.items() if n != main)
            sized[main]["workers"] = max(1, int((total_gpus - others) // sized[main]["gpus"]))
        else:
            sized[main]["workers"] = 1
    for name, p in sized.items():
        if p["workers"] == 0:
            raise LayoutError(f"placement.pools.{name}.workers is 0, but the pool runs {', '.join(members[name])}")
    return Layout({n: Pool(n, int(p["workers"]), float(p["gpus"]), float(p["cpus"]), tuple(members[n]))
                   for n, p in sized.items()}, roles)


def check_layout(cfg: Any, cluster: Cluster) -> Layout:
    """``resolve_layout``, then the fit: every pool's bundles within the cluster's GPUs and CPUs (and, given one
    dict per node, each bundle inside one node). LayoutError naming the pools, their roles and the numbers."""
    layout = resolve_layout(cfg, cluster)
    totals = _totals(cluster)
    for kind, attr in (("GPU", "gpus"), ("CPU", "cpus")):
        have = totals.get(kind, 0.0)
        need = {n: p.workers * getattr(p, attr) for n, p in layout.pools.items()}
        for name, amount in need.items():
            if amount > have + 1e-9:
                pool = layout.pools[name]
                raise LayoutError(f"placement: pool {pool.describe()} needs {amount:g} {kind}s, more than the Ray "
                                  f"cluster's {have:g}: lower placement.pools.{name}.workers or "
                                  f"placement.pools.{name}.{attr}, or add nodes")
        if sum(need.values()) > have + 1e-9:
            parts = "; ".join(layout.pools[n].describe() for n in need if need[n] > 0)
            raise LayoutError(f"placement: the pools need {sum(need.values()):g} {kind}s in all ({parts}) but the "
                              f"Ray cluster has {have:g}: shrink a pool (placement.pools.<name>.workers), put roles "
                              f"on one pool (placement.roles.<role>=<pool>), or add nodes")
    if not isinstance(cluster, Mapping):
        _check_nodes(layout, list(cluster))
    return layout


def _check_nodes(layout: Layout, nodes: List[Mapping[str, float]]) -> None:
    """First-fit decreasing of every bundle onto the nodes; LayoutError naming the first pool that does not fit."""
    free = [{"GPU": float(n.get("GPU", 0.0)), "CPU": float(n.get("CPU", 0.0))} for n in nodes]
    bundles = [(p, p.bundle()) for p in layout.pools.values() for _ in range(p.workers)]
    bundles.sort(key=lambda pb: (pb[1].get("GPU", 0.0), pb[1].get("CPU", 0.0)), reverse=True)
    for pool, bundle in bundles:
        for node in free:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] -= v
                break
        else:
            per_node = ", ".join(f"{n.get('GPU', 0.0):g} GPU/{n.get('CPU', 0.0):g} CPU" for n in nodes)
            raise LayoutError(f"placement: a worker of pool {pool.describe()} fits on no node once the larger "
                              f"bundles are placed (a bundle never spans nodes; nodes: {per_node})")


def reserve_pool(pool: Pool, timeout_s: float = 180.0):
    """A ready placement group for ``pool``: ``pool.workers`` copies of its bundle, strategy PACK."""
    import ray
    from ray.util.placement_group import placement_group

    from .placement import PLACEMENT_STRATEGY

    group = placement_group([pool.bundle() for _ in range(pool.workers)], strategy=PLACEMENT_STRATEGY)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(group)
        raise LayoutError(f"pool {pool.describe()} could not be placed within {timeout_s:g} s: other groups hold "
                          f"the resources (free now: {ray.available_resources()})") from None
    return group


def role_options(layout: Layout, role: str, rank: int, group: Any) -> Dict[str, Any]:
    """Ray actor options for rank ``rank`` of ``role``: its share of bundle ``rank`` of its pool's placement group
    ``group`` (from ``reserve_pool``)."""
    from .placement import on_bundle

    pool = layout.pool_of(role)
    if not 0 <= rank < pool.workers:
        raise ValueError(f"{role} rank {rank}: pool {pool.name} has {pool.workers} worker(s)")
    share = layout.share(role)
    return {"num_gpus": share["GPU"], "num_cpus": share["CPU"], "scheduling_strategy": on_bundle(group, rank)}
