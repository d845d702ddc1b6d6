"""``start_waves``: which ranks ``WorkerGroup`` starts together when ranks share placement-group bundles (rank r on
bundle r mod bundles), the expectations worked out by hand."""
from __future__ import annotations

import pytest

from reasonrl.controller.worker_group import start_waves


@pytest.mark.parametrize("world_size, bundles, waves", [
    (4, 2, [[0, 1], [2, 3]]),  # two replicas a rank on two ranks: 0, 1 first, then 2 (beside 0) and 3 (beside 1)
    (6, 2, [[0, 1], [2, 3], [4, 5]]),  # three a rank: three waves
    (6, 3, [[0, 1, 2], [3, 4, 5]]),
    (2, 2, [[0, 1]]),  # one rank a bundle: one wave, nothing to wait for
    (1, 1, [[0]]),
    (3, 1, [[0], [1], [2]]),  # three ranks on one bundle: one at a time
])
def test_waves_by_hand(world_size, bundles, waves):
    assert start_waves(world_size, bundles) == waves


@pytest.mark.parametrize("world_size, bundles", [(1, 1), (2, 2), (4, 2), (6, 2), (6, 3), (8, 4), (9, 3), (5, 1)])
def test_every_rank_once_and_no_two_of_a_wave_on_one_bundle(world_size, bundles):
    waves = start_waves(world_size, bundles)
    assert [r for wave in waves for r in wave] == list(range(world_size))  # every rank once, in rank order
    assert len(waves) == world_size // bundles
    for wave in waves:
        assert sorted(r % bundles for r in wave) == list(range(bundles))  # each bundle once a wave
