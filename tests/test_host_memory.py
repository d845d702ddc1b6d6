"""What the run keeps in host memory, and what it no longer needs to: the bf16 reference (``ref.param_dtype``), the
engine's sleep level (``rollout.sleep_level``) and the memory plan's host phase (``reasonrl.memory.plan``). The
exactly sized offload arena is tested with the offload moves (``tests/test_offload.py``)."""
from __future__ import annotations

import pytest
import torch
from helpers import free_port, make_tiny_causal_lm

from reasonrl.config import ConfigError, load_config
from reasonrl.config.worker_plan import engine_sleep_level


def test_a_bf16_reference_computes_exactly_what_fp32_shards_cast_to_bf16_compute_in_half_the_bytes(tmp_path):
    from reasonrl.workers.distributed import init_distributed
    from reasonrl.workers.policy import load_sharded_lm, reference_param_dtype

    auto, _ = load_config(["model.dtype=bfloat16"], cuda_available=False)
    fp32, _ = load_config(["model.dtype=bfloat16", "ref.param_dtype=float32"], cuda_available=False)
    assert reference_param_dtype(auto, torch.bfloat16) == torch.bfloat16
    assert reference_param_dtype(fp32, torch.bfloat16) == torch.float32
    assert reference_param_dtype(auto, torch.float32) == torch.float32  # fp32 compute (the CPU default): unchanged
    mesh = init_distributed(0, 1, "127.0.0.1", free_port(), "cpu")
    path = make_tiny_causal_lm(tmp_path / "lm", seed=3)  # a float32 checkpoint: the bf16 load rounds it
    models = {name: load_sharded_lm(cfg, path, mesh, "cpu", torch.bfloat16, False,
                                    param_dtype=reference_param_dtype(cfg, torch.bfloat16))
              for name, cfg in (("bf16", auto), ("fp32", fp32))}
    nbytes = {name: sum(p.to_local().numel() * p.element_size() for p in m.parameters())
              for name, m in models.items()}
    assert {p.dtype for p in models["bf16"].parameters()} == {torch.bfloat16}
    assert nbytes["bf16"] * 2 == nbytes["fp32"]
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = {name: m(input_ids=ids).logits for name, m in models.items()}
    assert torch.equal(logits["bf16"], logits["fp32"])  # the same rounding, once at load or at every gather


def test_sleep_level_auto_discards_the_weights_only_when_every_sync_refills_them():
    def level(*args):
        return engine_sleep_level(load_config(list(args), cuda_available=False)[0])

    assert level() == 2  # full fine-tuning: each sync sends every weight
    assert level("actor.lora.rank=8") == 1  # adapter-only: the base is never sent again
    assert level("actor.lora.rank=8", "actor.lora.merge_for_rollout=true") == 2  # merged: every weight
    assert level("rollout.sleep_level=1") == 1
    with pytest.raises(ConfigError, match="rollout.sleep_level.*adapter-only"):
        load_config(["actor.lora.rank=8", "rollout.sleep_level=2"], cuda_available=False)
    with pytest.raises(ConfigError, match="config key 'rollout.sleep_level'"):
        load_config(["rollout.sleep_level=3"], cuda_available=False)
    with pytest.raises(ConfigError, match="config key 'ref.param_dtype'"):
        load_config(["ref.param_dtype=bfloat16"], cuda_available=False)
