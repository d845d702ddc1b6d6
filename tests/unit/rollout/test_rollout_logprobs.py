"""Rollout log-probs only when something uses them (``rollout.logprobs``): the config's auto rule, the check that
TIS cannot run without them, and the hf engine skipping its extra scoring pass."""
from __future__ import annotations

import pytest
import torch

from reasonrl.config import ConfigError, load_config
from reasonrl.rollout import SamplingParams
from reasonrl.config.plan import rollout_logprobs_wanted


def cfg(*args):
    return load_config(list(args), cuda_available=False)[0]


def test_auto_asks_only_for_tis_or_the_weight_sync_check():
    assert not rollout_logprobs_wanted(cfg())
    assert rollout_logprobs_wanted(cfg("algorithm.off_policy.correction=tis"))
    assert rollout_logprobs_wanted(cfg("rollout.check_weight_sync=true"))
    assert rollout_logprobs_wanted(cfg("rollout.logprobs=true"))  # forced on: the mismatch metrics are logged
    assert not rollout_logprobs_wanted(cfg("rollout.logprobs=false", "rollout.check_weight_sync=true"))


def test_tis_without_rollout_logprobs_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout.logprobs"):
        load_config(["algorithm.off_policy.correction=mis", "rollout.logprobs=false"], cuda_available=False)


def test_hf_engine_skips_log_probs_when_not_asked(model_path):
    """Same greedy tokens either way; log-probs only when asked (the hf engine computes them in a second forward
    pass, which the off switch saves)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from reasonrl.models import load_tokenizer
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    engine = HFRolloutEngine(model.eval(), load_tokenizer(model_path))
    calls = []
    score = engine.sequence_logprobs
    engine.sequence_logprobs = lambda *a: calls.append(1) or score(*a)
    params = dict(n=2, temperature=0.0, max_new_tokens=5, ignore_eos=True)  # greedy n > 1: one decode, copied
    with_lp = engine.generate([[5, 9, 17]], SamplingParams(**params))[0]
    without = engine.generate([[5, 9, 17]], SamplingParams(**params, logprobs=False))[0]
    assert len(calls) == 1
    assert [len(c.logprobs) for c in with_lp] == [5, 5] and [c.logprobs for c in without] == [[], []]
    assert with_lp[0].token_ids == with_lp[1].token_ids
    assert [c.token_ids for c in without] == [c.token_ids for c in with_lp]
