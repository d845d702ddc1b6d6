"""VerifierPool.submit: work handed over without waiting, results per submission in input order, timeouts.

The order of events is made explicit with a real verifier plugin that waits for a file (a gate) to exist: no sleeps.
"""
from __future__ import annotations

import textwrap

import pytest

from reasonrl.verifiers import VerifierPool

from verifier_plugins import installed_plugin  # tests/ is on sys.path (rootdir-less test modules)

GATE_PLUGIN = textwrap.dedent('''
    """Test plugin: answers only once the file named by the ground truth exists."""
    import os, time
    from reasonrl.verifiers import Verifier, VerifyResult

    class GateVerifier(Verifier):
        def verify(self, response, ground_truth, **extra):
            while not os.path.exists(ground_truth):
                time.sleep(0.01)
            return VerifyResult(1.0, True, {"reason": "gate open", "response": response})
''')


def gate(root):
    return installed_plugin(root, "gate_verifier", GATE_PLUGIN, "gate", "GateVerifier")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    # two workers that know the gate verifier; no call here should time out, however slow the machine
    with gate(tmp_path_factory.mktemp("gate")), VerifierPool(workers=2, timeout_s=300.0) as p:
        yield p


def test_submit_returns_before_the_work_is_done_and_others_pass_it(pool, tmp_path):
    gate = tmp_path / "open"
    held = pool.submit([("gate", "first", str(gate))])  # occupies one worker until the gate opens
    assert not held.done()  # it cannot be: the gate does not exist yet
    # a later submission is verified by the other worker while the first still waits
    later = pool.submit([("math", f"\\boxed{{{i}}}", str(i % 2)) for i in range(4)])
    assert [r.correct for r in later.result()] == [True, True, False, False]  # 0 = 0, 1 = 1, 2 != 0, 3 != 1
    assert not held.done()
    gate.write_text("")
    [result] = held.result()
    assert result.correct and result.info["response"] == "first"


def test_results_in_input_order_per_submission_collected_in_any_order(pool):
    subs = [pool.submit([("math", f"the answer is \\boxed{{{k * 10 + i}}}", str(k * 10 + i * (i % 2)))
                         for i in range(5)]) for k in range(4)]
    for k in reversed(range(4)):  # collected last-first: each still gets its own results, in its own order
        results = subs[k].result()
        assert [r.info["extracted"] for r in results] == [str(k * 10 + i) for i in range(5)]
        assert [r.correct for r in results] == [i % 2 == 1 or i == 0 for i in range(5)]
        assert subs[k].result() is results  # a second call returns the same list
    assert pool.pop_stats()["verify/calls"] >= 20


def test_a_hanging_call_in_a_stream_costs_only_its_timeout(tmp_path):
    never = tmp_path / "never-created"
    with gate(tmp_path / "plugin"), VerifierPool(workers=2, timeout_s=3.0) as pool:
        hung, later = submit_hang_and_more(pool, never)
        assert pool.pop_stats()["verify/timeouts"] == 1
    assert [r.score for r in hung] == [1.0, 0.0, 0.0]
    assert hung[1].info["timed_out"] is True and "timeout" in hung[1].info["reason"]
    assert later[0].correct


def submit_hang_and_more(pool, never):
    first = pool.submit([("math", "\\boxed{1}", "1"), ("gate", "stuck", str(never)), ("math", "\\boxed{2}", "3")])
    second = pool.submit([("math", "\\boxed{4}", "4")])
    return first.result(), second.result()


def test_submit_checks_items_and_a_closed_pool_refuses():
    p = VerifierPool(workers=1, timeout_s=5)
    with pytest.raises(ValueError, match="item 1 must be"):
        p.submit([("math", "1", "1"), ("math",)])
    assert p.submit([]).result() == []
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.submit([("math", "1", "1")])
