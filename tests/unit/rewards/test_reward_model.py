"""The reward-model role: a sequence-classification model built from the real SmolLM2 (a seeded score head, saved to
tmp) scores (prompt, response) pairs on its own Ray actor; its scores equal a direct forward of the same model on the
same inputs, padded batches included, and combine with the rule verifier per row."""
from __future__ import annotations

import math

import pytest
import torch
from components import needs
from helpers import make_reward_model

from reasonrl.rewards.reward_model import RewardModelWorker, to_score

ROWS = [
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2+2?"}],
     "reward_model": {"style": "model", "ground_truth": "4"}},
    {"data_source": "openai/gsm8k", "prompt": [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Name a prime number above ten."}],
     "reward_model": {"style": "model", "ground_truth": "11"}},
]
RESPONSES = ["4", "Eleven is a prime number, and so are 13 and 17; I pick \\boxed{11}.", "The answer is 5."]


def test_sigmoid_and_raw_scores():
    assert to_score(0.0, "sigmoid") == 0.5 and to_score(2.0, "raw") == 2.0
    assert to_score(-800.0, "sigmoid") == 0.0 and to_score(800.0, "sigmoid") == 1.0  # no overflow either way
    assert to_score(math.log(3), "sigmoid") == pytest.approx(0.75)  # 1 / (1 + 1/3)


@needs("a machine without CUDA", not torch.cuda.is_available(), "the test checks the refusal where CUDA is missing")
def test_a_gpu_pool_without_cuda_refuses_instead_of_falling_back_to_cpu(tmp_path):
    with pytest.raises(RuntimeError, match="has GPUs but CUDA is not available.*refusing to run the reward model on "
                                           "the CPU"):
        RewardModelWorker(str(tmp_path), "float32", 64, "cuda")


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, model_path):
    return make_reward_model(tmp_path_factory.mktemp("rm"), model_path)


def direct_logit(model, tok, messages, response) -> float:
    """One unpadded forward of the whole model (its own pooling at the last token)."""
    text = tok.apply_chat_template(list(messages) + [{"role": "assistant", "content": response}], tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


@pytest.mark.slow
def test_reward_model_role_scores_equal_a_direct_forward(reward_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from reasonrl.config import load_config
    from reasonrl.rewards import make_pool, verify_item

    cfg, _ = load_config(["task=gsm8k", "reward.workers=1", f"reward.model.path={reward_model_dir}",
                          "reward.model.batch_size=2"], cuda_available=False)
    rows = [ROWS[0], ROWS[1], ROWS[0]]
    mixed = {**ROWS[0], "reward_model": {"ground_truth": "4", "sources": {"rule": 0.5, "model": 0.5}}}
    items = [verify_item(r, text, cfg.reward) for r, text in zip(rows, RESPONSES)]
    items.append(verify_item(mixed, "\\boxed{4}", cfg.reward))
    with make_pool(cfg.reward) as pool:
        results = pool.verify_batch(items)  # batches of 2: [0, 1] padded together, then [2, 3]
        where = pool.sources["model"].info()
        stats = pool.pop_stats()
        import ray

        ray.kill(pool.sources["model"].actors[0])  # the actor dies: its samples fail, named, never a 0
        dead = pool.verify_batch(items[:1])
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(reward_model_dir)
    expected = [direct_logit(model, tok, r["prompt"], text) for r, text in zip(rows, RESPONSES)]
    assert len({round(x, 3) for x in expected}) == 3  # the head tells the responses apart
    for result, logit in zip(results[:3], expected):
        assert not result.failed
        assert result.info["logit"] == pytest.approx(logit, abs=1e-4)
        assert result.score == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-5)
        assert result.correct == (result.score >= 0.5)
    # rule 1.0 (\boxed{4} is right) x 0.5 + sigmoid(its logit) x 0.5
    logit = direct_logit(model, tok, ROWS[0]["prompt"], "\\boxed{4}")
    assert results[3].score == pytest.approx(0.5 + 0.5 / (1 + math.exp(-logit)), abs=1e-5)
    assert results[3].correct and set(results[3].info["sources"]) == {"rule", "model"}
    assert where == [{"device": "cpu", "node": where[0]["node"], "gpu_ids": []}]
    assert stats["reward_source/reward_model/requests"] == 2 and stats["reward_source/reward_model/scored"] == 4
    assert dead[0].failed and "reward_model actor 0 failed" in dead[0].info["reason"]
