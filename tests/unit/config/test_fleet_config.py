"""The fleet section's bad input is refused at load time, before anything starts, naming the keys."""
from __future__ import annotations

import re

import pytest

from reasonrl.config import ConfigError, load_config

FLEET = ["trainer.mode=async", "fleet.enabled=true", "data.train_batch_size=4"]


@pytest.mark.parametrize("args, key, words", [
    (["fleet.enabled=true"], "fleet.enabled", "needs trainer.mode=async"),  # colocated
    ([*FLEET, "fleet.max_restarts=-1"], "fleet.max_restarts", r"-1 is out of range; allowed: [0, inf)"),
    ([*FLEET, "fleet.watchdog_s=0"], "fleet.watchdog_s", r"0.0 is out of range; allowed: (0, inf)"),
    ([*FLEET, "async_rollout.num_rollout_workers=4", "placement.pools.rollout.workers=2"],
     "async_rollout.num_rollout_workers", "4 fleet replicas are more than placement.pools.rollout.workers=2"),
    (["trainer.mode=async", "fleet.continuous=true"], "fleet.continuous", "needs fleet.enabled=true"),
    ([*FLEET, "rollout.partial=true"], "rollout.partial", "needs fleet.continuous=true"),
    ([*FLEET, "fleet.continuous=true", "rollout.partial=true", "task=math_tool"], "rollout.partial",
     "is not supported with tool.enabled"),
    ([*FLEET, "fleet.continuous=true", "rollout.partial=true", "rollout.partial_segment_tokens=0"],
     "rollout.partial_segment_tokens", r"0 is out of range; allowed: [1, inf)"),
    (["trainer.mode=async", "rollout.check_weight_sync=true"], "rollout.check_weight_sync", "needs fleet.enabled"),
    ([*FLEET, "fleet.continuous=true", "rollout.partial=true", "rollout.check_weight_sync=true"],
     "rollout.check_weight_sync", "is not supported with fleet.continuous and rollout.partial"),
    ([*FLEET, "rollout.check_weight_sync=true", "fleet.weight_sync_max_diff=0"], "fleet.weight_sync_max_diff",
     r"0.0 is out of range; allowed: (0, inf)"),
])
def test_bad_fleet_input_is_refused_naming_the_key(args, key, words):
    with pytest.raises(ConfigError, match=rf"config key '{re.escape(key)}'.*{re.escape(words)}"):
        load_config(args, cuda_available=False)


def test_a_fleet_that_fits_loads():
    cfg, _ = load_config([*FLEET, "async_rollout.num_rollout_workers=2", "placement.pools.rollout.workers=2",
                          "fleet.max_restarts=0"], cuda_available=False)
    assert cfg.fleet.enabled and cfg.fleet.max_restarts == 0 and cfg.fleet.watchdog_s == 300.0
    cfg, _ = load_config([*FLEET, "fleet.continuous=true", "rollout.partial=true", "async_rollout.max_staleness=4"],
                         cuda_available=False)
    assert cfg.fleet.continuous and cfg.rollout.partial and cfg.rollout.partial_segment_tokens == 64
    cfg, _ = load_config([*FLEET, "rollout.check_weight_sync=true"], cuda_available=False)  # each replica checked
    assert cfg.rollout.check_weight_sync and cfg.fleet.weight_sync_max_diff == 0.1
    load_config([*FLEET, "fleet.continuous=true", "rollout.check_weight_sync=true"], cuda_available=False)
