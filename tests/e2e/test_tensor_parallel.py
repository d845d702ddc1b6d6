"""Tensor-parallel rollouts in the hybrid engine, for real on CPU: two Ray workers share one vLLM engine sharded two
ways (vLLM's external-launcher executor over the workers' gloo group), and the WorkerGroup dispatches one rollout
request per engine.

SmolLM2-135M has 9 attention heads and 3 KV heads, which 2 does not divide, so the engine test uses a small random
Llama (4 heads, 2 KV heads, head size 64 as vLLM's CPU attention needs) with SmolLM2's tokenizer, built in a
temporary folder."""
from __future__ import annotations

import sys

import pytest
import ray
import torch

from helpers import cpu_worker_plan

from reasonrl.config import load_config, to_dict
from reasonrl.controller import WorkerGroup
from reasonrl.data import Batch
from reasonrl.data.sample import Sample
from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker
from reasonrl.workers.dispatch import ONE_TO_ALL, SPLIT_BY_ENGINE, dispatch

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's worker classes travel by value


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING",  # a cluster of its own
             runtime_env={"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
                                       "TOKENIZERS_PARALLELISM": "false"}})
    try:
        yield
    finally:
        ray.shutdown()


class EchoWorker:
    """No model: records which prompts each rank was given."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, num_threads: int) -> None:
        self.rank = rank

    @dispatch(SPLIT_BY_ENGINE)
    def generate(self, prompts: Batch) -> Batch:
        return Batch(meta={"prompt": list(prompts["prompt"]), "rank": [self.rank] * len(prompts)})

    @dispatch(ONE_TO_ALL)
    def seen(self, prompts: Batch) -> list:
        return list(prompts["prompt"])


@pytest.mark.slow
def test_split_by_engine_one_part_per_engine_result_once(local_ray):
    # 4 ranks, engines of 2: ranks 0,1 -> engine 0 gets prompts a,b; ranks 2,3 -> engine 1 gets c,d. The result
    # holds each prompt once, from each engine's first rank (0 and 2), in engine order.
    group = WorkerGroup(EchoWorker, 4, use_gpu=False, cpus_per_worker=1, init_kwargs={}, engine_ranks=2)
    try:
        out = group.generate(Batch(meta={"prompt": ["a", "b", "c", "d"]}))
    finally:
        group.shutdown()
    assert out["prompt"] == ["a", "b", "c", "d"]
    assert out["rank"] == [0, 0, 2, 2]


@pytest.mark.slow
def test_split_by_engine_each_rank_gets_its_engines_part(local_ray):
    class Recorder(EchoWorker):
        @dispatch(SPLIT_BY_ENGINE)
        def generate(self, prompts: Batch) -> Batch:
            self.last = list(prompts["prompt"])
            return Batch(meta={"prompt": self.last})

        @dispatch(ONE_TO_ALL)
        def last_seen(self) -> list:
            return self.last

    group = WorkerGroup(Recorder, 4, use_gpu=False, cpus_per_worker=1, init_kwargs={}, engine_ranks=2)
    try:
        group.generate(Batch(meta={"prompt": ["a", "b", "c", "d"]}))
        assert group.last_seen() == [["a", "b"], ["a", "b"], ["c", "d"], ["c", "d"]]
    finally:
        group.shutdown()


def test_engine_size_must_divide_workers():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 .*num_workers=3"):
        WorkerGroup(EchoWorker, 3, use_gpu=False, cpus_per_worker=1, init_kwargs={}, engine_ranks=2)


def test_hf_engine_refuses_tensor_parallel_before_loading_anything(model_path):
    from reasonrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size': 2 needs rollout.engine=vllm"):
        load_config(["rollout.engine=hf", "rollout.tensor_parallel_size=2"], cuda_available=False)  # the rule
    from reasonrl.config.device_defaults import Hardware
    from reasonrl.config.plan import RunPlan

    # engine=auto on a machine without vLLM is the hf engine: the plan refuses it by the same rule, naming the engine
    cfg, _ = load_config(["rollout.tensor_parallel_size=2", "trainer.num_workers=2"], cuda_available=False)
    with pytest.raises(ConfigError, match=r"tensor_parallel_size': 2 needs rollout.engine=vllm \(the hf engine"):
        RunPlan.build(cfg, Hardware(vllm_installed=False))
    assert RunPlan.build(cfg, Hardware(vllm_installed=True)).engine == "vllm"


# ----------------------------------------------------------------------------- the real engine, sharded two ways


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory, model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    directory = tmp_path_factory.mktemp("tp_llama")
    tok = AutoTokenizer.from_pretrained(model_path)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return str(directory)


class ProbedWorker(ActorRolloutRefWorker):
    @dispatch(ONE_TO_ALL)
    def engine_shard_rows(self) -> int:
        """Rows of the engine's embedding on this rank (vocabulary-parallel: the vocabulary split over the ranks)."""
        model = self.host.engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
        return int(model.model.embed_tokens.weight.shape[0])

    @dispatch(ONE_TO_ALL)
    def generate_here(self, prompts, sampling) -> list:
        """This rank's own view of an engine call (both ranks of an engine must agree)."""
        return [s.response_ids for s in self.generate(Batch(meta={"prompt_ids": prompts}), sampling)]

    @dispatch(ONE_TO_ALL)
    @torch.no_grad()
    def perturb_actor(self, scale: float) -> None:
        gen = torch.Generator().manual_seed(7)
        for p in self.policy.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(torch.randn(local.shape, generator=gen, dtype=local.dtype) * scale)


@pytest.mark.slow
def test_two_workers_share_one_engine_sharded_two_ways(local_ray, tp_model):
    cfg, _ = load_config(["rollout.engine=vllm", "rollout.tensor_parallel_size=2", "rollout.kv_cache_gb=0.1",
                          "data.max_prompt_length=32", "rollout.max_new_tokens=8", "eval.max_new_tokens=8",
                          "model.dtype=float32", "trainer.device=cpu", "trainer.profile=none", "trainer.num_workers=2",
                          f"model.path={tp_model}"], cuda_available=False)
    group = WorkerGroup(ProbedWorker, 2, use_gpu=False, cpus_per_worker=1, engine_ranks=2,
                        init_kwargs={"config": to_dict(cfg), "model_path": tp_model, "plan": cpu_worker_plan(cfg, 2)})
    try:
        from transformers import AutoConfig

        full_vocab = AutoConfig.from_pretrained(tp_model).vocab_size
        rows = group.engine_shard_rows()
        assert all(r < full_vocab for r in rows) and sum(rows) >= full_vocab  # each rank holds a shard

        sampling = {"n": 2, "temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True, "logprobs": True}
        prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
        per_rank = group.generate_here(prompts, sampling)
        assert per_rank[0] == per_rank[1]  # the engine's two ranks sampled the same tokens
        out = group.generate(Batch(meta={"prompt_ids": prompts}), sampling)
        assert len(out) == 4 and [s.group for s in out] == [0, 0, 1, 1]  # one engine: its result once, not per rank

        seq_prompt, seq_response = [1, 2, 3], list(out[0].response_ids)
        before = group.check_weight_sync(seq_prompt, seq_response)
        group.perturb_actor(0.05)
        stale = group.check_weight_sync(seq_prompt, seq_response)
        sync = group.sync_weights()
        after = group.check_weight_sync(seq_prompt, seq_response)
    finally:
        group.shutdown()
    assert before["weight_sync/logprob_diff_max"] < 1e-3  # the same initial weights on both sides
    assert stale["weight_sync/logprob_diff_max"] > 1e-2  # the actor moved, the engine did not
    assert after["weight_sync/logprob_diff_max"] < 1e-3, after  # each rank's shard of the new weights arrived
    assert all(s["bytes"] > 0 for s in sync)


class StreamWorker(EchoWorker):
    """A streaming generate that answers each prompt with its own text, one prompt per chunk, and records its part."""

    def generate_stream(self, prompts: Batch, chunk_prompts: int):
        self.part = list(prompts["prompt"])
        for prompt, group in zip(self.part, prompts["groups"]):
            yield [Sample(group=group, response_ids=[group], response_text=f"\\boxed{{{prompt}}}",
                          rollout_log_probs=[], finish_reason="stop")]

    @dispatch(ONE_TO_ALL)
    def streamed_part(self) -> list:
        return self.part


@pytest.mark.slow
def test_streaming_splits_by_engine_and_keeps_each_engines_rows_once(local_ray):
    """Rewards while generating with tensor-parallel engines: the ranks of one engine get the same prompts (they run
    the engine together), and only each engine's first rank's rows are verified, each prompt once."""
    from reasonrl.config.schema import RewardConfig
    from reasonrl.data.prompts import Prompt
    from reasonrl.rewards import make_pool
    from reasonrl.trainer.metrics import PhaseTimer
    from reasonrl.trainer.streaming import collect_stream

    prompts = [Prompt([i], {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": str(i)}})
               for i in range(4)]
    group = WorkerGroup(StreamWorker, 4, use_gpu=False, cpus_per_worker=1, init_kwargs={}, engine_ranks=2)
    try:
        streams = group.stream("generate_stream", Batch(meta={"prompt": [str(i) for i in range(4)],
                                                              "groups": list(range(4))}), 1)
        reward = RewardConfig(workers=1, timeout_s=30)
        with make_pool(reward) as pool:  # the reward router, as a run's (it takes the RewardItems)
            samples = collect_stream(group, streams, prompts, pool, reward, PhaseTimer())
        assert group.streamed_part() == [["0", "1"], ["0", "1"], ["2", "3"], ["2", "3"]]
    finally:
        group.shutdown()
    assert [s.response_text for s in samples] == [f"\\boxed{{{i}}}" for i in range(4)]  # each prompt once, in order
    assert [s.group for s in samples] == [0, 1, 2, 3]  # engine 1's Samples carry the group ids of its share
    assert [s.result.correct for s in samples] == [True] * 4  # each row verified against its own prompt


class BlockingWorker(EchoWorker):
    @dispatch(ONE_TO_ALL)
    def answer(self) -> int:
        return self.rank


@pytest.mark.slow
def test_a_submitted_call_is_watched_like_a_dispatched_one(local_ray, tmp_path, monkeypatch):
    """``submit`` arms the same hang hook as a dispatched call, and ``wait_watched`` stops a hung rank at the
    watchdog's limit naming the phase and the rank (the weight broadcast of async mode waits the same way)."""
    from reasonrl.controller.worker_group import wait_watched
    from reasonrl.trainer.watchdog import PhaseHangError, PhaseWatchdog

    group = WorkerGroup(BlockingWorker, 2, use_gpu=False, cpus_per_worker=1, init_kwargs={})
    try:
        group.enable_watchdog(PhaseWatchdog(factor=10.0, min_s=0.0, max_s=3.0), str(tmp_path))
        assert wait_watched("answer", [(group, group.submit("answer"))]) == [0, 1]
        monkeypatch.setenv("REASONRL_FAULT_AT", "worker1.answer=hang")  # counted from now: rank 1 blocks
        with pytest.raises(PhaseHangError, match=r"phase 'answer' \(BlockingWorker\) has not finished on rank\(s\) 1"):
            wait_watched("answer", [(group, group.submit("answer"))])
    finally:
        group.shutdown()
