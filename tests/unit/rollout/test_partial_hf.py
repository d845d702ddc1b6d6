"""Partial rollouts (reasonrl/rollout/partial.py) through the hf engine's ``generate`` (the real SmolLM2-135M-Instruct,
float32, greedy): segments equal one call token for token, also across a version bump that reloads the same weights
through the engine's ``update_weights``, whose later tokens carry the new version."""
from pathlib import Path

import pytest
import torch

from reasonrl.rollout.base import SamplingParams
from reasonrl.rollout.partial import SegmentedGenerator

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(model_path, tokenizer):
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # OpenMP threads spin-waiting on a small shared machine (tests/conftest.py's vllm_engine)
    yield HFRolloutEngine.from_pretrained(model_path, tokenizer, torch.float32, "cpu")
    torch.set_num_threads(threads)


def test_hf_segments_equal_one_call_across_a_bump(engine, tokenizer, model_path):
    from safetensors.torch import load_file

    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                  return_dict=True)["input_ids"])
               for q in ("What is 2+3? Answer with the number only.", "Write a long story about a dragon.")]
    own = load_file(str(Path(model_path) / "model.safetensors"))
    loaded = []

    def load(version):
        engine.update_weights(own.items())
        engine.finish_weight_update()
        loaded.append(version)

    sampling = SamplingParams(temperature=0.0, max_new_tokens=10)
    whole = engine.generate(prompts, sampling)
    gen = SegmentedGenerator(engine, tokenizer, 4, 7, lambda: 7 if gen.segments < 1 else 8, load)
    parts = gen.generate(prompts, sampling)
    assert loaded == [8] and gen.segments == 3  # 4 + 4 + 2 for the story
    ends = []
    for a, b in zip((g[0] for g in whole), (g[0] for g in parts)):
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason and b.text == a.text
        assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)
        assert b.versions == ([7] * 4 + [8] * 6)[:len(b.token_ids)]
        ends.append((b.finish_reason, len(b.token_ids)))
    assert ends[1] == ("length", 10) and ends[0][0] == "stop"
