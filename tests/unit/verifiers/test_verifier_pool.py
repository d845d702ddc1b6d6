"""VerifierPool: input order, hard timeouts, crash isolation, counters, options, clean workers.

Misbehaving verifiers (hang, os._exit, segfault, raise) are a real plugin written to a temporary folder as
an installed distribution (a ``.dist-info`` with an ``entry_points.txt``); the pool hands its sys.path to
the workers, which find the plugin through the ``reasonrl.verifiers`` entry-point group.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from reasonrl.verifiers import VerifierPool, VerifyResult

from verifier_plugins import installed_plugin  # tests/ is on sys.path (rootdir-less test modules)

PLUGIN_SOURCE = textwrap.dedent('''
    """Test plugin: a verifier that misbehaves on request."""
    import ctypes, os, time
    from reasonrl.verifiers import Verifier, VerifyResult

    class UnrulyVerifier(Verifier):
        def verify(self, response, ground_truth, **extra):
            if response == "hang":
                while True:
                    time.sleep(0.05)
            if response == "exit":
                os._exit(3)
            if response == "segv":
                ctypes.string_at(0)
            if response == "raise":
                raise ValueError("bad input")
            if response == "pid":
                return VerifyResult(1.0, True, {"pid": os.getpid(), "reason": "pid"})
            if response == "extra":
                return VerifyResult(1.0, True, {"reason": "extra", "extra": extra, **self.options})
            if response in ("nan", "inf", "-inf"):
                return VerifyResult(float(response), True, {"reason": "not a number"})
            if response == "big":
                return VerifyResult(7.5, True, {"reason": "out of range"})
            if response == "text_score":
                return VerifyResult("high", True, {})
            if response == "nonresult":
                return {"score": 1.0, "correct": True}
            if response == "no_backend":
                return VerifyResult.failure("sandbox error: the backend did not start")
            ok = response == ground_truth
            return VerifyResult(float(ok), ok, {"reason": "echo", "extracted": response})
''')


@pytest.fixture(scope="module")
def unruly_plugin(tmp_path_factory):
    with installed_plugin(tmp_path_factory.mktemp("unruly"), "unruly_verifier", PLUGIN_SOURCE, "unruly", "UnrulyVerifier") as root:
        yield root


@pytest.fixture(scope="module")
def pool(unruly_plugin):
    with VerifierPool(workers=2, timeout_s=2.0, verifier_options={"unruly": {"flavour": "test"}}) as p:
        yield p


def test_results_come_back_in_input_order(pool):
    # 40 items over 5 golds, interleaved so that grouping by gold reorders them internally.
    items = [("math", f"so the answer is \\boxed{{{i % 7}}}", str(i % 5)) for i in range(40)]
    results = pool.verify_batch(items)
    assert [r.correct for r in results] == [(i % 7) == (i % 5) for i in range(40)]
    assert [r.info["extracted"] for r in results] == [str(i % 7) for i in range(40)]
    pool.pop_stats()


def test_empty_batch_and_bad_item_shape(pool):
    assert pool.verify_batch([]) == []
    with pytest.raises(ValueError, match="item 0 must be"):
        pool.verify_batch([("math", "x")])


def test_hang_and_pathological_math_cost_only_their_timeout(pool):
    pool.pop_stats()
    items = [
        ("unruly", "a", "a"),
        ("unruly", "hang", "a"),                              # never returns -> timeout
        ("unruly", "b", "a"),
        # sympy expands this for minutes; the pool's 2 s timeout comes before the verifier's own 5 s budget
        ("math", "\\boxed{(x+y+z+w)^{40}}", "(x+y+z+w)^{39}"),
        ("math", "The answer is 72.", "72"),
    ]
    results = pool.verify_batch(items)
    assert [r.score for r in results] == [1.0, 0.0, 0.0, 0.0, 1.0]
    for r in (results[1], results[3]):
        assert r.info["timed_out"] is True and not r.correct and r.failed  # no verdict, not a wrong answer
        assert "timeout" in r.info["reason"]
    assert "'unruly'" in results[1].info["reason"] and "'math'" in results[3].info["reason"]
    assert not any(r.failed for r in (results[0], results[2], results[4]))
    assert results[2].info["reason"] == "echo"  # queued behind the hang on the same worker: requeued, verified
    stats = pool.pop_stats()
    # 5 calls, 2 timeouts, no errors; the slowest call is a timeout (>= 2 s), the median a fast one.
    assert stats["verify/calls"] == 5 and stats["verify/timeouts"] == 2 and stats["verify/errors"] == 0
    assert stats["verify/latency_p99_s"] >= 2.0 > stats["verify/latency_p50_s"]
    assert pool.pop_stats()["verify/calls"] == 0  # counters reset on pop


def test_dead_workers_cost_only_their_call_and_are_replaced(pool):
    pool.pop_stats()
    items = [("unruly", "exit", "x"), ("unruly", "ok", "ok"), ("unruly", "segv", "x"),
             ("unruly", "raise", "x"), ("unruly", "ok", "ok"), ("math", "#### 1,000", "1000")]
    results = pool.verify_batch(items)
    assert [r.score for r in results] == [0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert results[0].info["worker_died"] and results[0].info["exit_code"] == 3
    assert results[2].info["worker_died"] and results[2].info["exit_code"] == -11  # SIGSEGV
    assert "raised ValueError: bad input" in results[3].info["reason"]
    assert [r.failed for r in results] == [True, False, True, True, False, False]
    assert pool.pop_stats()["verify/errors"] == 3  # two deaths + one exception
    # The replacements serve the next batch.
    after = pool.verify_batch([("unruly", "pid", "")] * 16)
    assert all(r.correct for r in after) and all(isinstance(r.info["pid"], int) for r in after)


def test_extra_fields_and_verifier_options_reach_the_verifier(pool):
    result = pool.verify_batch([("unruly", "extra", "g", {"tests": [1, 2]})])[0]
    assert result.info["extra"] == {"tests": [1, 2]} and result.info["flavour"] == "test"


def test_workers_import_neither_torch_nor_ray():
    code = ("import sys\nimport reasonrl.verifiers.pool_worker as w\nw.warm_up()\n"
            "print(sorted(m for m in ('torch', 'ray', 'vllm') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_options_must_be_per_verifier():
    with pytest.raises(ValueError, match="maps a verifier name to its options"):
        VerifierPool(workers=1, verifier_options={"float_rounding": 6})


def test_closed_pool_refuses_work():
    pool = VerifierPool(workers=1, timeout_s=5)
    assert pool.verify_batch([("math", "\\boxed{\\frac{1}{2}}", "0.5")])[0] == VerifyResult(
        1.0, True, {"extracted": "\\frac{1}{2}", "method": "boxed", "reason": "correct (numeric)"})
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.verify_batch([("math", "1", "1")])


def test_workers_that_cannot_start_raise_instead_of_hanging(tmp_path, monkeypatch):
    # A plugin that kills the interpreter on import: every worker dies during warm-up (loading plugins).
    (tmp_path / "doomed_verifier.py").write_text("import os\nos._exit(7)\n")
    dist = tmp_path / "doomed_verifier-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: doomed-verifier\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[reasonrl.verifiers]\ndoomed = doomed_verifier:Doomed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pool = VerifierPool(workers=1, timeout_s=5)
    with pytest.raises(RuntimeError, match=r"failed to start 3 times in a row \(exit code 7\)"):
        pool.verify_batch([("math", "\\boxed{1}", "1")])
    with pytest.raises(RuntimeError, match="closed"):
        pool.verify_batch([("math", "\\boxed{1}", "1")])


def test_results_that_are_no_verdict_are_failures_naming_the_verifier(pool):
    """A non-finite or out-of-range score, a score that is not a number, a return value that is not a VerifyResult,
    and a verifier's own failure: each comes back failed (score 0, not correct) with a reason naming the verifier,
    never as the score the plugin sent; a plain verdict in the same batch is untouched."""
    responses = ["nan", "inf", "-inf", "big", "text_score", "nonresult", "no_backend", "ok"]
    results = pool.verify_batch([("unruly", r, "ok") for r in responses])
    assert [r.failed for r in results] == [True] * 7 + [False]
    assert [r.score for r in results] == [0.0] * 7 + [1.0] and [r.correct for r in results] == [False] * 7 + [True]
    reasons = [r.info["reason"] for r in results]
    assert all(reason.startswith("verifier 'unruly'") for reason in reasons[:6]), reasons
    assert "non-finite score nan" in reasons[0] and "non-finite score inf" in reasons[1]
    assert "7.5, outside reward.score_range [0, 1]" in reasons[3]
    assert "not a number" in reasons[4] and "returned dict, not VerifyResult" in reasons[5]
    assert reasons[6] == "sandbox error: the backend did not start"


def test_score_range_is_the_pools_setting(unruly_plugin):
    with VerifierPool(workers=1, timeout_s=5.0, score_range=(-10.0, 10.0)) as wide:
        result = wide.verify_batch([("unruly", "big", "ok")])[0]
    assert not result.failed and result.score == 7.5
    with pytest.raises(ValueError, match="score_range"):
        VerifierPool(workers=1, score_range=(1.0, 0.0))
