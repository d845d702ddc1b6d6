"""The reward-source registry: names to ``RewardSource`` classes, the shipped ones (``rule``, ``model``, ``judge``,
``remote``, each registered in its own module, imported on the first lookup) and third-party ones from the
``reasonrl.reward_sources`` entry-point group (``reasonrl.registry``).

A source is one class: its name (the registration), its settings (``schema``, a dataclass read from
``settings_key`` of the config, checked by ``build_section`` and the dataclass's own ``check(key)``), whether the
run turns it on (``switch``), how it is built (``from_config``) and how it scores a batch of reward items
(``submit``: a handle with ``done()`` and ``result()``, one ``VerifyResult`` per item in order; a sample without a
verdict is a failure, never a 0). The router (router.py), the row's sources (items.py), the config check
(``validate_reward_sources``) and ``make_pool`` read every source through this registry; docs/rewards.md says how a
plugin registers one.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type

from reasonrl.config.reward_sources_schema import SectionError, build_section
from reasonrl.registry import Registry, named_subclass

__all__ = ["DEFAULT_SOURCE", "ENTRY_POINT_GROUP", "REWARD_SOURCES", "RewardSource", "check_source_weights",
           "ordered_sources", "read_sources", "register_reward_source"]

ENTRY_POINT_GROUP = "reasonrl.reward_sources"

DEFAULT_SOURCE = "rule"
"""The source of a row (or an item) that names none: the rule verifiers."""


class RewardSource:
    """One reward source. Subclasses set the class attributes and implement ``submit``; the registration sets
    ``name``."""

    name: str = ""
    """The name rows and ``reward.sources`` use (set by the registration)."""
    label: str = ""
    """What its outcome is logged under (``reward/<label>/...``, ``reward_source/<label>/...``); empty: ``name``."""
    order: int = 100
    """Where it stands in a combined row's name and reason (``math+reward_model``): lower first, then by name."""
    schema: Optional[type] = None
    """The dataclass of its settings (None: it takes none)."""
    settings_key: Optional[str] = "reward.source_options.{name}"
    """The config key holding its settings (``{name}`` is filled in); None: it has no section of its own."""
    switch: Optional[str] = None
    """The settings field that turns it on when set (``path``, ``url``); None: on when its section is given (or
    always, without ``settings_key``)."""
    decides_correct: bool = False
    """In a row with several sources, its verdict is the row's ``correct`` (and its ``info`` the row's base)."""
    counted: bool = True
    """The router logs ``reward_source/<label>/{scored,failed,score_mean}`` for it."""

    # -- the config side (classmethods: nothing is built) ------------------------------------------------------
    @classmethod
    def config_key(cls) -> Optional[str]:
        return cls.settings_key.format(name=cls.name) if cls.settings_key else None

    @classmethod
    def read(cls, reward: Any) -> Tuple[Any, bool]:
        """``(settings, on)`` from the ``reward`` section; SectionError naming the key on bad input."""
        key = cls.config_key()
        if key is None:
            return None, True
        raw = _lookup(reward, key.split(".")[1:])
        if raw is not None and not isinstance(raw, Mapping):
            raise SectionError(key, f"must be a mapping of settings, got {raw!r}")
        if cls.schema is None:
            if raw:
                raise SectionError(key, f"the reward source {cls.name!r} takes no settings, got {dict(raw)}")
            return None, raw is not None
        settings = build_section(cls.schema, raw, key)
        on = bool(getattr(settings, cls.switch)) if cls.switch else raw is not None
        return settings, on

    @classmethod
    def off_hint(cls) -> str:
        """What turns it on, said when a row needs it and it is off."""
        key = cls.config_key()
        return f"{key}.{cls.switch} is not set" if cls.switch else f"{key} is not set"

    @classmethod
    def label_for(cls, row: Dict[str, Any], reward: Any) -> str:
        """What ``row``'s outcome from this source is logged under."""
        return cls.label or cls.name

    @classmethod
    def from_config(cls, settings: Any, reward: Any, layout: Any = None) -> "RewardSource":
        """The source a run uses (``layout``: the run's ``controller.layout.Layout`` or None)."""
        return cls(settings, reward.score_range)

    # -- scoring -------------------------------------------------------------------------------------------------
    def submit(self, items: List[Any]) -> Any:
        """Queue ``items`` (``RewardItem``s) and return at once a handle: ``done()``, ``result()`` (one
        ``VerifyResult`` per item, in order)."""
        raise NotImplementedError

    def pop_stats(self) -> Dict[str, float]:
        """Its own counters since the last call."""
        return {}

    def close(self) -> None:
        """Release what it holds (idempotent)."""


def _lookup(obj: Any, path: List[str]) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, Mapping) else getattr(obj, part, None)
        if obj is None:
            return None
    return obj


REWARD_SOURCES = Registry("reward source", config_key="reward.sources or a row's reward_model.style/sources",
                          entry_point_group=ENTRY_POINT_GROUP,
                          check=named_subclass(RewardSource, "register_reward_source"),
                          builtins=("reasonrl.rewards.rule", "reasonrl.rewards.reward_model", "reasonrl.rewards.judge",
                                    "reasonrl.rewards.remote"))
"""Registered reward-source classes by name."""


def register_reward_source(name: str) -> Callable[[Type[RewardSource]], Type[RewardSource]]:
    """Class decorator: ``@register_reward_source("name")`` on a ``RewardSource`` subclass."""
    return REWARD_SOURCES.register(name)


def ordered_sources(names: Optional[Any] = None) -> List[str]:
    """``names`` (default: every registered source) in the sources' ``order``."""
    names = REWARD_SOURCES.names() if names is None else list(names)
    return sorted(names, key=lambda n: (REWARD_SOURCES[n].order, n))


def read_sources(reward: Any) -> Dict[str, Tuple[Any, bool]]:
    """Every registered source's ``(settings, on)``; SectionError naming the first bad key."""
    return {name: REWARD_SOURCES[name].read(reward) for name in ordered_sources()}


def check_source_weights(weights: Any, where: str) -> Dict[str, float]:
    """A ``{source: weight}`` mapping: registered sources, finite weights >= 0, not all 0 (entries that are None are
    dropped: a Parquet struct holds every key of every row). ValueError naming ``where``."""
    if not isinstance(weights, Mapping):
        raise ValueError(f"{where} must map sources to weights, e.g. {{rule: 0.5, model: 0.5}}; got {weights!r}")
    out: Dict[str, float] = {}
    for name, weight in weights.items():
        if weight is None:
            continue
        if name not in REWARD_SOURCES:
            raise ValueError(f"{where} names the unknown source {name!r}; known: {', '.join(ordered_sources())} "
                             f"(plugins register through the {ENTRY_POINT_GROUP!r} entry-point group)")
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: the weight of {name!r} is {weight!r}, not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{where}: the weight of {name!r} must be a finite number >= 0, got {weight}")
        out[str(name)] = weight
    if not out or not any(out.values()):
        raise ValueError(f"{where} must give at least one source a weight > 0, got {dict(weights)}")
    return out


def validate_reward_sources(cfg: Any, need, environ: Mapping[str, str] = os.environ) -> None:
    """``load.validate``'s check of the reward sources (``need(ok, key, message)`` reports): every source's
    settings, the names under ``reward.source_options``, each source's environment (an API key's variable) and
    ``reward.sources``."""
    reward = cfg.reward
    for name in reward.source_options or {}:
        cls = REWARD_SOURCES.get(name)
        if cls is None or cls.config_key() != f"reward.source_options.{name}":
            owned = sorted(n for n in REWARD_SOURCES if REWARD_SOURCES[n].config_key() == f"reward.source_options.{n}")
            need(False, "reward.source_options", f"names {name!r}, which is not a reward source that takes its "
                                                 f"settings here; those are: {', '.join(owned) or '(none)'}"
                 + (f" ({name!r} is set in {cls.config_key()})" if cls is not None and cls.config_key() else ""))
            return
    try:
        states = read_sources(reward)
        for name, (settings, on) in states.items():
            check = getattr(settings, "check_environment", None)
            if on and check is not None:
                check(REWARD_SOURCES[name].config_key(), environ)
    except SectionError as exc:
        need(False, exc.key, exc.message)
        return
    if reward.sources:
        try:
            weights = check_source_weights(reward.sources, "reward.sources")
        except ValueError as exc:
            need(False, "reward.sources", str(exc).removeprefix("reward.sources "))
            return
        for name in weights:
            need(states[name][1], "reward.sources", f"uses {name!r}, which is not configured "
                                                    f"({REWARD_SOURCES[name].off_hint()})")
