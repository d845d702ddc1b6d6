"""``*.max_tokens_per_micro_batch=auto`` (reasonrl/memory/auto.py): the budget is the hand-derived edge of fitting,
each budget governs its own phases, the config accepts ``auto`` and nothing else that is not a number, the start-up
table and ``doctor --plan`` show the choice; async mode's rollout-worker and weight-send terms by hand; bad input.
All in-process arithmetic on tiny shapes (no model loads, no subprocess)."""
from __future__ import annotations

import pytest
from helpers import gpu_plan

from reasonrl.config import ConfigError, from_dict, load_config, to_dict
from reasonrl.config.batch_plan import BatchPlan
from reasonrl.memory import (AUTO_DEVICE_SHARE, GIB, AutoBudgetError, device_memory_bytes, plan_memory,
                             plan_rollout_worker, resolve_auto_budgets, resolve_run_budgets)
from reasonrl.memory.auto import host_memory_bytes, with_budgets

# The tiny Llama of tests/unit/memory/test_memory_plan.py: h=8, i=16, L=2, 2 heads of 4, 1 KV head (kv 4), V=32, tied; P = 1448,
# one layer 592 parameters, the root (embedding + final norm) 264.
TINY = dict(model_type="llama", hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=32, tie_word_embeddings=True)
P = 1448
QWEN_1P5B = dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
# bf16, hf engine, no reference, 4 prompts x 2 samples of 8 + 8 tokens: rows of 16 tokens, 8 rows on one worker.
SMALL = ("model.dtype=bfloat16", "rollout.engine=hf", "algorithm.use_kl_loss=false", "algorithm.entropy_coef=0",
         "data.max_prompt_length=8", "rollout.max_new_tokens=8", "eval.max_new_tokens=8", "data.train_batch_size=4",
         "rollout.n=2")
ACTOR = "actor.max_tokens_per_micro_batch"
REF = "ref.max_tokens_per_micro_batch"
CRITIC = "critic.max_tokens_per_micro_batch"


def config(*overrides: str, cuda: bool = True):
    cfg, _ = load_config(["trainer.profile=none", f"trainer.device={'cuda' if cuda else 'cpu'}", "rollout.engine=vllm",
                          *overrides], cuda_available=cuda)
    return cfg


def update_total(cfg, tokens: int, device: float, placement) -> float:
    plan = plan_memory(with_budgets(cfg, {ACTOR: tokens}), TINY, device, placement)
    return plan.phase("update").total


# ------------------------------------------------------------------ the budget auto picks


def test_auto_budget_is_the_hand_derived_edge_of_fitting():
    cfg = config(*SMALL, f"{ACTOR}=auto", cuda=False)
    cpu = gpu_plan(cfg, device="cpu")  # host memory: no CUDA context in the totals
    # The update at a budget of N tokens (16 <= N <= 128; one step per batch, so no old pass and the update's head
    # computes entropy), bytes: actor weights 4P = 5792, AdamW 8P = 11584, the hf engine's bf16 copy 2P = 2896
    # (it never sleeps), gradients 4P = 5792, the unsharded root 264 x 2 = 528, FSDP layers in flight
    # 2 x 592 x (2 + 4) = 7104: 33696 constant; activations N x 2 layers x 316 = 632 N; the head's forward with
    # entropy, 3 chunks of r = N/2 response tokens x V 32 x 4 bytes = 384 r, above its backward
    # max(192 r + 1024, 64 r + 2560) from r = 8. So update(100) = 33696 + 63200 + 19200 = 116096 and
    # update(101) = 33696 + 63832 + 384 x 50 = 116728. A device of 129334 bytes lets auto use 0.9 x 129334 =
    # 116400.6: 100 fits, 101 does not.
    device = 129334
    assert AUTO_DEVICE_SHARE == 0.9
    assert update_total(cfg := with_budgets(cfg, {ACTOR: 100}), 100, device, cpu) == 116096
    assert update_total(cfg, 101, device, cpu) == 116728
    auto = config(*SMALL, f"{ACTOR}=auto", cuda=False)
    assert resolve_auto_budgets(auto, TINY, device, cpu) == {ACTOR: 100}
    assert auto.actor.max_tokens_per_micro_batch == "auto"  # pure: the config is not changed
    # The whole worker's 8 rows x 16 tokens = 128 fit on a large device: auto stops there (update(128) = 139168).
    assert resolve_auto_budgets(auto, TINY, 139168 / 0.9 + 1, cpu) == {ACTOR: 128}
    # One longest row (16 tokens: update(16) = 33696 + 824 x 16 = 46880) is the least auto gives; below it, an
    # error naming the key and the phase.
    assert resolve_auto_budgets(auto, TINY, 46880 / 0.9 + 1, cpu) == {ACTOR: 16}
    with pytest.raises(AutoBudgetError, match=r"'actor.max_tokens_per_micro_batch': auto: not even one row of 16 "
                                              r"tokens fits: the update phase needs"):
        resolve_auto_budgets(auto, TINY, 46880 / 0.9 - 1, cpu)


def test_each_auto_budget_is_judged_by_its_own_phases():
    """On the 1.5B shape (80 GiB, vLLM at half the device, 64 x 8 rows of 1280 tokens): each chosen budget fits its
    phases in 90% of the device and one token more does not; the reference follows the actor's budget when its own is
    0, so then it limits the actor's too."""
    base = ("model.dtype=bfloat16", "data.train_batch_size=64", "rollout.n=8", "data.max_prompt_length=256",
            "rollout.max_new_tokens=1024", "algorithm.use_kl_loss=true")
    device, limit = 80 * GIB, 0.9 * 80 * GIB
    cfg = config(*base, f"{ACTOR}=auto", f"{REF}=auto")
    chosen = resolve_auto_budgets(cfg, QWEN_1P5B, device)
    assert 1280 < chosen[ACTOR] < chosen[REF] < 64 * 8 * 1280  # a no-grad pass holds far less per token

    def total(budgets, phase):
        return plan_memory(with_budgets(cfg, budgets), QWEN_1P5B, device).phase(phase).total

    settled = dict(chosen)
    assert total(settled, "update") <= limit < total({**settled, ACTOR: chosen[ACTOR] + 1}, "update")
    assert total(settled, "reference") <= limit < total({**settled, REF: chosen[REF] + 1}, "reference")
    # The reference's own budget moves only the reference phase.
    assert total({**settled, REF: chosen[REF] + 1}, "update") == total(settled, "update")
    # PPO: the critic's budget governs its values and critic update (a critic process shares each GPU; 140 GiB).
    ppo = config(*base, "algorithm.adv_estimator=gae", f"{CRITIC}=auto", f"{ACTOR}=2048")
    big = 140 * GIB
    critic = resolve_auto_budgets(ppo, QWEN_1P5B, big)[CRITIC]
    fitted = plan_memory(with_budgets(ppo, {CRITIC: critic}), QWEN_1P5B, big)
    over = plan_memory(with_budgets(ppo, {CRITIC: critic + 1}), QWEN_1P5B, big)
    assert max(fitted.phase("values").total, fitted.phase("critic_update").total) <= 0.9 * big
    assert max(over.phase("values").total, over.phase("critic_update").total) > 0.9 * big
    # A budget whose phases this config never runs (no KL term: no reference pass) resolves to 0, unused.
    assert resolve_auto_budgets(config(*SMALL, f"{REF}=auto"), TINY, 80 * GIB) == {REF: 0}


def test_the_actors_auto_budget_covers_the_passes_that_follow_it():
    """ref and critic budgets of 0 take the actor's: then the actor's auto budget must fit their phases too."""
    base = ("model.dtype=bfloat16", "data.train_batch_size=64", "rollout.n=8", "data.max_prompt_length=256",
            "rollout.max_new_tokens=1024", "algorithm.use_kl_loss=true", "model.gradient_checkpointing=true")
    device = 80 * GIB  # checkpointed updates hold little per token; vLLM, awake in the reference pass, holds 40 GiB
    follows = config(*base, f"{ACTOR}=auto")
    own = config(*base, f"{ACTOR}=auto", f"{REF}=1280")
    limited = resolve_auto_budgets(follows, QWEN_1P5B, device)[ACTOR]
    alone = resolve_auto_budgets(own, QWEN_1P5B, device)[ACTOR]
    assert limited < alone
    plan = plan_memory(with_budgets(follows, {ACTOR: limited + 1}), QWEN_1P5B, device)
    assert plan.phase("reference").total > 0.9 * device >= plan.phase("update").total


def test_an_unresolved_auto_budget_is_refused_by_the_plan():
    with pytest.raises(ValueError, match="ref.max_tokens_per_micro_batch=auto: resolve it first"):
        plan_memory(config(f"{REF}=auto"), TINY, 80 * GIB)


# ------------------------------------------------------------------ the config value


@pytest.mark.parametrize("value", ["-1", "Auto", "max", "'1024'"])
def test_a_budget_that_is_neither_tokens_nor_auto_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"config key 'critic.max_tokens_per_micro_batch': must be a number of "
                                          r"tokens >= 0 or auto"):
        config(f"{CRITIC}={value}")


def test_auto_and_numbers_are_accepted_and_survive_the_round_trip():
    cfg = config(f"{ACTOR}=auto", f"{REF}=512")
    assert (cfg.actor.max_tokens_per_micro_batch, cfg.ref.max_tokens_per_micro_batch) == ("auto", 512)
    back = from_dict(to_dict(cfg))  # what a worker rebuilds from
    assert (back.actor.max_tokens_per_micro_batch, back.ref.max_tokens_per_micro_batch) == ("auto", 512)
    with pytest.raises(ConfigError, match="actor.max_tokens_per_micro_batch"):
        config(f"{ACTOR}=1.5")


def test_the_batch_table_shows_the_budgets():
    cfg = config("data.train_batch_size=8", "rollout.n=4", "data.max_prompt_length=200", "rollout.max_new_tokens=300",
                 f"{ACTOR}=2000", f"{REF}=auto")
    table = dict(BatchPlan.from_config(cfg, 2).table())
    # 8 x 4 = 32 responses per mini-batch, 16 per worker; every group holds 2000 // 500 = 4 rows at least, so at
    # most 16 / 4 = 4 micro-batches.
    assert table["micro-batches per mini-batch per worker"] == "at most 4 (token budget)"
    assert table[f"tokens per micro-batch ({ACTOR})"] == 2000
    assert table[f"tokens per micro-batch ({REF})"] == "auto (the memory plan picks it at start-up)"
    assert f"tokens per micro-batch ({CRITIC})" not in table  # 0: not set, not shown
    auto = dict(BatchPlan.from_config(config(f"{ACTOR}=auto"), 1).table())
    assert auto["micro-batches per mini-batch per worker"] == "by token budget (auto)"


# ------------------------------------------------------------------ where a run resolves it


def test_the_plan_resolves_auto_before_the_workers_see_it_and_the_config_is_not_written():
    from reasonrl.config.model_facts import ModelFacts
    from reasonrl.memory import describe_budgets
    from reasonrl.trainer.model_checks import check_memory_plan

    args = ["data.train_batch_size=64", "rollout.n=8", "rollout.max_new_tokens=1024", f"{ACTOR}=auto"]
    cfg, _ = load_config(args, cuda_available=True)
    plan = gpu_plan(cfg)
    expected = resolve_auto_budgets(cfg, QWEN_1P5B, 80 * GIB)[ACTOR]
    budgets = resolve_auto_budgets(cfg, QWEN_1P5B, 80 * GIB, plan)
    assert describe_budgets(budgets, 80 * GIB) == (f"auto token budgets: {ACTOR}={expected} (the largest whose phases "
                                                   "fit 90% of 80.0 GiB)")
    plan = plan.with_model(ModelFacts.from_config_json("qwen", QWEN_1P5B), budgets)
    assert dict(plan.batch.token_budgets)[ACTOR] == expected and not plan.batch.auto_budget_keys
    run = plan.run_config(cfg)
    assert to_dict(run)["actor"]["max_tokens_per_micro_batch"] == expected  # what the workers are handed
    assert cfg.actor.max_tokens_per_micro_batch == "auto"  # the loaded config is never written
    printed = []
    check_memory_plan(run, plan, QWEN_1P5B, 80 * GIB, echo=printed.append)  # fits once auto has chosen
    assert "memory plan per GPU" in printed[0]


def test_a_cpu_run_plans_auto_against_the_hosts_ram_shared_by_its_ranks():
    from reasonrl.config.model_facts import ModelFacts

    cfg = config(*SMALL, f"{ACTOR}=auto", "trainer.num_workers=2", cuda=False)
    ram = host_memory_bytes()
    assert device_memory_bytes("cpu", 2) == ram / 2
    plan = gpu_plan(cfg, 2, device="cpu")
    expected = resolve_auto_budgets(cfg, TINY, ram / 2, plan)
    printed = []
    assert resolve_run_budgets(cfg, TINY, plan, echo=printed.append) == expected
    assert printed[0].startswith("auto token budgets")
    run = plan.with_model(ModelFacts.from_config_json("tiny", TINY), expected).run_config(cfg)
    assert run.actor.max_tokens_per_micro_batch == expected[ACTOR] and cfg.actor.max_tokens_per_micro_batch == "auto"
    assert resolve_run_budgets(run, TINY, plan, echo=printed.append) == {}  # nothing left to resolve
    with pytest.raises(ValueError, match="ranks_sharing must be a positive integer"):
        device_memory_bytes("cpu", 0)
    with pytest.raises(ValueError, match="device must be cuda or cpu, got 'tpu'"):
        device_memory_bytes("tpu")


def test_doctor_plan_prints_the_budget_auto_chose(tmp_path, capsys):
    import json

    from reasonrl.doctor.plan import plan_main

    model = tmp_path / "qwen-1.5b-shape"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN_1P5B))
    args = [f"model.path={model}", "data.train_batch_size=64", "rollout.n=8", "rollout.max_new_tokens=1024",
            f"{ACTOR}=auto"]
    cfg, _ = load_config(args, cuda_available=True)
    expected = resolve_auto_budgets(cfg, QWEN_1P5B, 80 * GIB)[ACTOR]
    assert plan_main(args, 80.0, 1) == 0
    out = capsys.readouterr().out
    assert f"auto token budgets: {ACTOR}={expected} " in out and out.rstrip().endswith("fits")
    assert plan_main(args, 4.0, 1) == 1  # the resident terms alone exceed 4 GiB: not one row fits
    assert "does not fit: config key 'actor.max_tokens_per_micro_batch': auto: not even one row" in \
        capsys.readouterr().out


# ------------------------------------------------------------------ async mode


def test_async_mode_plans_the_rollout_workers_engine_and_the_actors_weight_send():
    base = ("model.dtype=bfloat16", "trainer.mode=async", "async_rollout.num_rollout_workers=2",
            "rollout.weight_sync_bucket_mb=1", "algorithm.use_kl_loss=false", "data.max_prompt_length=8",
            "rollout.max_new_tokens=8", "eval.max_new_tokens=8", "data.train_batch_size=4", "rollout.n=2")
    device = 4 * GIB
    two_actors = gpu_plan(config(*base), 2)  # two actor GPUs (the two rollout workers divide them); a worker's rows
    worker = plan_rollout_worker(config(*base), TINY, device, two_actors)  # are its share of the step's responses
    assert [p.name for p in worker.phases] == ["rollout", "weight_receive"]
    # vLLM takes gpu_memory_utilization 0.5 x 4 GiB: its bf16 weights 2P = 2896 bytes, the rest KV cache; the
    # receive buffer is one bucket of 1 MiB (the largest parameter, the embedding 32 x 8 x 2 = 512 bytes, is smaller).
    assert worker.phase("rollout").terms == {"engine weights": 2896, "engine KV cache + workspace": 2 * GIB - 2896}
    receive = worker.phase("weight_receive")
    assert receive.terms["weight receive buffer (one packed bucket)"] == 2**20
    assert receive.total == 2 * GIB + 2**20 + GIB  # + one CUDA context
    # hf engine: its bf16 copy, and generating the KV cache of its share, 4 x 2 / 2 workers = 4 rows of 16 tokens x
    # 2 (k, v) x 2 layers x kv 4 x 2 bytes = 32 bytes a token: 4 x 16 x 32 = 2048.
    hf_cfg = config(*base, "rollout.engine=hf")
    hf = plan_rollout_worker(hf_cfg, TINY, device, gpu_plan(hf_cfg, 2)).phase("rollout").terms
    assert hf == {"engine weights (hf copy)": 2896, "engine KV cache (hf generate)": 2048}
    # The actor's devices hold no engine; rank 0's broadcast holds the resident terms (4P + 8P), a 1 MiB bucket, its
    # packed copy and the next full parameter (512 bytes).
    actor = plan_memory(config(*base, "async_rollout.num_rollout_workers=1"), TINY, device)  # one actor GPU
    assert [p.name for p in actor.phases] == ["rollout", "update", "weight_send"]
    assert not any(t.startswith("engine") for p in actor.phases for t in p.terms)
    send = actor.phase("weight_send").terms
    assert send == {"actor weights (fp32 shards)": 4 * P, "actor AdamW moments (2 x fp32)": 8 * P,
                    "weight send: bucket, its packed copy, next full parameter": 2 * 2**20 + 512}


def test_the_start_up_check_refuses_a_rollout_worker_whose_engine_cannot_start():
    from reasonrl.trainer.model_checks import check_memory_plan

    cfg = config("model.dtype=bfloat16", "trainer.mode=async", "rollout.gpu_memory_utilization=0.03")
    printed = []
    # 0.03 x 80 GiB = 2.4 GiB for vLLM; the 1.5B model's bf16 weights alone are 2.9 GiB (the actor's GPU fits).
    with pytest.raises(ConfigError, match=r"does not fit the device's 80.0 GiB: vLLM cannot start"):
        check_memory_plan(cfg, gpu_plan(cfg), QWEN_1P5B, 80 * GIB, echo=printed.append)
    assert printed[1].startswith("rollout worker GPU (trainer.mode=async): memory plan per GPU")


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("device", ["80GB", None, True, -1, float("nan")])
def test_auto_with_a_device_size_that_is_not_a_number_names_it(device):
    with pytest.raises(ValueError, match="device_bytes must be a positive number of bytes"):
        resolve_auto_budgets(config(f"{ACTOR}=auto"), TINY, device)
    with pytest.raises(ValueError, match="device_bytes must be a positive number of bytes"):
        plan_rollout_worker(config(), TINY, device)


def test_auto_and_the_rollout_worker_name_the_missing_model_fields():
    partial = {k: v for k, v in TINY.items() if k not in ("num_hidden_layers", "vocab_size")}
    with pytest.raises(ValueError, match="config.json lacks num_hidden_layers, vocab_size"):
        resolve_auto_budgets(config(f"{ACTOR}=auto"), partial, 80 * GIB)
    with pytest.raises(ValueError, match="config.json lacks num_hidden_layers, vocab_size"):
        plan_rollout_worker(config(), partial, 80 * GIB)


def test_doctor_plan_names_a_model_that_cannot_be_read_offline(tmp_path, capsys):
    from reasonrl.doctor.plan import plan_main

    assert plan_main(["model.path=no-such-org/no-such-model"], 80.0, 1) == 2  # HF_HUB_OFFLINE=1 (conftest)
    assert "no-such-org/no-such-model" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{not json")
    assert plan_main([f"model.path={tmp_path}"], 80.0, 1) == 2
    err = capsys.readouterr().err
    assert "the memory plan needs the model's config.json" in err and str(tmp_path / "config.json") in err
    assert plan_main(["model.path=x"], float("nan"), 1) == 2
    assert "--device-gib must be a positive number of GiB, got nan" in capsys.readouterr().err


def test_doctor_refuses_a_device_size_that_is_not_a_number(capsys):
    from reasonrl.doctor.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--plan", "--device-gib", "80GB"])
    assert exit_info.value.code == 2
    assert "argument --device-gib: invalid float value: '80GB'" in capsys.readouterr().err
