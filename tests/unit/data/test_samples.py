"""Samples born in the engine host: completions become Samples there (group ids handed over with the prompts, typed
tool and environment outcomes), they pickle as plain data, and the driver binds each to its prompt."""
from __future__ import annotations

import math
import pickle

import pytest

from reasonrl.data.prompts import Prompt
from reasonrl.data.sample import Sample, ToolOutcome, bind_prompts
from reasonrl.rollout.base import Completion
from reasonrl.rollout.multiturn import ToolCompletion
from reasonrl.workers.engine_host import completions_to_samples, generate_chunks


class Echo:
    """An engine whose n completions of a prompt are its ids plus 100 + j (a log-prob of -j each)."""

    def generate(self, prompts, params):
        return [[Completion([*p, 100 + j], f"{p[0]}-{j}", [-float(j)] * (len(p) + 1), "stop") for j in range(params.n)]
                for p in prompts]


def test_engine_samples_carry_the_group_ids_handed_over_in_every_chunk():
    # 3 prompts, n=2, chunks of 2 prompts: [p0, p1] then [p2]; the group ids are the round's (7, 8, 9), not the
    # positions in the chunk, so the driver needs no offset per engine or per sub-batch.
    chunks = list(generate_chunks(Echo(), [[1], [2], [3]], {"n": 2, "max_new_tokens": 4}, 2, groups=[7, 8, 9]))
    assert [[(s.group, s.response_text) for s in chunk] for chunk in chunks] == [
        [(7, "1-0"), (7, "1-1"), (8, "2-0"), (8, "2-1")], [(9, "3-0"), (9, "3-1")]]
    first = chunks[0][1]
    assert (first.response_ids, first.rollout_log_probs, first.finish_reason) == ([1, 101], [-1.0, -1.0], "stop")
    assert first.tool_mask is None and first.tools is None and first.env is None and first.prompt is None
    plain = list(generate_chunks(Echo(), [[1], [2]], {"n": 1, "max_new_tokens": 4}, 0))  # no group ids: 0, 1
    assert [s.group for s in plain[0]] == [0, 1]
    with pytest.raises(ValueError, match="2 group ids for 3 prompts"):
        list(generate_chunks(Echo(), [[1], [2], [3]], {"n": 1, "max_new_tokens": 4}, 0, groups=[0, 1]))


def test_tool_trajectories_become_typed_outcomes_and_pickle_as_plain_data():
    t = ToolCompletion([5, 6, 7], "answer", [-0.5, 0.0, -0.25], "stop", tool_mask=[0, 1, 0], turns=2, tool_calls=1,
                       tool_errors=1, tool_timeouts=0, tool_seconds=0.75, env="search", malformed_calls=3,
                       calls_per_tool={"search": 1}, env_failed="", env_reward=1.0, step_rewards=[math.nan, 1.0],
                       env_drift=0, env_noncanonical=1, conversation=[{"role": "assistant", "content": "hi"}])
    [s] = completions_to_samples([4], [[t]], with_tools=True)
    assert s.group == 4 and s.tool_mask == [0, 1, 0]
    assert s.tools == ToolOutcome(turns=2, tool_calls=1, tool_errors=1, tool_timeouts=0, tool_seconds=0.75,
                                  malformed_calls=3, calls_per_tool={"search": 1})
    assert (s.env.name, s.env.failed, s.env.reward, s.env.drift, s.env.noncanonical) == ("search", "", 1.0, 0, 1)
    assert s.env.step_rewards[1] == 1.0 and math.isnan(s.env.step_rewards[0])
    assert s.env.conversation == ({"role": "assistant", "content": "hi"},)
    with pytest.raises(AttributeError):
        s.env.failed = "later"  # frozen: the outcome is what the engine saw
    # What crosses Ray: the Sample's own fields, no tensors, nothing of the driver (prompt, verifier, result unset).
    again = pickle.loads(pickle.dumps(s))
    assert again.tools == s.tools and again.env.name == "search" and again.response_ids == [5, 6, 7]
    assert b"torch" not in pickle.dumps(s)


def test_the_driver_binds_each_sample_to_its_groups_prompt():
    prompts = [Prompt([1, 2], {"q": "a"}), Prompt([3], {"q": "b"})]
    samples = [Sample(group=g, response_ids=[9], response_text="", rollout_log_probs=[], finish_reason="stop")
               for g in (1, 0, 1)]
    bind_prompts(samples, prompts)
    assert [s.prompt_ids for s in samples] == [[3], [1, 2], [3]] and samples[0].prompt.row == {"q": "b"}
    with pytest.raises(RuntimeError, match="group 2 in a round of 2 prompts"):
        bind_prompts([Sample(group=2, response_ids=[], response_text="", rollout_log_probs=[],
                             finish_reason="stop")], prompts)

