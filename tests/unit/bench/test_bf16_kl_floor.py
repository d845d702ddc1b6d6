"""benchmarks/bf16_kl_floor.py's pieces, worked by hand: the mean KL over positions and the perturbation of one
small step (no model; the measurement itself is the script's run, results/bf16_kl_floor.json)."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import benchmark_module


@pytest.fixture(scope="module")
def floor():
    return benchmark_module("bf16_kl_floor")


def test_mean_kl_is_the_token_mean_over_sequences(floor):
    # sequence 1: two positions over 2 outcomes; sequence 2: one position
    p = [torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]])), torch.log(torch.tensor([[0.2, 0.8]]))]
    q = [torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]])), torch.log(torch.tensor([[0.2, 0.8]]))]
    # KL over the positions: 0; 0.9 ln(0.9/0.5) + 0.1 ln(0.1/0.5) = 0.529 - 0.161 = 0.368; 0; mean over 3
    expected = (0.9 * math.log(1.8) + 0.1 * math.log(0.2)) / 3
    assert floor.mean_kl(p, q) == pytest.approx(expected, rel=1e-6)
    assert floor.mean_kl(q, q) == 0.0


def test_a_step_moves_every_weight_by_its_size_or_only_the_fraction_drawn(floor):
    model = torch.nn.Linear(64, 64)
    everywhere = floor.perturbed(model, 1e-3, 1.0, seed=0)
    for a, b in zip(everywhere.parameters(), model.parameters()):
        assert torch.allclose((a - b).abs(), torch.full_like(a, 1e-3), atol=1e-9)  # each weight, either sign
        assert ((a - b) > 0).any() and ((a - b) < 0).any()
    some = floor.perturbed(model, 1e-3, 0.25, seed=0)
    moved = sum(int(((a - b) != 0).sum()) for a, b in zip(some.parameters(), model.parameters()))
    assert 0.15 * (64 * 64 + 64) < moved < 0.35 * (64 * 64 + 64)
    assert torch.equal(floor.perturbed(model, 1e-3, 0.25, seed=0).weight, some.weight)  # seeded


def test_bf16_casts_count_the_changed_weights(floor):
    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0, 0.5, 0.25]]))
    other = floor.perturbed(model, 0.0, 1.0, seed=0)
    with torch.no_grad():
        other.weight[0, 0] += 2 ** -7  # bf16's spacing at 1.0 is 2**-7: the cast changes
        other.weight[0, 1] += 2 ** -12  # far below it: the cast rounds back to 1.0
    assert floor.changed_bf16_weights(other, model) == (1, 4)
