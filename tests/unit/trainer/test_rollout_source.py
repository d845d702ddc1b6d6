"""The rollout source is a declared seam: the loop calls only the members of ``RolloutSource`` (and needs every one of
them), and both sources implement exactly those members, side by side, with the protocol's signatures."""
from __future__ import annotations

import ast
import inspect

import pytest
from paths import REPO

from reasonrl.trainer.continuous_source import ContinuousSource
from reasonrl.trainer.fleet_source import FleetSource
from reasonrl.trainer.rollout_source import RolloutSource
from reasonrl.trainer.sources import AsyncSource, ColocatedSource

SOURCES = [ColocatedSource, AsyncSource, FleetSource, ContinuousSource]


def declared() -> set:
    return {n for n, v in vars(RolloutSource).items() if not n.startswith("_") and callable(v)}


def loop_calls() -> set:
    """Every ``self.source.X`` the trainer reads, and a check that it reaches the source no other way."""
    used = set()
    for node in ast.walk(ast.parse((REPO / "reasonrl/trainer/trainer.py").read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "source":
            assert isinstance(node.value.value, ast.Name) and node.value.value.id == "self"
            used.add(node.attr)
        if isinstance(node, ast.Name):
            assert node.id != "source", "the trainer holds the source in a local name: the scan would miss its calls"
    return used


def test_the_protocol_is_the_few_members_the_loop_needs():
    assert declared() == {"start", "next_round", "round_metrics", "generate_verified", "release_devices", "publish",
                          "check_weight_sync", "save", "load", "close"}
    assert loop_calls() == declared()  # nothing else is called, and nothing declared goes unused


@pytest.mark.parametrize("source", SOURCES, ids=lambda c: c.__name__)
def test_each_source_implements_exactly_the_protocol(source):
    assert issubclass(source, RolloutSource)
    public = {n for n in dir(source) if not n.startswith("_")}
    assert public == declared(), f"{source.__name__}: members beyond the protocol {sorted(public - declared())}"
    for name in declared():
        want = list(inspect.signature(getattr(RolloutSource, name)).parameters)
        assert list(inspect.signature(getattr(source, name)).parameters) == want, f"{source.__name__}.{name}"


def test_the_sources_stand_side_by_side():
    assert ColocatedSource not in AsyncSource.__mro__ and AsyncSource not in ColocatedSource.__mro__
    assert all(c.__mro__ == (c, object) for c in SOURCES)


def test_a_class_missing_a_member_is_not_a_source():
    members = {n: (lambda self, *a: None) for n in declared() - {"publish"}}
    assert not issubclass(type("NoPublish", (), members), RolloutSource)
    assert issubclass(type("Full", (), {**members, "publish": lambda self, version, timer: {}}), RolloutSource)
