"""The ``placement`` section: which pool of workers each role runs on.

A *pool* is a set of identical workers (``workers`` of them, each ``gpus`` GPUs and ``cpus`` CPUs: one Ray
placement-group bundle per worker); a *role* (``ROLES``) is mapped to a pool, and roles mapped to the same pool are
colocated (their ranks share the pool's bundles, rank i of each role on bundle i, each taking an equal share). The
presets (``PLACEMENT_PRESETS``) are today's layouts; the user's ``placement.pools`` and ``placement.roles`` are laid
over the preset. In ``schema.py`` the section is one dict field (``Config.placement``); this module holds its typed
form and the checks that need no cluster (unknown role, unknown pool, bad numbers); the fit against the Ray
cluster is ``reasonrl.controller.layout.check_layout``. docs/rewards.md has examples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping

from .reward_sources_schema import SectionError

ROLES = ("actor", "reference", "critic", "reward_model", "judge", "async_rollout")
"""The roles a layout places: actor (with its rollout engine, the hybrid engine), reference, critic (PPO),
reward_model (``reward.model``), judge (a judge on an engine of our own: not wired yet; ``reward.judge.url`` is an
endpoint and needs no pool), async_rollout (``trainer.mode=async``'s rollout workers)."""

POOL_KEYS = ("workers", "gpus", "cpus")
"""A pool's keys: ``workers`` (0 for the actor's pool: ``trainer.num_workers``, or the GPUs the other pools leave, or
1 on a CPU cluster), ``gpus`` and ``cpus`` per worker."""

PLACEMENT_PRESETS: Dict[str, Dict[str, Any]] = {
    # today's default: every training role on the actor's ranks (the PPO critic shares each actor GPU at half); a
    # reward model on one worker of its own
    "colocated": {"pools": {"main": {"workers": 0, "gpus": 1, "cpus": 1},
                            "reward": {"workers": 1, "gpus": 1, "cpus": 1}},
                  "roles": {"actor": "main", "reference": "main", "critic": "main", "reward_model": "reward"}},
    # trainer.mode=async: the rollout workers on devices of their own (workers: async_rollout.num_rollout_workers)
    "async": {"pools": {"main": {"workers": 0, "gpus": 1, "cpus": 1},
                        "rollout": {"workers": 0, "gpus": 1, "cpus": 1},
                        "reward": {"workers": 1, "gpus": 1, "cpus": 1}},
              "roles": {"actor": "main", "reference": "main", "critic": "main", "reward_model": "reward",
                        "async_rollout": "rollout"}},
}
"""The layouts a run gets without ``placement.pools``/``roles``: ``auto`` picks ``trainer.mode``'s. On a cluster
without GPUs every ``gpus`` of a preset is 0 (the roles time-share the cores, as today)."""


@dataclass
class PlacementConfig:
    """``placement``, typed."""

    preset: str = "auto"
    """The layout to start from: auto (the one of ``trainer.mode``), colocated, async."""
    pools: Dict[str, Dict[str, float]] = field(default_factory=dict)
    """Pools added or changed over the preset's: ``{name: {workers, gpus, cpus}}`` (a pool named here replaces only
    the keys it gives), e.g. ``placement.pools.rm={workers: 2, gpus: 1}``."""
    roles: Dict[str, str] = field(default_factory=dict)
    """Roles moved over the preset's: ``{role: pool}``, e.g. ``placement.roles.reward_model=rm``."""


def placement_config(section: Mapping[str, Any]) -> PlacementConfig:
    """The typed section with the user's pools and roles laid over its preset's (``preset: auto`` is kept; the
    layout resolves it). SectionError naming the first unknown key, role, pool or bad number."""
    section = dict(section or {})
    for key in section:
        if key not in ("preset", "pools", "roles"):
            raise SectionError(f"placement.{key}", "unknown key; known: preset, pools, roles")
    preset = str(section.get("preset", "auto"))
    if preset != "auto" and preset not in PLACEMENT_PRESETS:
        raise SectionError("placement.preset", f"unknown preset {preset!r}; known: auto, "
                                               f"{', '.join(PLACEMENT_PRESETS)}")
    pools = dict(section.get("pools") or {})
    for name, pool in pools.items():
        if not isinstance(pool, Mapping):
            raise SectionError(f"placement.pools.{name}", f"must be {{workers, gpus, cpus}}, got {pool!r}")
        for key, value in pool.items():
            if key not in POOL_KEYS:
                raise SectionError(f"placement.pools.{name}.{key}", f"unknown key; known: {', '.join(POOL_KEYS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise SectionError(f"placement.pools.{name}.{key}", f"must be a number >= 0, got {value!r}")
            if key == "workers" and value != int(value):
                raise SectionError(f"placement.pools.{name}.workers", f"must be a whole number, got {value}")
    roles = dict(section.get("roles") or {})
    known_pools = set(pools) | {p for preset_ in PLACEMENT_PRESETS.values() for p in preset_["pools"]}
    for role, pool in roles.items():
        if role not in ROLES:
            raise SectionError(f"placement.roles.{role}", f"unknown role {role!r}; known: {', '.join(ROLES)}")
        if pool not in known_pools:
            raise SectionError(f"placement.roles.{role}", f"names the pool {pool!r}, which placement.pools does not "
                                                          f"define (known: {', '.join(sorted(known_pools))})")
    if "judge" in roles:
        raise SectionError("placement.roles.judge", "a judge on an engine of our own is not wired yet; serve the "
                                                    "judge model and point reward.judge.url at it")
    return PlacementConfig(preset, {k: dict(v) for k, v in pools.items()}, {k: str(v) for k, v in roles.items()})


def validate_placement(cfg: Any, need) -> None:
    """``load.validate``'s hook: the section's shape (``need(ok, key, message)`` reports)."""
    try:
        placement_config(cfg.placement)
    except SectionError as exc:
        need(False, exc.key, exc.message)
