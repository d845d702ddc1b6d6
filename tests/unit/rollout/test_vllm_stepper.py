"""The bookkeeping of step-by-step vLLM generation (reasonrl/rollout/vllm_stepper.py) with hand-derived numbers, and
the version protocol of ``InEngineGenerator`` (reasonrl/rollout/partial.py) around a stand-in engine that records
when it is asked; the real engine is in test_partial_in_engine.py."""
import pytest

from reasonrl.rollout.base import SamplingParams
from reasonrl.rollout.partial import InEngineGenerator, VersionedCompletion
from reasonrl.rollout.vllm_stepper import Stream, absorb, finish_reason


def test_deltas_accumulate_with_the_version_of_their_step():
    s = Stream()
    absorb(s, [5, 6], [-0.5, -1.0], None, 3)  # a step may give more than one token (a chunk)
    absorb(s, [], [], None, 3)  # a step without a new token for this sample (a prefill chunk)
    absorb(s, [7], [-2.0], None, 4)  # the weights changed before this step
    absorb(s, [2], [-0.25], "stop", 4)
    assert s.token_ids == [5, 6, 7, 2] and s.logprobs == [-0.5, -1.0, -2.0, -0.25]
    assert s.versions == [3, 3, 4, 4] and s.finish_reason == "stop"


def test_no_logprobs_when_not_asked_and_the_reasons_as_completions_give_them():
    s = Stream()
    absorb(s, [9, 9, 9], [], None, 0)
    absorb(s, [1], [], "length", 0)
    assert (s.token_ids, s.logprobs, s.versions, s.finish_reason) == ([9, 9, 9, 1], [], [0, 0, 0, 0], "length")
    assert finish_reason("stop") == "stop" and finish_reason("abort") == "abort"


def test_inconsistent_deltas_are_refused():
    s = Stream()
    with pytest.raises(ValueError, match="2 log-probs for 1 tokens"):
        absorb(s, [4], [-1.0, -2.0], None, 0)
    absorb(s, [4], [-1.0], None, 2)
    with pytest.raises(ValueError, match="version 1 after version 2"):
        absorb(s, [5], [-1.0], None, 1)
    absorb(s, [5], [-1.0], "stop", 2)
    with pytest.raises(ValueError, match="finished"):
        absorb(s, [6], [-1.0], None, 2)


class _SteppedEngine:
    """Runs ``steps`` engine steps for each call, one token per step, and records the version of each."""

    def __init__(self, steps: int):
        self.steps, self.log = steps, []

    def generate_steps(self, prompts, sampling, before_step):
        s = Stream()
        for i in range(self.steps):
            version = before_step()
            self.log.append(("step", version))
            absorb(s, [100 + i], [-1.0], "length" if i == self.steps - 1 else None, version)
        return [[VersionedCompletion(s.token_ids, "", s.logprobs, s.finish_reason, s.versions)] for _ in prompts]


def test_the_generator_loads_a_newer_version_once_before_the_step_that_uses_it():
    engine, asked, loaded = _SteppedEngine(4), [], []

    def latest():
        asked.append(1)
        return 7 if len(asked) >= 4 else 5  # newer from the 4th question on: before the 3rd step

    def load(v):
        engine.log.append(("load", v))
        loaded.append(v)

    gen = InEngineGenerator(engine, 5, latest, load)
    out = gen.generate([[1, 2]], SamplingParams(n=1, max_new_tokens=4))
    # asked once before the requests go in, then before each of the 4 steps
    assert len(asked) == 5 and gen.steps == 4 and loaded == [7] and gen.version == 7
    assert engine.log == [("step", 5), ("step", 5), ("load", 7), ("step", 7), ("step", 7)]
    assert out[0][0].versions == [5, 5, 7, 7]
    assert gen.generate([], SamplingParams()) == []


def test_an_older_latest_version_is_not_loaded():
    engine = _SteppedEngine(2)

    def never(v):
        raise AssertionError(f"loaded {v}")

    gen = InEngineGenerator(engine, 3, lambda: 2, never)
    assert gen.generate([[1]], SamplingParams(n=1))[0][0].versions == [3, 3]
