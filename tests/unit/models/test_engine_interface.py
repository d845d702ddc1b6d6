"""The RolloutEngine protocol is complete: callers use only what it declares, and the hf engine (here) and the vllm
engine (tests/e2e/test_vllm_engine.py) implement all of it."""
from __future__ import annotations

import ast
from pathlib import Path

import torch

from reasonrl.rollout import SLEEP_PARTS, RolloutEngine, SamplingParams
from paths import REPO


CALLERS = ["reasonrl/workers/actor_rollout_ref.py", "reasonrl/workers/rollout_worker.py", "reasonrl/eval/runner.py",
           "reasonrl/rollout/weight_sync.py", "reasonrl/rollout/multiturn.py", "reasonrl/workers/engine_host.py"]


def declared() -> set:
    return {n for n in vars(RolloutEngine) if not n.startswith("_")} | set(RolloutEngine.__annotations__)


def engine_attributes_used(path: Path) -> set:
    """Every ``<...>.engine.X`` and ``engine.X`` attribute read in a module."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "engine") or \
                    (isinstance(owner, ast.Attribute) and owner.attr == "engine"):
                used.add(node.attr)
    return used


def test_callers_use_only_declared_engine_members():
    want = {"name", "supports_sleep", "asleep_parts", "generate", "sequence_logprobs", "update_weights",
            "finish_weight_update", "load_adapter", "sleep", "wake_up", "shutdown"}
    assert declared() == want
    for path in CALLERS:
        used = engine_attributes_used(REPO / path)
        assert used, path  # the scan sees the module's engine calls
        assert used <= want, f"{path} uses undeclared engine members: {sorted(used - want)}"
    text = (REPO / "reasonrl/workers/actor_rollout_ref.py").read_text()
    assert "getattr(self.engine" not in text and "engine_asleep" not in text  # no fallbacks, no second sleep state


def test_hf_engine_implements_the_protocol(model_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from reasonrl.models import load_tokenizer
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    engine = HFRolloutEngine(model.eval(), load_tokenizer(model_path))
    assert isinstance(engine, RolloutEngine)
    assert not engine.supports_sleep and engine.asleep_parts == frozenset()
    engine.sleep()
    assert engine.asleep_parts == frozenset()  # no sleep mode: never asleep, generate keeps working
    engine.wake_up(list(SLEEP_PARTS))
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=4, ignore_eos=True)
    before = engine.generate([[5, 9, 17]], params)[0][0]
    # One sync: new weights in, then finish; the engine scores with them (the lm head zeroed: every log-prob is
    # log(1/64) = -4.158883).
    head = {n: torch.zeros_like(p) for n, p in model.named_parameters() if n == "lm_head.weight"}
    engine.update_weights(head.items())
    engine.finish_weight_update()
    lp = engine.sequence_logprobs([[5, 9, 17]], [before.token_ids])[0]
    assert len(lp) == 4 and all(abs(x - (-4.158883)) < 1e-5 for x in lp)
    engine.shutdown()
    assert engine.model is None
