"""``env.placement=ray``: environment steps in Ray actors on another node. A real two-node Ray cluster on this
machine (``ray.cluster_utils.Cluster``: a head, and a node with the custom resource ``env_node`` that stands for the
environments' machine); the loop runs in the test process with the real SmolLM2 tokenizer and a scripted model
(tests/env_helpers.py). Checked: every step ran in an actor on the ``env_node`` node (the environment reports its
node id and pid), each trajectory with its own row; an actor that dies mid-step fails its own trajectory
(``env_failed``), the others finish, and the next round runs on the restarted actor; a step that hangs times out as
a local one does; an actor no node can hold is refused at once, naming the keys."""
from __future__ import annotations

import json
import os

import pytest
import ray
from env_helpers import ScriptedPolicy, chat_prompt

import env_actor_helpers  # noqa: F401  (registers test_where here; the actors import it by name)
from helpers import ray_test_cluster
from reasonrl.config.env_schema import EnvConfig
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.multiturn import ToolRollout
from paths import TESTS




@pytest.fixture(scope="module")
def cluster():
    """A head of one CPU and a node with the custom resource ``env_node`` (the environments' machine); yields that
    node's id."""
    path = os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")])
    with ray_test_cluster({"num_cpus": 1}, [{"num_cpus": 2, "resources": {"env_node": 4}}], {"PYTHONPATH": path}):
        [node_id] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "env_node" in n["Resources"]]
        yield node_id


def call(name):
    return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


def remote_loop(tokenizer, scripts, **env):
    cfg = EnvConfig(placement="ray", num_actors=2, num_cpus_per_actor=0.5, resources={"env_node": 1}, **env)
    engine = ScriptedPolicy(tokenizer, {tuple(p): turns for p, turns in scripts})
    return ToolRollout(engine, tokenizer, None, max_turns=3, concurrency=4, env_cfg=cfg, default_env=None)


def told(c):
    return json.loads(c.conversation[1]["content"])


def test_steps_run_in_actors_on_the_node_with_the_resource(cluster, tokenizer):
    prompts = [chat_prompt(tokenizer, f"Where are you? ({i})") for i in range(4)]
    loop = remote_loop(tokenizer, [(p, [call("where"), "\\boxed{1}"]) for p in prompts])
    try:
        rows = [{"environment": "test_where", "extra_info": {"answer": i}} for i in range(4)]
        out = loop.generate(prompts, SamplingParams(n=1, max_new_tokens=300), rows=rows)
        actors = loop.env_pool.where()
    finally:
        loop.close()
    assert {a["node_id"] for a in actors} == {cluster} and len({a["pid"] for a in actors}) == 2
    seen = [told(c) for (c,) in out]
    assert [s["answer"] for s in seen] == [0, 1, 2, 3]  # each trajectory's environment had its own row
    assert {s["node_id"] for s in seen} == {cluster}  # never the head (the test process's node)
    assert [s["pid"] for s in seen] == [a["pid"] for a in actors] * 2  # least busy actor first: 0, 1, 0, 1
    assert os.getpid() not in {s["pid"] for s in seen}
    assert all(c.env_failed == "" and c.env_reward == 1.0 and c.text.endswith("\\boxed{1}") for (c,) in out)


def answering_again(pool, limit_s=120.0):
    """Returns once every actor of ``pool`` answers a call (a killed one answers once Ray has restarted it)."""
    import time

    import ray

    end = time.monotonic() + limit_s
    for actor in pool.actors:
        while True:
            try:
                ray.get(actor.where.remote(), timeout=limit_s)
                break
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)  # polling a condition (the actor answers), not waiting for a guessed moment


def test_a_dead_actor_fails_only_its_trajectories_and_is_restarted(cluster, tokenizer):
    die, fine, later1, later2 = (chat_prompt(tokenizer, q) for q in ("die", "fine", "later 1", "later 2"))
    loop = remote_loop(tokenizer, [(die, [call("die"), "never"]), (fine, [call("where"), "\\boxed{1}"]),
                                   (later1, [call("where"), "\\boxed{2}"]), (later2, [call("where"), "\\boxed{2}"])],
                       step_timeout_s=20.0)
    row = {"environment": "test_where"}
    try:
        before = loop.env_pool.where()
        # "die" starts on actor 0 and ends its process mid-step; "fine" runs on actor 1
        (d,), (f,) = loop.generate([die, fine], SamplingParams(n=1, max_new_tokens=300), rows=[row, row])
        answering_again(loop.env_pool)  # the order made explicit: the next round starts once Ray has restarted it
        (l1,), (l2,) = loop.generate([later1, later2], SamplingParams(n=1, max_new_tokens=300), rows=[row, row])
        after = loop.env_pool.where()
    finally:
        loop.close()
    assert d.finish_reason == "env_error" and "step failed" in d.env_failed and "Actor" in d.env_failed, d.env_failed
    assert d.turns == 1 and sum(d.tool_mask) == 0
    assert f.env_failed == "" and told(f)["pid"] == before[1]["pid"] and f.text.endswith("\\boxed{1}")
    # the next round runs: actor 0 was restarted by Ray (a new process), actor 1 is the same
    assert after[0]["pid"] != before[0]["pid"] and after[1]["pid"] == before[1]["pid"]
    assert {told(c)["pid"] for c in (l1, l2)} == {a["pid"] for a in after}
    assert all(c.env_failed == "" for c in (l1, l2))


def test_a_hung_step_times_out_as_locally(cluster, tokenizer):
    hang, fine = chat_prompt(tokenizer, "hang"), chat_prompt(tokenizer, "fine")
    loop = remote_loop(tokenizer, [(hang, [call("hang"), "never"]), (fine, [call("where"), "\\boxed{1}"])],
                       step_timeout_s=1.0)
    row = {"environment": "test_where"}
    try:
        (h,), (f,) = loop.generate([hang, fine], SamplingParams(n=1, max_new_tokens=300), rows=[row, row])
    finally:
        loop.close()
    assert h.finish_reason == "env_error" and "timed out after 1 s" in h.env_failed
    assert f.env_failed == "" and f.text.endswith("\\boxed{1}")


def test_an_actor_no_node_can_hold_is_refused_at_once(cluster, tokenizer):
    prompt = chat_prompt(tokenizer, "anything")
    loop = ToolRollout(ScriptedPolicy(tokenizer, {tuple(prompt): ["hi"]}), tokenizer, None,
                       env_cfg=EnvConfig(placement="ray", resources={"gpu_box": 1}), default_env=None)
    with pytest.raises(RuntimeError, match="env.resources"):
        loop.env_pool.start()
    loop.close()
