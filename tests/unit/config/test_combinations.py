"""The combination matrix of the loop: mode x tools x tensor-parallel x packing x critic x dynamic sampling x streaming
x LoRA.

Every one of the 256 combinations is either refused by the RunPlan (and ``load_config``) with a message naming the
keys, or planned with the facts it asks for (fast test below). The supported combinations without tensor-parallel
rollouts then run real CPU steps in this process (the in-process backend, a 2-layer random Llama with the real
tokenizer, the hf engine): a pairwise covering set of them, chosen greedily below, so every pair of feature values
that can occur together is trained at least once (``test_supported_pairs_train_a_real_step``). Tensor-parallel
rollouts need vLLM engines across worker processes; they are planned here and run in tests/e2e/test_tensor_parallel.py.
"""
from __future__ import annotations

import copy
import functools
import itertools
import json
from typing import Dict, List, Optional, Tuple

import pytest

from reasonrl.config import ConfigError, load_config

DIMS = ("async", "tools", "tp", "packing", "critic", "dynamic", "streaming", "lora")


def combo_args(c: Dict[str, bool]) -> List[str]:
    """The settings of a combination (each dimension on or off)."""
    args = ["task=math_tool" if c["tools"] else "task=arith",
            "algorithm=ppo" if c["critic"] else ("algorithm=dapo" if c["dynamic"] else "algorithm=grpo")]
    if c["critic"] and c["dynamic"]:
        args.append("algorithm.dynamic_sampling=true")
    if c["dynamic"]:
        args.append("algorithm.overlong_buffer=0")
    if c["async"]:
        args.append("trainer.mode=async")
    if c["tp"]:
        args += ["rollout.engine=vllm", "rollout.tensor_parallel_size=2", "trainer.num_workers=2"]
    if c["packing"]:
        args += ["actor.use_packing=true", "actor.max_tokens_per_micro_batch=64"]
    if c["streaming"]:
        args.append("rollout.stream_chunk_prompts=1")
    if c["lora"]:
        args.append("actor.lora.rank=4")
    return args


def refused_keys(c: Dict[str, bool]) -> List[str]:
    """The keys the rules must name for ``c`` (empty: supported). Async mode does not wire the critic, DAPO's refill
    or tensor-parallel rollout workers yet (config/combinations.py says why)."""
    keys = []
    if c["async"] and (c["critic"] or c["dynamic"]):
        keys.append("trainer.mode")
    if c["async"] and c["tp"]:
        keys.append("rollout.tensor_parallel_size")
    if c["lora"] and c["tp"]:  # adapter-only sync into a sharded engine: actor.lora.merge_for_rollout=true is needed
        keys.append("actor.lora.merge_for_rollout")
    return keys


ALL = [dict(zip(DIMS, values)) for values in itertools.product((False, True), repeat=len(DIMS))]


def name(c: Dict[str, bool]) -> str:
    return "+".join(k for k in DIMS if c[k]) or "plain"


@functools.lru_cache(maxsize=None)
def preset(task: str, algorithm: str):
    return load_config([f"task={task}", f"algorithm={algorithm}"], cuda_available=False)[0]


def configured(c: Dict[str, bool]):
    """The config of ``combo_args(c)``, built from its presets by setting the fields (128 loads would take minutes);
    ``test_configured_equals_the_command_line`` checks the two agree."""
    cfg = copy.deepcopy(preset("math_tool" if c["tools"] else "arith",
                               "ppo" if c["critic"] else ("dapo" if c["dynamic"] else "grpo")))
    if c["dynamic"]:
        cfg.algorithm.dynamic_sampling, cfg.algorithm.overlong_buffer = True, 0
    if c["async"]:
        cfg.trainer.mode = "async"
    if c["tp"]:
        cfg.rollout.engine, cfg.rollout.tensor_parallel_size, cfg.trainer.num_workers = "vllm", 2, 2
    if c["packing"]:
        cfg.actor.use_packing, cfg.actor.max_tokens_per_micro_batch = True, 64
    if c["streaming"]:
        cfg.rollout.stream_chunk_prompts = 1
    if c["lora"]:
        cfg.actor.lora.rank = 4
    return cfg


@pytest.mark.parametrize("combo", [ALL[5], ALL[-1], ALL[42]], ids=name)
def test_configured_equals_the_command_line(combo):
    from reasonrl.config import to_dict

    if refused_keys(combo):
        with pytest.raises(ConfigError):
            load_config(combo_args(combo), cuda_available=False)
        return
    assert to_dict(load_config(combo_args(combo), cuda_available=False)[0]) == to_dict(configured(combo))


def test_every_combination_is_planned_or_refused_naming_the_keys():
    from reasonrl.config.load import validate
    from reasonrl.config.plan import RunPlan

    refused = 0
    for combo in ALL:
        cfg, want = configured(combo), refused_keys(combo)
        if want:
            refused += 1
            with pytest.raises(ConfigError) as err:
                validate(cfg)  # what load_config runs
            assert any(k in str(err.value) for k in want), (name(combo), err.value)  # the first broken rule
            with pytest.raises(ConfigError) as err:
                RunPlan.build(cfg)
            assert all(k in str(err.value) for k in want), (name(combo), err.value)  # every broken rule, named
            continue
        validate(cfg)
        plan = RunPlan.build(cfg)
        assert plan.mode == ("async" if combo["async"] else "colocated")
        assert plan.generator == ("tools" if combo["tools"] else "plain")
        assert plan.engine_ranks == (2 if combo["tp"] else 1) and plan.world_size == (2 if combo["tp"] else 1)
        assert plan.use_critic == combo["critic"] and plan.passes.values == combo["critic"]
        assert plan.stream_chunk_prompts == (1 if combo["streaming"] else 0)
        assert plan.steps_ahead == (cfg.async_rollout.max_staleness if combo["async"] else 0)
        assert plan.training_sampling["n"] == cfg.rollout.n and plan.validation_sampling["n"] == 1
    # planned: colocated, all but LoRA x TP (128 - 32); async: tools x packing x streaming x LoRA without TP (16)
    assert refused == 256 - 96 - 16


def covering_set(combos: List[Dict[str, bool]], dims: Tuple[str, ...]) -> List[Dict[str, bool]]:
    """A small subset of ``combos`` in which every pair of (dimension, value) settings that some combination has
    appears together at least once (greedy: each pick covers the most pairs not yet covered)."""
    def pairs(c):
        return {((a, c[a]), (b, c[b])) for a, b in itertools.combinations(dims, 2)}

    left = set().union(*(pairs(c) for c in combos))
    chosen = []
    while left:
        best = max(combos, key=lambda c: len(pairs(c) & left))
        chosen.append(best)
        left -= pairs(best)
    return chosen


RUN_DIMS = ("async", "tools", "packing", "critic", "dynamic", "streaming", "lora")
SUPPORTED = [c for c in ALL if not c["tp"] and not refused_keys(c)]
COVER = covering_set(SUPPORTED, RUN_DIMS)


def test_the_covering_set_covers_every_supported_pair():
    assert set(BRANCHES) <= {name(c) for c in COVER}  # each branch rides on a run that exists
    """Checks the greedy picker itself on the matrix: 40 supported combinations, every co-occurring pair covered."""
    assert len(SUPPORTED) == 64 + 16  # colocated: 2^6; async: tools x packing x streaming x LoRA
    for a, b in itertools.combinations(RUN_DIMS, 2):
        for va, vb in itertools.product((False, True), repeat=2):
            possible = any(c[a] == va and c[b] == vb for c in SUPPORTED)
            covered = any(c[a] == va and c[b] == vb for c in COVER)
            assert possible == covered, (a, va, b, vb)
    assert len(COVER) < len(SUPPORTED) // 3


TINY = ["rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=4", "reward.workers=1", "trainer.logger=[jsonl]", "trainer.total_steps=1",
        "trainer.device=cpu", "trainer.resume=never", "trainer.save_every=0", "algorithm.max_resample_rounds=1",
        "rollout.max_turns=2", "trainer.log_samples_every=1"]


def one_step(combo: Dict[str, bool], tiny_policy: str, out, extra: Optional[List[str]] = None) -> Dict[str, float]:
    """One real step of ``combo`` in this process; its metrics row (as logged)."""
    from reasonrl.trainer.backends import InProcessBackend
    from reasonrl.config.plan import RunPlan
    from reasonrl.trainer.trainer import Trainer

    cfg, _ = load_config(combo_args(combo) + TINY + [f"model.path={tiny_policy}", f"trainer.output_dir={out}"]
                         + (extra or []), cuda_available=False)
    trainer = Trainer(cfg, RunPlan.build(cfg), InProcessBackend(num_threads=1))
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows[-1]


BRANCHES = {  # the step's other branches, each on one of the covering runs: (extra settings, what must show)
    "plain": (["algorithm.kl_in_reward=true", "algorithm.use_kl_loss=false"], "kl_in_reward"),
    "tools+critic+dynamic": (["critic.warmup_steps=1"], "critic_warmup"),
    "dynamic+streaming": (["algorithm.overlong_buffer=4"], "overlong"),
    "async": ([], "no_old_pass"),
}


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.parametrize("combo", COVER, ids=name)
def test_supported_pairs_train_a_real_step(combo, tiny_policy, tmp_path):
    extra, branch = BRANCHES.get(name(combo), ([], ""))
    m = one_step(combo, tiny_policy, tmp_path / "run", extra)
    assert m["step"] == 1 and "reward/mean" in m and "timing_s/advantages" in m
    assert ("tool/turns_mean" in m) == combo["tools"]  # the tool loop ran in either mode
    assert ("timing_s/values" in m) == combo["critic"]
    assert ("dynamic_sampling/rounds" in m) == combo["dynamic"]
    assert ("async/staleness" in m) == combo["async"]
    if combo["lora"] and "weight_sync/bytes" in m:  # the adapter alone travels (the tiny model's weights: 6.4 MB)
        assert m["weight_sync/bytes"] < 1e6
    if combo["async"]:
        assert m["async/staleness"] == 0.0  # step 0 trains on the round generated with the initial weights
    if combo["streaming"] and not combo["async"]:
        assert "timing_s/verify" in m  # what verification left after the last streamed sub-batch
    if branch == "critic_warmup":  # the critic learns first: no actor update, the engines wake as they were
        assert "actor/optimizer_steps" not in m and "timing_s/wake" in m and "critic/value_loss" in m
    else:
        assert m["actor/optimizer_steps"] >= 1 and m["weight_sync/bytes"] > 0
    if branch == "kl_in_reward":  # KL-shaped token rewards need the old and the reference log-probs first
        assert "timing_s/old_log_probs" in m and "timing_s/ref_log_probs" in m and "actor/kl" in m
    if branch == "no_old_pass":  # one optimizer step per batch: the update's own log-probs are the old ones
        assert "timing_s/old_log_probs" not in m and "actor/entropy" in m


PARTIAL = ["task=arith", "trainer.mode=async", "fleet.enabled=true", "fleet.continuous=true", "rollout.partial=true"]


def test_partial_rollouts_in_the_engine_need_vllm():
    cfg = load_config(PARTIAL + ["rollout.engine=vllm", "rollout.partial_mode=in_engine"], cuda_available=False)[0]
    assert cfg.rollout.partial_mode == "in_engine"
    assert load_config(PARTIAL + ["rollout.engine=hf"], cuda_available=False)[0].rollout.partial_mode == "segments"
    for bad, words in ((["rollout.engine=hf", "rollout.partial_mode=in_engine"], "in_engine needs rollout.engine=vllm"),
                       (["rollout.partial_mode=pause"], "unknown 'pause'; choose one of segments, in_engine"),
                       (["rollout.engine=vllm", "rollout.partial_mode=in_engine", "actor.lora.rank=4"],
                        "adapter-only LoRA sync")):
        with pytest.raises(ConfigError) as err:
            load_config(PARTIAL + bad, cuda_available=False)
        assert "rollout.partial_mode" in str(err.value) and words in str(err.value)
    load_config(PARTIAL + ["rollout.engine=vllm", "rollout.partial_mode=in_engine", "actor.lora.rank=4",
                           "actor.lora.merge_for_rollout=true"], cuda_available=False)
