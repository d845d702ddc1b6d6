"""Helpers that several test modules share (tests/ is on sys.path: ``from helpers import ...``); fixtures stay in
conftest.py. Tiny random models built here in seconds (no download), and an in-process CriticWorker over them."""
from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch


def read_jsonl(path: Path) -> List[Any]:
    """The JSON lines of ``path`` (blank lines skipped): a run's metrics, samples or ledger journal."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def ray_trainer(base: Sequence[str], policy: str, args: Sequence[str]):
    """A ``Trainer`` on the Ray backend from the overrides ``base``, then ``model.path=policy``, then ``args`` (CPU
    plan; the caller closes it)."""
    from reasonrl.config import load_config
    from reasonrl.config.plan import RunPlan
    from reasonrl.trainer.backends import RayBackend
    from reasonrl.trainer.trainer import Trainer

    cfg, _ = load_config(list(base) + [f"model.path={policy}"] + list(args), cuda_available=False)
    return Trainer(cfg, RunPlan.build(cfg), RayBackend())


def fit_and_close(trainer, keep=lambda trainer: None):
    """``trainer.fit()``, then ``trainer.close()`` whatever happens; ``keep(trainer)``, read before the close."""
    try:
        trainer.fit()
        return keep(trainer)
    finally:
        trainer.close()


@contextlib.contextmanager
def planned_faults(spec: Optional[str]) -> Iterator[Dict[str, int]]:
    """``REASONRL_FAULT_AT=spec`` (reasonrl/fault_points.py) for the block, with fault points counted afresh;
    yields the arrivals per point (the live counter). ``None`` or ``""``: no fault planned, arrivals still reset."""
    import pytest

    from reasonrl import fault_points

    mp = pytest.MonkeyPatch()
    if spec:
        mp.setenv(fault_points.ENV, spec)
    hits = fault_points.Counter()
    mp.setattr(fault_points, "_hits", hits)
    try:
        yield hits
    finally:
        mp.undo()


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a world-size-1 process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_test_cluster(head: Dict[str, Any], nodes: List[Dict[str, Any]],
                     env_vars: Optional[Dict[str, str]] = None) -> Iterator[Any]:
    """A Ray cluster of several raylets on this machine (``ray.cluster_utils.Cluster``): a head with ``head``'s
    resources and one node per entry of ``nodes``; this process is the driver, connected with ``env_vars`` for the
    workers. Torn down (every raylet and its workers) whatever the test does."""
    import ray
    from ray._common.utils import reset_ray_address
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # The machine is shared: Ray's memory monitor would kill a worker when *other* processes fill the memory.
    saved = os.environ.get("RAY_memory_monitor_refresh_ms")
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"  # read by the raylets at start
    cluster = Cluster(initialize_head=True, head_node_args=head)
    # Ray's test cluster records itself as this machine's current cluster, which a plain ray.init() elsewhere on the
    # machine would then join: forget it (the test connects by address).
    reset_ray_address()
    try:
        for node in nodes:
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        runtime_env = {"env_vars": env_vars} if env_vars else None
        ray.init(address=cluster.address, runtime_env=runtime_env, logging_level="WARNING")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_memory_monitor_refresh_ms", None)
        else:
            os.environ["RAY_memory_monitor_refresh_ms"] = saved


SHARP_LM_VOCAB = 96
"""The vocabulary of ``tiny_sharp_lm``."""


def tiny_sharp_lm(kind: str = "qwen2", tied: bool = True, seed: int = 0):
    """A 2-layer Qwen2 or Llama causal LM in memory (fp32, eval mode) whose head is scaled by 20: HF initialises a
    small-std head, and a sharp distribution makes log-probs, entropy and the sampling temperature matter."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=SHARP_LM_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(Qwen2Config(**common)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**common))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    return model.float().eval()


def padded_rollout_batch():
    """3 collated rows: prompts left-padded to 5, responses right-padded to 4 (row 2 has a 1-token response);
    returns (input_ids, attention_mask, position_ids, responses, response_mask)."""
    from reasonrl.data.collate import collate_rollout

    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    responses = [[11, 12, 13, 14], [15, 16, 17], [18]]
    b = collate_rollout(prompts, responses, [[0.0] * len(r) for r in responses], pad_id=0)
    return b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"], b["response_mask"]


def make_tiny_causal_lm(directory, seed: int = 0) -> str:
    """A 2-layer Llama causal LM with random weights (vocabulary of 64), saved as a Hugging Face directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(str(directory), safe_serialization=True)
    return str(directory)


def make_tiny_policy(directory, tokenizer_path: str) -> str:
    """A 2-layer random Llama with the real SmolLM2 tokenizer (and chat template): runs the whole loop in seconds
    (``reasonrl.bench.shapes.tiny_policy``, which the fleet's fault matrix builds too)."""
    from reasonrl.bench.shapes import tiny_policy

    return tiny_policy(directory, tokenizer_path)


def cpu_worker_plan(cfg, world_size: int = 1):
    """What a worker built alone in a test is handed: the plan of ``cfg`` on the CPU over ``world_size`` ranks
    (``RunPlan.build``), for the workers."""
    from dataclasses import replace

    from reasonrl.config.plan import RunPlan

    return RunPlan.build(replace(cfg, trainer=replace(cfg.trainer, num_workers=world_size))).for_workers()


def gpu_plan(cfg, world_size: int = 1, tensor_parallel_size: int = 1, device: str = "cuda"):
    """The plan of ``cfg`` on ``world_size`` devices (GPUs, or CPU ranks) with engines of ``tensor_parallel_size``
    ranks: what the memory plan of a placement is given."""
    from dataclasses import replace

    from reasonrl.config.device_defaults import Hardware
    from reasonrl.config.plan import RunPlan

    placed = replace(cfg, trainer=replace(cfg.trainer, num_workers=world_size),
                     rollout=replace(cfg.rollout, tensor_parallel_size=tensor_parallel_size))
    return RunPlan.build(placed, Hardware(device=device, gpu_count=world_size if device == "cuda" else 0))


def make_critic_worker(model_path: str, *overrides: str):
    """A PPO CriticWorker in this process (world size 1, gloo, one thread) for 2 prompts x 2 samples, critic.lr 0.01;
    ``overrides``: more key=value settings."""
    from reasonrl.config import load_config, to_dict
    from reasonrl.workers.critic import CriticWorker

    cfg, _ = load_config(["algorithm=ppo", "trainer.device=cpu", "data.train_batch_size=2", "rollout.n=2",
                          "actor.micro_batch_size_per_worker=4", "critic.lr=0.01", *overrides])
    return CriticWorker(to_dict(cfg), model_path, rank=0, world_size=1, master_addr="127.0.0.1",
                        master_port=free_port(), num_threads=1, plan=cpu_worker_plan(cfg))


def critic_batch():
    """4 responses of 3 tokens each (prompts of different lengths, left-padded); returns 1 for rows 0-1, 0 else."""
    from reasonrl.data.collate import collate_rollout

    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    responses = [[20, 21, 22], [23, 24, 25], [26, 27, 28], [29, 30, 31]]
    batch = collate_rollout(prompts, responses, [[0.0] * 3] * 4, pad_id=0)
    batch["returns"] = torch.tensor([1.0, 1.0, 0.0, 0.0])[:, None] * batch["response_mask"]
    return batch


def make_reward_model(directory, base_path: str, seed: int = 0) -> str:
    """A one-label sequence-classification model from ``base_path`` (the real SmolLM2) whose score head has seeded
    random weights (std 0.5, so scores spread), saved with its tokenizer as a Hugging Face directory."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        weight = torch.randn(model.score.weight.shape, generator=torch.Generator().manual_seed(seed)) * 0.5
        model.score.weight.copy_(weight)
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return str(directory)


def perturbed_weights(model_path: str, scale: float = 0.01, seed: int = 0):
    """The model's own weights (name -> tensor, from its safetensors) and a copy with seeded Gaussian noise of
    ``scale`` added to every tensor: a second weight version whose greedy log-probs differ from the first."""
    from safetensors.torch import load_file

    own = load_file(str(Path(model_path) / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    return own, {k: v + scale * torch.randn(v.shape, generator=g) for k, v in own.items()}


def generate_across_a_load(engine, generator, prompts, sampling, own):
    """Run ``generator.generate`` (whose ``load_version`` loads other weights into ``engine`` mid-call) on
    ``prompts``; score its first completion per prompt under the weights it ended on, then put ``own`` back (also
    when the call fails) and score again. Returns (completions, log-probs under the new weights, under ``own``)."""
    try:
        out = [group[0] for group in generator.generate(prompts, sampling)]
        new_lp = engine.sequence_logprobs(prompts, [c.token_ids for c in out])
    finally:
        engine.update_weights(own.items())
        engine.finish_weight_update()
    return out, new_lp, engine.sequence_logprobs(prompts, [c.token_ids for c in out])


def benchmark_module(script: str):
    """``benchmarks/<script>.py`` loaded as a module of its own name plus ``_under_test`` (the benchmark scripts are
    not a package); a script that imports its siblings needs ``benchmarks/`` on ``sys.path`` first."""
    import importlib.util

    from paths import REPO

    spec = importlib.util.spec_from_file_location(f"{script}_under_test", REPO / "benchmarks" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chat_prompt_ids(tokenizer, questions: Sequence[str]) -> List[List[int]]:
    """Each question as one user turn under the tokenizer's chat template, with the generation prompt: token ids."""
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for q in questions]


def round_of(tmp_path: Path, step: int = 3, count: int = 4):
    """A fleet round of ``count`` prompts (batch ``step``) over replica0 and replica1 (least outstanding requests),
    its ledger journal under ``tmp_path``: (``FleetRound``, its router, its ledger)."""
    from reasonrl.fleet.ledger import Ledger
    from reasonrl.fleet.router import Router
    from reasonrl.trainer.fleet_journal import FleetRound

    router = Router("least_outstanding", load="requests")
    router.add("replica0")
    router.add("replica1")
    ledger = Ledger.open(tmp_path / f"round_{step:06d}.jsonl", step, [step * count + k for k in range(count)])
    return FleetRound(step, count, 2, router, ledger), router, ledger


COPY_PROMPT = "Copy this code block exactly, then say the number it prints:\n```python\nprint({a} * {b})\n```"
"""A task SmolLM2 does about half the time at temperature 1: copying the code block is a tool call (task=math_tool)."""


def tool_copy_rows(count: int) -> List[Dict[str, Any]]:
    """``count`` math_tool rows (the python tool's system prompt, COPY_PROMPT for 6..6+count-1 times 7, the product as
    the answer): trajectories with tool turns from the real SmolLM2."""
    from reasonrl.datasets.math_tool import with_tool_prompt

    return [with_tool_prompt({"data_source": "openai/gsm8k", "ability": "math", "verifier": "math",
                              "prompt": [{"role": "user", "content": COPY_PROMPT.format(a=6 + i, b=7)}],
                              "reward_model": {"style": "rule", "ground_truth": str((6 + i) * 7)},
                              "extra_info": {"split": "train", "index": i}}) for i in range(count)]
