"""ValueModel: a causal LM's backbone + a scalar head. Tiny random Llama checkpoints (built here, no download) for
exact properties; the real SmolLM2-135M-Instruct for shapes (slow)."""
from __future__ import annotations

import torch
import pytest

from reasonrl.models.value_head import (HEAD_FILE, MARKER_FILE, ValueModel, load_value_state_dict,
                                        response_values)

from helpers import make_tiny_causal_lm


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> str:
    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny_lm"))


def inputs(rows: int = 3, length: int = 10, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    pos = torch.arange(length)[None].expand(rows, -1)
    return ids, mask, pos


def test_backbone_comes_from_the_causal_lm_and_head_starts_at_zero(tiny_lm):
    from transformers import AutoModelForCausalLM

    vm = ValueModel.from_pretrained(tiny_lm)
    lm = AutoModelForCausalLM.from_pretrained(tiny_lm)
    # The backbone's weights are the causal LM's "model.*" weights, and there is no LM head.
    lm_sd = lm.state_dict()
    for k, v in vm.state_dict().items():
        if k.startswith("model."):
            assert torch.equal(v, lm_sd[k]), k
    assert set(k for k in vm.state_dict() if not k.startswith("model.")) == {"value_head.weight", "value_head.bias"}
    ids, mask, pos = inputs()
    # Zero weight and bias: V = 0 . h + 0 = 0 at every position.
    values = vm(ids, mask, pos)
    assert values.shape == (3, 10) and values.dtype == torch.float32
    assert torch.count_nonzero(values) == 0


def test_response_values_are_the_positions_before_each_response_token(tiny_lm):
    vm = ValueModel.from_pretrained(tiny_lm)
    torch.manual_seed(3)
    torch.nn.init.normal_(vm.value_head.weight)
    ids, mask, pos = inputs(rows=2, length=10)
    full = vm(ids, mask, pos)
    T = 4  # prompt is columns 0..5, response columns 6..9; token 6 is scored from the prefix ending at column 5
    got = response_values(vm, ids, mask, pos, T)
    assert got.shape == (2, 4)
    torch.testing.assert_close(got, full[:, 5:9])
    # Causality: the last response token is never part of a prefix that a response value sees.
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64
    torch.testing.assert_close(response_values(vm, changed, mask, pos, T), got)
    # ... while the first response token is seen by values 1..3 (and not by value 0).
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 64
    other = response_values(vm, changed, mask, pos, T)
    torch.testing.assert_close(other[:, 0], got[:, 0])
    assert not torch.allclose(other[:, 1:], got[:, 1:])


def test_save_and_load_round_trip(tiny_lm, tmp_path):
    from transformers import AutoModel

    vm = ValueModel.from_pretrained(tiny_lm)
    torch.manual_seed(4)
    torch.nn.init.normal_(vm.value_head.weight)
    torch.nn.init.constant_(vm.value_head.bias, 0.25)
    with torch.no_grad():
        vm.model.norm.weight.mul_(1.5)  # a backbone change must survive too
    vm.save_pretrained(str(tmp_path / "vm"))
    assert (tmp_path / "vm" / HEAD_FILE).exists() and (tmp_path / "vm" / MARKER_FILE).exists()
    loaded = ValueModel.from_pretrained(str(tmp_path / "vm"))
    ids, mask, pos = inputs()
    torch.testing.assert_close(loaded(ids, mask, pos), vm(ids, mask, pos))
    # The backbone folder is a plain Hugging Face model directory.
    backbone = AutoModel.from_pretrained(str(tmp_path / "vm"))
    torch.testing.assert_close(backbone.norm.weight, vm.model.norm.weight)
    sd = load_value_state_dict(str(tmp_path / "vm"))
    assert set(sd) == set(vm.state_dict())
    assert float(sd["value_head.bias"]) == 0.25


def test_save_rejects_foreign_keys_and_load_rejects_plain_lm(tiny_lm, tmp_path):
    vm = ValueModel.from_pretrained(tiny_lm)
    with pytest.raises(ValueError, match="unexpected"):
        vm.save_pretrained(str(tmp_path / "bad"), state_dict={"lm_head.weight": torch.zeros(1)})
    with pytest.raises(FileNotFoundError, match="not a saved value model"):
        load_value_state_dict(tiny_lm)


@pytest.mark.slow
def test_real_smollm2_value_model(model_path):
    vm = ValueModel.from_pretrained(model_path)
    assert vm.value_head.in_features == 576  # SmolLM2-135M hidden size
    ids, mask, pos = inputs(rows=2, length=12)
    values = response_values(vm, ids, mask, pos, 5)
    assert values.shape == (2, 5)
    assert torch.count_nonzero(values) == 0  # zero head
    vm.value_head.bias.data.fill_(0.5)
    assert torch.allclose(response_values(vm, ids, mask, pos, 5), torch.full((2, 5), 0.5))
