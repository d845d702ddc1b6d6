"""Offload of FSDP2 models and optimizer state (reasonrl.workers.fsdp), on one gloo rank on CPU.

On a CPU worker the public functions move nothing (the tensors are already in CPU memory), so the tests check two
things: that the no-op leaves training bit-identical, and, with ``always_copy``, that the moves reach every tensor
(parameter shards, gradients, each optimizer state tensor incl. ``step``), break storage identity, keep values,
dtypes and DTensor placements, keep the Parameter objects the optimizer holds, and that training continues exactly
as without the move."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from reasonrl.workers.distributed import init_distributed
from reasonrl.workers.fsdp import (Offloader, iter_full_params, move_fsdp_model, move_optimizer, offload_fsdp_model,
                                   offload_optimizer, onload_fsdp_model, onload_optimizer, shard_model)

from helpers import cpu_worker_plan, critic_batch, free_port, make_critic_worker, make_tiny_causal_lm, make_tiny_policy


@pytest.fixture(scope="module")
def mesh():
    return init_distributed(0, 1, "127.0.0.1", free_port(), "cpu")


def tiny_model(mesh, seed: int = 0):
    """A 2-layer Llama, FSDP2-sharded (each layer and the root), with AdamW."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=True))
    shard_model(model, mesh, "cpu", torch.float32)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))


def train_step(model, optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(IDS, labels=IDS).loss.backward()
    optimizer.step()


def full_params(model):
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}


def assert_same_params(a, b):
    pa, pb = full_params(a), full_params(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def snapshot(model, optimizer):
    """Every tensor the moves must reach: (value, dtype, placements, storage pointer), keyed by where it lives."""
    model.reshard()  # a forward leaves the root's parameters unsharded; the snapshot wants the shards
    out = {}

    def add(key, t):
        out[key] = (local(t).detach().clone(), t.dtype, getattr(t, "placements", None), local(t).data_ptr())

    for name, p in model.named_parameters():
        add(("param", name), p)
        if p.grad is not None:
            add(("grad", name), p.grad)
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        for key, value in state.items():
            add(("optim", names[id(p)], key), value)
    return out


def test_offload_on_a_cpu_model_is_a_no_op_and_training_continues_identically(mesh):
    moved, opt_moved = tiny_model(mesh)
    ref, opt_ref = tiny_model(mesh)
    for model, opt in ((moved, opt_moved), (ref, opt_ref)):
        train_step(model, opt)
    before = snapshot(moved, opt_moved)
    seconds = [offload_fsdp_model(moved), offload_optimizer(opt_moved), onload_fsdp_model(moved, "cpu"),
               onload_optimizer(opt_moved, "cpu")]
    assert all(isinstance(s, float) and s >= 0 for s in seconds)
    after = snapshot(moved, opt_moved)
    assert {k: v[3] for k, v in after.items()} == {k: v[3] for k, v in before.items()}  # nothing was copied
    for model, opt in ((moved, opt_moved), (ref, opt_ref)):
        train_step(model, opt)
    assert_same_params(moved, ref)


def test_moves_reach_every_param_grad_and_optimizer_state_and_training_continues_identically(mesh):
    moved, opt_moved = tiny_model(mesh)
    ref, opt_ref = tiny_model(mesh)
    for model, opt in ((moved, opt_moved), (ref, opt_ref)):
        train_step(model, opt)
        model(IDS, labels=IDS).loss.backward()  # gradients present at the move (FSDP2 keeps them as DTensors)
        model.reshard()
        model.model.embed_tokens.weight.grad = None  # a parameter without a gradient moves too
    before = snapshot(moved, opt_moved)
    assert ("grad", "model.embed_tokens.weight") not in before and ("grad", "model.norm.weight") in before
    param_ids = [id(p) for p in moved.parameters()]
    with torch.no_grad():
        moved(IDS)  # leaves the FSDP root's parameters unsharded: the move must reshard first
    assert any(not isinstance(p, DTensor) for p in moved.parameters())
    assert {k[0] for k in before} == {"param", "grad", "optim"}
    assert {k[2] for k in before if k[0] == "optim"} == {"step", "exp_avg", "exp_avg_sq"}

    assert move_fsdp_model(moved, "cpu", always_copy=True) >= 0
    assert move_optimizer(opt_moved, "cpu", always_copy=True) >= 0

    assert all(isinstance(p, DTensor) for p in moved.parameters())  # resharded
    assert [id(p) for p in moved.parameters()] == param_ids  # the optimizer's references stay valid
    assert moved.model.embed_tokens.weight.grad is None
    after = snapshot(moved, opt_moved)
    assert after.keys() == before.keys()
    for key, (value, dtype, placements, ptr) in before.items():
        new_value, new_dtype, new_placements, new_ptr = after[key]
        assert new_ptr != ptr, f"{key} was not copied"
        assert torch.equal(new_value, value) and new_dtype == dtype and new_placements == placements, key
    # FSDP2's own reference to each shard follows the move (else its all-gather would read the old storage).
    for module in moved.modules():
        state = getattr(module, "_get_fsdp_state", None)
        for group in (state()._fsdp_param_groups if state else []):
            for fsdp_param in group.fsdp_params:
                assert fsdp_param._sharded_param_data.data_ptr() == fsdp_param.sharded_param.to_local().data_ptr()

    for model, opt in ((moved, opt_moved), (ref, opt_ref)):
        opt.step()  # with the gradients that were moved
        train_step(model, opt)
    assert_same_params(moved, ref)
    assert opt_moved.state[moved.model.norm.weight]["step"] == opt_ref.state[ref.model.norm.weight]["step"] == 3


def test_moving_optimizer_state_to_a_device_leaves_the_scalar_step_where_torch_keeps_it(mesh):
    model, opt = tiny_model(mesh)
    train_step(model, opt)
    # 'meta' stands in for an accelerator: no data, but the selection is the same.
    move_optimizer(opt, "meta")
    for state in opt.state.values():
        assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"
        assert state["step"].device.type == "cpu"  # not capturable, not fused: AdamW reads it on the host
    opt.param_groups[0]["capturable"] = True  # capturable (and fused) optimizers keep 'step' on the device
    move_optimizer(opt, "meta")
    assert all(state["step"].device.type == "meta" for state in opt.state.values())


def test_optimizer_without_state_moves_nothing(mesh):
    model, opt = tiny_model(mesh)
    assert not opt.state
    assert move_optimizer(opt, "cpu", always_copy=True) >= 0 and not opt.state


def test_iter_full_params_gathers_every_parameter_in_the_sync_dtype(mesh):
    model, opt = tiny_model(mesh)
    train_step(model, opt)
    expected = full_params(model)
    got = dict(iter_full_params(model, "cpu", torch.bfloat16))
    assert got.keys() == expected.keys()
    for name, t in got.items():
        assert not isinstance(t, DTensor) and t.dtype == torch.bfloat16
        assert torch.equal(t, expected[name].to(torch.bfloat16)), name


def test_offloader_moves_inside_on_device_and_reports_seconds(mesh):
    model, opt = tiny_model(mesh)
    off = Offloader("actor", model, "cpu", params=True, optimizer=opt, optimizer_state=True)
    off.offload()
    assert not off.params_home and not off.optim_home
    with off.on_device():
        assert off.params_home and not off.optim_home  # the forward phases need no optimizer state
    with off.on_device(optimizer=True):
        train_step(model, opt)
        assert off.params_home and off.optim_home
    assert not off.params_home and not off.optim_home
    metrics = off.pop_metrics()
    assert set(metrics) == {"timing_s/offload_actor", "timing_s/onload_actor"}
    assert all(v >= 0 for v in metrics.values())
    assert off.pop_metrics() == {}  # reset by the pop

    still = Offloader("ref", model, "cpu", params=False)
    with still.on_device(optimizer=True):
        pass
    still.offload()
    assert not still.enabled and still.pop_metrics() == {}


def test_critic_worker_with_offload_trains_identically_and_reports_timing(tmp_path):
    path = make_tiny_causal_lm(tmp_path / "lm", seed=7)
    batch = critic_batch()
    values = []
    for flags in ((), ("critic.offload_params=true", "critic.offload_optimizer=true")):
        worker = make_critic_worker(path, *flags)
        for _ in range(2):
            worker.update_critic(batch.union(worker.compute_values(batch)))
        values.append(worker.compute_values(batch)["values"])
        timing = worker.pop_offload_timing()
        assert set(timing) == ({"timing_s/offload_critic", "timing_s/onload_critic"} if flags else set())
    assert torch.equal(values[0], values[1])


def test_actor_worker_with_offload_trains_syncs_and_checkpoints_identically(tmp_path, model_path):
    """ActorRolloutRefWorker in-process (hf engine, a tiny random policy): old/ref log-probs, an update and the weight
    sync give the same numbers with every offload flag on; the timing keys come back; a checkpoint round-trips."""
    from reasonrl.config import load_config, to_dict
    from reasonrl.data.collate import collate_rollout
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    policy = make_tiny_policy(tmp_path / "tiny", model_path)
    batch = collate_rollout([[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]], [[6, 7], [8, 9], [10, 11], [12, 13]],
                            [[0.0, 0.0]] * 4, pad_id=0)
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * batch["response_mask"]
    flags = ("actor.offload_params=true", "actor.offload_optimizer=true", "ref.offload_params=true")
    results = []
    for extra in ((), flags):
        cfg, _ = load_config(["rollout.engine=hf", "trainer.device=cpu", "actor.lr=1e-2", "data.train_batch_size=2",
                              "rollout.n=2", "actor.micro_batch_size_per_worker=2", *extra], cuda_available=False)
        worker = ActorRolloutRefWorker(to_dict(cfg), policy, rank=0, world_size=1, master_addr="127.0.0.1",
                                       master_port=free_port(), num_threads=1,
        plan=cpu_worker_plan(cfg))
        b = batch.union(worker.compute_log_probs(batch)).union(worker.compute_ref_log_probs(batch))
        metrics = worker.update_actor(b)
        assert worker.sync_weights()["bytes"] > 0
        after = worker.compute_log_probs(batch)["old_log_probs"]
        timing = worker.pop_offload_timing()
        expected = {f"timing_s/{d}_{m}" for d in ("offload", "onload") for m in ("actor", "ref")} if extra else set()
        assert set(timing) == expected
        if extra:
            worker.save_checkpoint(str(tmp_path / "ckpt"))
            worker.update_actor(b)
            worker.load_checkpoint(str(tmp_path / "ckpt"))
            torch.testing.assert_close(worker.compute_log_probs(batch)["old_log_probs"], after)
            assert not worker.policy.offload.params_home and not worker.policy.offload.optim_home
        results.append((b["old_log_probs"], b["ref_log_probs"], metrics["actor/grad_norm"], after))
    for x, y in zip(*results):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))
    assert not torch.equal(results[0][0], results[0][3])  # the update moved the policy


def test_trainer_logs_the_slowest_rank_and_only_with_offload_on():
    from reasonrl.config import load_config
    from reasonrl.config.plan import offload_enabled
    from reasonrl.trainer.metrics import slowest_rank

    assert slowest_rank([{"timing_s/onload_actor": 0.5, "timing_s/offload_actor": 0.1},
                         {"timing_s/onload_actor": 0.2, "timing_s/offload_actor": 0.3}, {}]) == \
        {"timing_s/onload_actor": 0.5, "timing_s/offload_actor": 0.3}
    assert not offload_enabled(load_config([])[0])
    for key in ("actor.offload_params", "actor.offload_optimizer", "ref.offload_params", "critic.offload_params",
                "critic.offload_optimizer"):
        assert offload_enabled(load_config([f"{key}=true"])[0]), key


# ------------------------------------------------------------------ the exactly sized host arena

def test_host_arena_hands_out_aligned_disjoint_views_and_reuses_them():
    from reasonrl.workers.host_memory import ALIGN, HostArena, storage_bytes

    assert storage_bytes((2, 3), (1, 2), torch.float32) == 24  # elements 0..1 + 2 x 2 = 6, 4 bytes each
    assert storage_bytes((0, 5), (5, 1), torch.float32) == 0
    arena = HostArena("test")
    assert arena.take((4,), (1,), torch.float32) is None and arena.misses == 1  # nothing reserved yet
    arena.begin(3 * ALIGN)
    a = arena.take((100,), (1,), torch.float32)  # 400 bytes: one aligned slot
    b = arena.take((2, 3), (1, 2), torch.bfloat16)  # a strided view
    c = arena.take((128,), (1,), torch.float32)  # 512 bytes: exactly one slot
    assert arena.used == 3 * ALIGN and arena.capacity == 3 * ALIGN and not arena.pinned  # no CUDA here
    assert arena.take((1,), (1,), torch.float32) is None and arena.misses == 2  # full
    assert b.dtype == torch.bfloat16 and b.shape == (2, 3) and b.stride() == (1, 2)
    starts = [t.data_ptr() for t in (a, b, c)]
    assert [s - starts[0] for s in starts] == [0, ALIGN, 2 * ALIGN]
    a.fill_(1.0), b.fill_(2.0), c.fill_(3.0)  # disjoint: each keeps its own values
    assert torch.all(a == 1.0) and torch.all(b == 2.0) and torch.all(c == 3.0)
    arena.begin(2 * ALIGN)  # a smaller need reuses the same memory from its start
    assert arena.take((8,), (1,), torch.float32).data_ptr() == starts[0] and arena.capacity == 3 * ALIGN
    arena.begin(4 * ALIGN)  # a larger one replaces the buffer; the old views keep their memory
    assert arena.capacity == 4 * ALIGN and torch.all(c == 3.0)


def test_offload_into_an_arena_reaches_every_tensor_exactly_sized_and_training_continues_identically(mesh):
    from reasonrl.workers.host_memory import HostArena

    moved, opt_moved = tiny_model(mesh)
    ref, opt_ref = tiny_model(mesh)
    for model, opt in ((moved, opt_moved), (ref, opt_ref)):
        train_step(model, opt)
        model(IDS, labels=IDS).loss.backward()  # gradients present at the move
    params, optim = HostArena("params"), HostArena("optim")
    move_fsdp_model(moved, "cpu", always_copy=True, arena=params)
    move_optimizer(opt_moved, "cpu", always_copy=True, arena=optim)
    # By hand, float32, each tensor rounded up to 512 bytes: the tied 64 x 32 embedding 8192; per layer q and o
    # (32 x 32) 4096 each, k and v (16 x 32) 2048 each, gate/up/down (64 x 32) 8192 each, two norms 512 each = 37888;
    # the final norm 512. Parameters 8192 + 2 x 37888 + 512 = 84480, their gradients as many, and the two rotary
    # buffers (4 floats each) 512 each. The tied weight is reached twice (embedding and head) but copied once.
    assert params.capacity == params.used == 2 * 84480 + 2 * 512 and params.misses == 0
    # AdamW: exp_avg and exp_avg_sq as large as the parameters, and a 0-dim step for each of the 20 parameters.
    assert optim.capacity == optim.used == 2 * 84480 + 20 * 512 and optim.misses == 0
    for arena, tensors in ((params, [*moved.parameters(), *(p.grad for p in moved.parameters()), *moved.buffers()]),
                           (optim, [v for s in opt_moved.state.values() for v in s.values()])):
        base = arena._buffer.data_ptr()
        for t in tensors:
            assert base <= local(t).data_ptr() < base + arena.capacity
    for model, opt in ((moved, opt_moved), (ref, opt_ref)):
        opt.step()
        train_step(model, opt)
    assert_same_params(moved, ref)


def test_fused_adamw_steps_fsdp2_shards_as_the_for_loop_does_and_its_state_moves(mesh):
    """``actor.adamw_impl=fused`` (auto's choice on a GPU) through FSDP2's DTensors, on the CPU's fused kernel: three
    steps land where the for-loop's do (same arithmetic, other rounding: within 1e-6), and its state, whose ``step``
    lives beside the parameters (fused), survives a move out and back that copies every tensor."""
    from reasonrl.config import load_config
    from reasonrl.workers.optim import build_adamw

    def run(impl: str, move: bool):
        cfg, _ = load_config([f"actor.adamw_impl={impl}", "actor.weight_decay=0.1"])
        model, _ = tiny_model(mesh)
        optimizer = build_adamw(model.parameters(), cfg, 1e-2, "cpu")
        for _ in range(3):
            train_step(model, optimizer)
            if move:
                move_optimizer(optimizer, "cpu", always_copy=True)
        return model, optimizer

    fused, fused_opt = run("fused", move=True)
    loop, loop_opt = run("for_loop", move=False)
    assert fused_opt.defaults["fused"] and not loop_opt.defaults["fused"] and not loop_opt.defaults["foreach"]
    steps = [s["step"] for s in fused_opt.state.values()]
    assert steps and all(float(s) == 3.0 for s in steps)
    pf, pl, start = full_params(fused), full_params(loop), full_params(tiny_model(mesh)[0])
    moved = [n for n in pf if not torch.equal(pf[n], start[n])]
    assert len(moved) == len(pf)  # every parameter trained
    for name in pf:
        torch.testing.assert_close(pf[name], pl[name], rtol=0, atol=1e-6)
