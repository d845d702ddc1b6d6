"""The EvalPlan: what an evaluation derives from its config, checked before anything loads."""
import pytest

from reasonrl.config import load_config
from reasonrl.eval.plan import EvalError, EvalPlan
from reasonrl.eval.runner import run_eval


def plan_of(*args):
    cfg, _ = load_config(["task=arith", "trainer.device=cpu", *args])
    return cfg, EvalPlan.build(cfg)


def test_the_plan_holds_the_sampling_the_engine_and_the_generator():
    cfg, plan = plan_of("rollout.engine=hf", "eval.n=4", "eval.temperature=0.7", "eval.top_p=0.9",
                        "eval.max_new_tokens=24", "eval.k=[1,4]", "data.max_prompt_length=100")
    assert (plan.device, plan.engine, plan.generator, plan.split) == ("cpu", "hf", "plain", "val")
    assert plan.sampling == {"n": 4, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 24, "logprobs": False}
    assert plan.max_model_len == 124
    _, tools = plan_of("task=math_tool", "rollout.engine=hf")
    assert tools.generator == "tools"


@pytest.mark.parametrize("args, message", [
    (("eval.n=4", "eval.temperature=0"), "eval.temperature=0.0 \\(greedy\\) with eval.n=4"),
    (("eval.split=test",), "eval.split must be val or train"),
])
def test_bad_settings_fail_before_the_model_loads(args, message):
    with pytest.raises(EvalError, match=message):
        plan_of(*args)
    cfg, _ = load_config(["task=arith", "trainer.device=cpu", "model.path=/nonexistent/model", *args])
    with pytest.raises(EvalError, match=message):  # the plan's error, not the missing model's
        run_eval(cfg, echo=lambda _: None)


@pytest.mark.parametrize("arg, key", [("eval.n=0", "eval.n"), ("eval.top_p=1.5", "eval.top_p"),
                                      ("eval.max_new_tokens=0", "eval.max_new_tokens"),
                                      ("eval.batch_size=0", "eval.batch_size")])
def test_single_field_ranges_are_the_configs_own(arg, key):
    """eval.* intervals are ranges.FIELD_RANGES' (one statement of each), refused by load_config naming the key."""
    from reasonrl.config import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(["task=arith", "trainer.device=cpu", arg])
