"""The remote reward endpoint and the judge's HTTP path against real HTTP servers on loopback (http.server in a
thread): a stalling, an erroring and a garbage-speaking service each give *failed* samples (never a 0), retries with
backoff, the concurrency cap, the whole-call timeout; the judge's parsers on hand-made answers; the router's per-row
combination with the real verifier pool."""
from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reasonrl.config import load_config
from reasonrl.config.reward_sources_schema import JudgeConfig, RemoteRewardConfig
from reasonrl.rewards import RewardItem, make_pool, verify_item
from reasonrl.rewards.http_json import backoff_delay
from reasonrl.rewards.judge import JudgeSource, Unparsable, parse_logprob, parse_scale, parse_verdict
from reasonrl.rewards.remote import RemoteRewardSource

ROW = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2+2?"}],
       "reward_model": {"style": "remote", "ground_truth": "4"}, "extra_info": {"index": 7}}


class Service:
    """A loopback HTTP server whose handler is ``reply(service, payload) -> (status, body bytes)``; records every
    request body and the most requests it held at once."""

    def __init__(self, reply):
        self.reply = reply
        self.requests = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.release = threading.Event()  # stalling handlers wait on it (set at teardown)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with service.lock:
                    service.requests.append(payload)
                    service.in_flight += 1
                    service.max_in_flight = max(service.max_in_flight, service.in_flight)
                try:
                    status, body = service.reply(service, payload)
                finally:
                    with service.lock:
                        service.in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (timeout)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    made = []

    def start(reply):
        made.append(Service(reply))
        return made[-1]

    yield start
    for s in made:
        s.close()


def items(n, **row):
    return [RewardItem(None, f"response {i}", "4", {"index": i}, row={**ROW, **row}, sources={"remote": 1.0})
            for i in range(n)]


def remote(url, **kw):
    return RemoteRewardSource(RemoteRewardConfig(url=url, **{"backoff_s": 0.01, "max_backoff_s": 0.02, **kw}),
                              (0.0, 1.0))


def ok(service, payload):
    # score = 0.25 * (the item's index + 1): the service sees each item and answers in order
    return 200, json.dumps({"results": [{"score": 0.25 * (it["extra_info"]["index"] + 1)}
                                        for it in payload["items"]]}).encode()


def test_remote_contract_scores_in_order_in_batches(service):
    s = service(ok)
    source = remote(s.url, batch_size=2)
    results = source.submit(items(3)).result()
    assert [r.score for r in results] == [0.25, 0.5, 0.75] and not any(r.failed for r in results)
    assert [r.correct for r in results] == [False, True, True]  # correct_above 0.5 (bounds included)
    assert sorted(len(p["items"]) for p in s.requests) == [1, 2]  # two requests in flight at once, any order
    sent = next(p for p in s.requests if len(p["items"]) == 2)["items"][0]
    assert sent == {"prompt": ROW["prompt"], "response": "response 0", "ground_truth": "4",
                    "data_source": "openai/gsm8k", "extra_info": {"index": 0}}
    stats = source.pop_stats()
    assert stats["reward_source/remote/requests"] == 2 and stats["reward_source/remote/errors"] == 0
    source.close()


def test_a_stalling_service_times_out_into_failures_after_its_retries(service):
    def stall(service, payload):
        service.release.wait()
        return 200, b"{}"

    s = service(stall)
    source = remote(s.url, timeout_s=0.3, retries=1)
    results = source.submit(items(2)).result()
    assert all(r.failed and r.score == 0.0 and not r.correct for r in results)
    assert "EndpointTimeout" in results[0].info["reason"] and "after 2 attempts" in results[0].info["reason"]
    assert results[0].info["timed_out"] is True
    assert len(s.requests) == 2  # one request (both items), then one retry
    assert source.pop_stats()["reward_source/remote/timeouts"] == 2
    source.close()


def test_http_500_is_retried_with_exponential_backoff_then_fails(service):
    s = service(lambda service, payload: (500, b'{"detail": "boom"}'))
    source = remote(s.url, retries=3, backoff_s=0.01, max_backoff_s=0.03)
    (result,) = source.submit(items(1)).result()
    assert result.failed and "HTTP 500" in result.info["reason"] and "after 4 attempts" in result.info["reason"]
    assert len(s.requests) == 4
    # waits 0.01, 0.02, then 0.04 capped at max_backoff_s 0.03
    assert source.client.backoffs == [0.01, 0.02, 0.03]
    assert [backoff_delay(a, 0.5, 8.0) for a in (1, 2, 3, 4, 5, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    source.close()


def test_a_service_that_recovers_scores_after_retries(service):
    def flaky(service, payload):
        return (503, b"busy") if len(service.requests) <= 2 else ok(service, payload)

    s = service(flaky)
    source = remote(s.url, retries=2)
    (result,) = source.submit(items(1)).result()
    assert not result.failed and result.score == 0.25 and len(s.requests) == 3
    assert source.pop_stats()["reward_source/remote/retries"] == 2
    source.close()


@pytest.mark.parametrize("body, why", [
    (b"<html>not json</html>", "not JSON"),
    (b'{"scores": [1.0]}', "breaks the contract"),
    (b'{"results": [0.5]}', "not an object"),
    (b'{"results": [{"score": "high"}]}', "is not a number"),
    (b'{"results": [{"score": NaN}]}', "not finite"),
    (b'{"results": [{"score": 7}]}', "outside reward.score_range"),
    (b'{"results": [{"error": "model overloaded"}]}', "model overloaded"),
])
def test_garbage_answers_are_failures_not_zeros_and_not_retried(service, body, why):
    s = service(lambda service, payload: (200, body))
    source = remote(s.url, retries=2)
    (result,) = source.submit(items(1)).result()
    assert result.failed and why in result.info["reason"] and s.url in result.info["reason"]
    assert len(s.requests) == 1  # asking again would get the same answer
    source.close()


def test_a_client_error_is_not_retried_and_an_unreachable_service_is(service):
    s = service(lambda service, payload: (400, b'{"detail": "bad field"}'))
    source = remote(s.url, retries=2)
    (result,) = source.submit(items(1)).result()
    assert result.failed and "HTTP 400" in result.info["reason"] and len(s.requests) == 1
    source.close()
    s.close()  # nothing listens on the port any more: connection refused, retried, then a failure
    source = remote(s.url, retries=1)
    (result,) = source.submit(items(1)).result()
    assert result.failed and "EndpointUnreachable" in result.info["reason"]
    assert source.pop_stats()["reward_source/remote/retries"] == 1
    source.close()


def test_concurrency_cap_holds_and_is_reached(service):
    cap = 3
    barrier = threading.Barrier(cap)

    def gated(service, payload):
        barrier.wait(timeout=60)  # released only when `cap` requests are in flight together
        return 200, json.dumps({"results": [{"score": 0.5}]}).encode()

    s = service(gated)
    source = remote(s.url, batch_size=1, concurrency=cap, timeout_s=120)
    results = source.submit(items(2 * cap)).result()
    assert not any(r.failed for r in results) and len(s.requests) == 2 * cap
    assert s.max_in_flight == cap
    source.close()


def test_judge_parsers_on_hand_made_answers():
    # the final line in the asked form (more cases, and the injections: test_reward_hostile.py)
    assert parse_scale("The answer is 4, which is right.\nScore: 7", 0, 10) == 0.7  # (7-0)/10
    assert parse_scale("8/10", 1, 10) == pytest.approx(7 / 9)  # the numerator: (8-1)/(10-1)
    assert parse_scale("Rating: 3", 1, 5) == 0.5  # (3-1)/(5-1)
    with pytest.raises(Unparsable, match="off the scale"):
        parse_scale("Score: 11", 0, 10)
    with pytest.raises(Unparsable, match="not a verdict in the asked form"):
        parse_scale("excellent", 0, 10)
    verdicts = {"CORRECT": 1.0, "INCORRECT": 0.0}
    assert parse_verdict("Verdict: incorrect.", verdicts) == 0.0  # whole words: INCORRECT is not CORRECT
    assert parse_verdict("Correct steps, INCORRECT units.\nVerdict: INCORRECT", verdicts) == 0.0  # the last line
    with pytest.raises(Unparsable, match="not a verdict in the asked form"):
        parse_verdict("maybe", verdicts)
    # p(yes) = e^-0.5 = 0.6065, p(no) = e^-1.5 = 0.2231: 0.6065 / (0.6065 + 0.2231) = 0.7311 (= sigmoid(1))
    top = [{"token": " Yes", "logprob": -0.5}, {"token": "No", "logprob": -1.5}, {"token": "Maybe", "logprob": -2}]
    assert parse_logprob(top, {"yes": 1.0, "no": 0.0}) == pytest.approx(1 / (1 + math.exp(-1)))
    with pytest.raises(Unparsable, match="no verdict token"):
        parse_logprob([{"token": "Maybe", "logprob": -0.1}], {"yes": 1.0, "no": 0.0})


def chat(text):
    return 200, json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


def test_judge_fills_the_template_and_unparsable_answers_fail(service):
    s = service(lambda service, payload: chat("Score: 8" if "4" in payload["messages"][0]["content"]
                                              else "I cannot say"))
    cfg = JudgeConfig(url=s.url.replace("/score", "/v1"), model="judge-m", parser="scale", scale=[0, 10],
                      template="Q: {prompt}\nA: {response}\nGold: {ground_truth}", retries=0)
    judge = JudgeSource(cfg, (0.0, 1.0))
    good = RewardItem(None, "It is 4", "4", {}, row=ROW, sources={"judge": 1.0})
    bad = RewardItem(None, "It is five", "", {}, row=ROW, sources={"judge": 1.0})
    first, second = judge.submit([good, bad]).result()
    assert first.score == 0.8 and first.correct and not first.failed  # (8-0)/10
    assert second.failed and "unparsable" in second.info["reason"] and second.info["judge_text"] == "I cannot say"
    bodies = sorted(s.requests, key=lambda b: b["messages"][0]["content"])
    assert bodies[0]["messages"][0]["content"] == "Q: What is 2+2?\nA: It is 4\nGold: 4"
    assert bodies[0]["model"] == "judge-m" and bodies[0]["temperature"] == 0.0 and "logprobs" not in bodies[0]
    judge.close()


def test_router_combines_rule_and_remote_per_row_and_a_failed_source_fails_the_row(service):
    # the service scores "good" responses 1.0 and answers an error for the others
    s = service(lambda service, payload: (200, json.dumps({"results": [
        {"score": 1.0} if "good" in it["response"] else {"error": "cannot score"} for it in payload["items"]]}).encode()))
    cfg, _ = load_config(["task=gsm8k", "reward.workers=1", f"reward.remote.url={s.url}", "reward.remote.retries=0"],
                         cuda_available=False)
    rule = {**ROW, "reward_model": {"style": "rule", "ground_truth": "4"}}
    mixed = {**ROW, "reward_model": {"ground_truth": "4", "sources": {"rule": 0.75, "remote": 0.25, "model": None}}}
    batch = [verify_item(rule, "\\boxed{4}", cfg.reward),          # rule alone: the verifier's own result
             verify_item(mixed, "good \\boxed{5}", cfg.reward),    # 0.75 x 0 (wrong) + 0.25 x 1.0 = 0.25
             verify_item(mixed, "good \\boxed{4}", cfg.reward),    # 0.75 x 1 + 0.25 x 1.0 = 1.0
             verify_item(mixed, "bad \\boxed{4}", cfg.reward),     # the endpoint fails: the row fails
             verify_item(ROW, "good", cfg.reward)]                 # remote alone
    with make_pool(cfg.reward) as pool:
        results = pool.verify_batch(batch)
        stats = pool.pop_stats()
    assert [r.score for r in results[:3]] == [1.0, 0.25, 1.0]
    assert [r.correct for r in results[:3]] == [True, False, True]  # the rule's verdict decides
    assert results[1].info["sources"]["remote"] == {"score": 1.0, "weight": 0.25, "failed": False,
                                                   "reason": "scored by the remote endpoint"}
    assert results[3].failed and "no verdict from remote" in results[3].info["reason"]
    assert "cannot score" in results[3].info["reason"]
    assert results[4].score == 1.0 and not results[4].failed
    assert stats["verify/calls"] == 4 and stats["reward_source/remote/failed"] == 1
    assert stats["reward_source/remote/scored"] == 3 and stats["reward_source/remote/requests"] == 1
