"""A fleet replica with ``rollout.partial``: weights staged while a generation runs reach it at the next segment.

The RolloutWorker is built in this process (conftest's 2-layer ``tiny_policy``, hf engine, greedy, segments of 2
tokens); the staging is made to happen exactly as the second segment is about to start (the generator's version
query is wrapped), so the order is explicit, not a race.
"""
from __future__ import annotations

import pytest
from helpers import cpu_worker_plan


@pytest.mark.slow
def test_weights_staged_mid_generation_reach_the_next_segment(tiny_policy):
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.config import load_config, to_dict
    from reasonrl.data.batch import Batch
    from reasonrl.rollout import SamplingParams
    from reasonrl.workers.published_weights import pack
    from reasonrl.workers.rollout_worker import RolloutWorker

    cfg, _ = load_config(["task=arith", "trainer.mode=async", "fleet.enabled=true", "fleet.continuous=true",
                          "rollout.partial=true", "rollout.partial_segment_tokens=2", "rollout.engine=hf",
                          f"model.path={tiny_policy}"], cuda_available=False)
    worker = RolloutWorker(to_dict(cfg), tiny_policy, rank=0, world_size=1, plan=cpu_worker_plan(cfg))
    prompt = worker.tokenizer.encode("What is 17 + 25?")
    batch = Batch(meta={"prompt_ids": [prompt], "groups": [0]})
    greedy = {"n": 1, "max_new_tokens": 8, "temperature": 0.0, "logprobs": True}

    old = worker.generate(batch, greedy)[0]
    assert len(old.response_ids) == 8 and old.token_versions == [0] * 8

    torch.manual_seed(0)  # version 1: every weight moved, so greedy decoding goes elsewhere
    model = AutoModelForCausalLM.from_pretrained(tiny_policy, torch_dtype=torch.float32)
    new = [(name, (t + 0.5 * torch.randn_like(t)).detach()) for name, t in model.named_parameters()]
    generator, asked = worker.host.generator, []
    latest = generator.latest_version

    def published_before_segment_two() -> int:
        asked.append(1)
        if len(asked) == 2:  # the first segment is done: version 1 is published now
            worker.stage_published(pack(new), 1)
        return latest()

    generator.latest_version = published_before_segment_two
    mixed = worker.generate(batch, greedy)[0]
    assert mixed.token_versions == [0, 0, 1, 1, 1, 1, 1, 1]
    assert (mixed.oldest_version, mixed.newest_version, mixed.weights_version) == (0, 1, 0)
    assert mixed.response_ids[:2] == old.response_ids[:2] and worker.version == 1
    # the last 6 tokens are version 1's greedy continuation of the prompt and the first 2 tokens
    cont = worker.host.engine.generate([prompt + mixed.response_ids[:2]],
                                       SamplingParams(n=1, max_new_tokens=6, temperature=0.0))[0][0]
    assert mixed.response_ids[2:] == list(cont.token_ids)
    assert mixed.response_ids[2:] != old.response_ids[2:]
