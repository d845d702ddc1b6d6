"""trainer.mode=async on CPU with Ray: one RolloutWorker (hf engine) and one engine-less actor worker, gloo transfer.

The arith task at tiny sizes (2 prompts x 2 samples x 8 tokens) on conftest's ``tiny_policy`` (a random 2-layer Llama
with SmolLM2's tokenizer): staleness, weight versions, resume and crash handling are plumbing. The real SmolLM2 runs
the tool loop (its turns can call the tool). An entropy bonus makes every update move the weights even when all
rewards are equal, so "the engine holds the actor's weights" cannot pass by leaving both untouched; at the random
model's near-uniform log-probs one step of lr 1e-4 moved them by 7e-4 at most (less than the 1e-3 the checks below
need), so the actor trains at lr 1e-3.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import cpu_worker_plan, ray_trainer, read_jsonl

from reasonrl.workers import weight_transfer


TINY = ["task=arith", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=4", "reward.workers=1", "trainer.logger=[jsonl]", "trainer.mode=async",
        "algorithm.use_kl_loss=false", "algorithm.entropy_coef=0.01", "actor.lr=1e-3", "trainer.ray_address=local",
        "rollout.stream_chunk_prompts=1", "trainer.log_samples_every=1"]


def make_trainer(policy, args):
    return ray_trainer(TINY, policy, args)


def prompts_by_step(run_dir: Path):
    out = {}
    for row in read_jsonl(run_dir / "samples.jsonl"):
        out.setdefault(row["step"], set()).add(row["prompt"])
    return out


@pytest.fixture(scope="module")
def async_run(tmp_path_factory, ray_session, tiny_policy):
    """Three async steps, checkpoints at 2 and 3; the trainer stays open for the weight checks."""
    out = tmp_path_factory.mktemp("async") / "run"
    trainer = make_trainer(tiny_policy, ["trainer.total_steps=3", "trainer.save_every=2", f"trainer.output_dir={out}"])
    try:
        trainer.fit()
        yield trainer, out
    finally:
        trainer.close()


def test_tis_is_on_by_default_in_async_mode():
    from reasonrl.config import load_config

    def correction(args):
        off = load_config(args, cuda_available=False)[0].algorithm.off_policy
        return off.correction, off.level

    assert correction(TINY) == ("tis", "token")
    assert correction(TINY + ["algorithm.off_policy.correction=none"])[0] == "none"
    assert correction(["rollout.engine=hf"])[0] == "none"  # colocated


def test_pack_unpack_and_bucket_plans_agree():
    tensors = [("b", torch.ones(5, dtype=torch.bfloat16)), ("a", torch.arange(6.0).reshape(3, 2)),
               ("c", torch.full((4,), 7.0)), ("d", torch.arange(3, dtype=torch.int64))]
    specs = [weight_transfer.ParamSpec(n, tuple(t.shape), str(t.dtype).replace("torch.", "")) for n, t in tensors]
    # 40-byte buckets, cut by iter_buckets: b (10 B) + a (24 B) = 34 fit; + c (16 B) = 50 does not, so c starts the
    # next bucket; c + d (24 B) = 40 fit.
    plan = [[s.name for s in bucket] for bucket in weight_transfer.spec_buckets(specs, 40)]
    assert plan == [["b", "a"], ["c", "d"]]
    by_name = dict(tensors)
    for bucket in weight_transfer.spec_buckets(specs, 40):
        buffer = weight_transfer.pack([(s.name, by_name[s.name]) for s in bucket])
        # b is padded to 16 B so the float32 a starts at an aligned offset (16 + 32 = 48 B; c + d: 16 + 32 = 48 B)
        assert buffer.numel() == weight_transfer.packed_size(bucket) == 48
        for name, view in weight_transfer.unpack(buffer, bucket):
            assert view.dtype == by_name[name].dtype and torch.equal(view, by_name[name])


@pytest.mark.slow
def test_staleness_is_one_step_and_never_above_the_bound(async_run):
    _, out = async_run
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # step 1 trains on the base model's batch; later batches were generated while the previous step trained
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["async/weights_version"] for r in rows] == [0.0, 0.0, 1.0]
    for r in rows:
        assert r["weight_sync/bytes"] > 0 and r["timing_s/weight_sync"] > 0
    # TIS sees it too: the engine's log-probs match the actor's on the fresh batch, not on the stale one
    diffs = [r["rollout/logprob_diff_max"] for r in rows]
    assert diffs[0] < 1e-3 < diffs[1], diffs


@pytest.mark.slow
def test_engine_holds_the_actor_weights_of_its_version(async_run, tiny_policy):
    from transformers import AutoModelForCausalLM

    from reasonrl.data.collate import collate_rollout

    trainer, out = async_run
    assert trainer.source.rollouts.weights_version() == [3]  # synced after the third update
    tok = trainer.tokenizer
    prompt, response = tok("Question: what is 2+2?")["input_ids"], tok(" It is 4, I am sure.")["input_ids"]
    engine_lp = torch.tensor(trainer.source.rollouts.sequence_logprobs([prompt], [response])[0])
    batch = collate_rollout([prompt], [response], [[0.0] * len(response)], tok.pad_token_id)
    actor_lp = trainer.workers.compute_log_probs(batch)["old_log_probs"][0][batch["response_mask"][0].bool()]
    base = AutoModelForCausalLM.from_pretrained(tiny_policy, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = base(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    base_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
    moved = (actor_lp - base_lp).abs().max()
    assert moved > 1e-3, "three updates left the actor where it started: the comparison below would prove nothing"
    assert (engine_lp - actor_lp).abs().max() < 1e-4 * max(1.0, float(moved) * 10)
    # and the checkpoint of step 3 (the actor of version 3) is what the engine holds, tensor for tensor
    exported = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_000003" / "hf")
    with torch.no_grad():
        logits = exported(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    exported_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
    assert (engine_lp - exported_lp).abs().max() < 1e-4


VOLATILE = ("timing_s/", "startup_s/", "perf/", "verify/", "async/generate_s", "async/verify_tail_s")
"""Keys a resumed step need not repeat: wall-clock figures, and the verifier pool's counters (``verify/*``), which count
the calls collected since the previous step's metrics: the straight run verifies step 3's batch during step 2 or 3,
whichever its background round finishes in, and the resumed run not at all (the batch comes back verified)."""


@pytest.mark.slow
def test_resume_is_exact_from_the_rounds_in_flight(async_run, tiny_policy, tmp_path):
    """The checkpoint of step 2 holds the batch of step 3, already generated (with the weights of step 1) and
    verified: resumed from it, step 3 trains on those very responses and ends where the straight run ended."""
    trainer, out = async_run
    state2 = json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    state3 = json.loads((out / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    # 2 prompts per batch: at the save of step 2 the batch of step 3 was drawn (offset 6) and is in the checkpoint
    assert state2["step"] == 2 and state2["sampler"] == {"epoch": 0, "offset": 6}
    assert (out / "checkpoints" / "step_000002" / "pending_rounds.pkl").exists()
    assert state3["step"] == 3 and state3["sampler"] == {"epoch": 0, "offset": 6}
    trainer.close()  # one actor + one rollout worker at a time on this machine

    again = tmp_path / "resumed"
    resumed = make_trainer(tiny_policy, ["trainer.total_steps=3", f"trainer.output_dir={again}",
                            f"trainer.resume={out / 'checkpoints' / 'step_000002'}"])
    try:
        assert resumed.step == 2
        assert resumed.source.rollouts.weights_version() == [2]  # the engines got the resumed weights first
        resumed.fit()
    finally:
        resumed.close()

    def step3(run_dir):
        row = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r["step"] == 3)
        return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}

    assert [r["step"] for r in read_jsonl(again / "metrics.jsonl")] == [3]
    assert step3(again) == step3(out)  # same batch, staleness and version, same update
    assert step3(again)["async/weights_version"] == 1.0
    samples = [[r for r in read_jsonl(d / "samples.jsonl") if r["step"] == 3] for d in (out, again)]
    assert samples[0] == samples[1] and samples[0]
    first = prompts_by_step(out)
    assert first[3] != first[2]


@pytest.mark.slow
def test_a_crashed_rollout_worker_is_a_clear_error(tmp_path, ray_session, tiny_policy, monkeypatch):
    from reasonrl import fault_points
    from reasonrl.controller.worker_group import RolloutWorkerError

    # The 3rd generation started is the batch of step 3 (1st: step 1, 2nd: step 2): the worker is killed before it,
    # while step 2 trains
    monkeypatch.setenv(fault_points.ENV, "rollout0.generate_stream#3=sigkill")
    monkeypatch.setattr(fault_points, "_hits", fault_points.Counter())
    trainer = make_trainer(tiny_policy, ["trainer.total_steps=4", "trainer.save_every=0",
                                         f"trainer.output_dir={tmp_path}"])
    try:
        with pytest.raises(RolloutWorkerError, match="RolloutWorker rank 0 failed while"):
            trainer.fit()
        assert trainer.step == 1  # step 2 could not sync its weights to the dead worker
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize("worker", ["RolloutWorker", "ActorRolloutRefWorker"])
def test_streamed_rounds_equal_one_generate_call(worker, ray_session, tiny_policy):
    """Greedy, so both ways sample the same responses: streamed sub-batches come back in the same row order, each
    with its own verifier result (the async mode's RolloutWorker and the colocated worker, on Ray, with the real math
    verifier)."""
    from reasonrl.config import load_config, to_dict
    from reasonrl.controller import WorkerGroup, start_ray
    from reasonrl.data import PromptDataset
    from reasonrl.datasets import task_files
    from reasonrl.models import load_tokenizer
    from reasonrl.rewards import make_pool
    from reasonrl.trainer.metrics import PhaseTimer
    from reasonrl.trainer.streaming import generate_and_verify
    from reasonrl.workers.rollout_worker import RolloutWorker

    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    colocated = worker == "ActorRolloutRefWorker"
    cfg, _ = load_config([a for a in TINY if not (colocated and a == "trainer.mode=async")], cuda_available=False)
    data = PromptDataset(task_files("arith", "train", None), load_tokenizer(tiny_policy), 256)
    prompts = [data[i] for i in range(3)]
    greedy = {"n": 2, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 8, "logprobs": False}
    start_ray("local", num_cpus=4)
    group = WorkerGroup(ActorRolloutRefWorker if colocated else RolloutWorker, 1, False, 1,
                        {"config": to_dict(cfg), "model_path": tiny_policy, "plan": cpu_worker_plan(cfg)})
    rounds = {}
    try:
        with make_pool(cfg.reward) as pool:
            for chunk in (0, 1):
                timer = PhaseTimer()
                samples = generate_and_verify(group, prompts, greedy, pool, cfg.reward, chunk, timer)
                rounds[chunk] = ([s.prompt_ids for s in samples], [s.response_text for s in samples],
                                 [s.result.info.get("reason") for s in samples], [s.group for s in samples])
                assert set(timer.seconds) == {"rollout", "verify"}
    finally:
        group.shutdown()
    assert rounds[0] == rounds[1]
    assert rounds[1][0] == [list(p.token_ids) for p in prompts for _ in range(2)]
    assert rounds[1][3] == [0, 0, 1, 1, 2, 2]  # each response knows its prompt's group


@pytest.mark.slow
def test_a_groups_worker_env_reaches_its_workers_in_a_ray_started_before(ray_session, monkeypatch):
    """A shared GPU's allocator setting goes to each WorkerGroup's workers, not to Ray's job: a Ray session that was
    up before the run (started here without the variable) still gives the workers the group's value, beside the job's
    own variables and the group's thread count."""
    from reasonrl.controller import WorkerGroup, start_ray

    class EnvProbe:  # defined here, so Ray ships it by value (the workers cannot import this test module)
        """Reports its process's environment (WorkerGroup's constructor arguments are ignored)."""

        def __init__(self, **_):
            pass

        def env(self, names):
            import os

            return {n: os.environ.get(n) for n in names}

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    start_ray("local", num_cpus=4)  # no-op if this module's trainers started it: either way, before the group
    names = ["PYTORCH_CUDA_ALLOC_CONF", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS"]
    with_env = WorkerGroup(EnvProbe, 1, False, 1, {}, worker_env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    without = WorkerGroup(EnvProbe, 1, False, 1, {})
    try:
        import ray

        seen, plain = ray.get([with_env.workers[0].env.remote(names), without.workers[0].env.remote(names)])
    finally:
        with_env.shutdown()
        without.shutdown()
    assert seen == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TOKENIZERS_PARALLELISM": "false",
                    "OMP_NUM_THREADS": "1"}
    assert plain["PYTORCH_CUDA_ALLOC_CONF"] is None and plain["OMP_NUM_THREADS"] == "1"


@pytest.mark.slow
def test_async_rollout_worker_runs_the_tool_loop(model_path):
    """task=math_tool in async mode: the RolloutWorker generates through the multi-turn tool loop (its rows carry the
    tool mask and counts the trainer's loss mask and tool metrics need), not through the bare engine."""
    from reasonrl.config import load_config, to_dict
    from reasonrl.data import PromptDataset
    from reasonrl.datasets import task_files
    from reasonrl.models import load_tokenizer
    from reasonrl.rollout.multiturn import ToolRollout
    from reasonrl.trainer.streaming import prompt_batch
    from reasonrl.workers.rollout_worker import RolloutWorker

    cfg, _ = load_config(["task=math_tool", "trainer.mode=async", "rollout.engine=hf", "tool.sandbox=bwrap",
                          "rollout.max_new_tokens=16"], cuda_available=False)
    worker = RolloutWorker(to_dict(cfg), model_path, rank=0, world_size=1, plan=cpu_worker_plan(cfg))
    try:
        assert isinstance(worker.host.generator, ToolRollout)
        data = PromptDataset(task_files("math_tool", "train", None), load_tokenizer(model_path), 384)
        sampling = {"n": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 16, "logprobs": True}
        samples = worker.generate(prompt_batch([data[0]]), sampling)
    finally:
        worker.host.generator.close()
    assert len(samples) == 2 and [s.weights_version for s in samples] == [0, 0]
    assert [s.group for s in samples] == [0, 0]
    assert all(s.tools is not None and s.tools.turns >= 1 and s.env is not None for s in samples)
    assert [len(s.tool_mask) for s in samples] == [len(s.response_ids) for s in samples]


@pytest.mark.slow
def test_a_threaded_replica_drives_its_engine_from_the_one_thread_that_built_it(tiny_policy, ray_session):
    """A replica with ``rollout.partial`` is a threaded Ray actor (``max_concurrency=2``), whose calls Ray runs on a
    pool of threads, not the one ``__init__`` ran on, taking turns even for calls made one at a time. vLLM driven
    from two threads faulted on a GPU (``reasonrl/workers/engine_thread.py``), so every engine call, generation and
    weight load alike, must run on the thread that built the engine: here four generate calls in a row (two-token
    segments, so each is several engine calls) and a weight load, each engine call recording its thread."""
    import threading

    import ray
    from transformers import AutoModelForCausalLM

    from reasonrl.config import load_config, to_dict
    from reasonrl.controller import WorkerGroup, start_ray
    from reasonrl.data.batch import Batch
    from reasonrl.workers.published_weights import pack
    from reasonrl.workers.rollout_worker import RolloutWorker

    class EngineThreadProbe(RolloutWorker):  # defined here, so Ray ships it by value
        """RolloutWorker recording the thread of every engine call, and the thread that built the engine."""

        def _build_engine(self, num_threads):
            self.built_on = threading.get_ident()
            engine = super()._build_engine(num_threads)
            self.engine_calls = []
            for name in ("generate", "update_weights"):
                real = getattr(engine, name)

                def recorded(*args, _real=real, _name=name, **kwargs):
                    self.engine_calls.append((_name, threading.get_ident()))
                    return _real(*args, **kwargs)

                setattr(engine, name, recorded)
            return engine

        def threads(self):
            return self.built_on, self.engine_thread.ident, self.engine_calls

        def caller(self):
            return threading.get_ident()

    cfg, _ = load_config(["task=arith", "trainer.mode=async", "fleet.enabled=true", "fleet.continuous=true",
                          "rollout.partial=true", "rollout.partial_segment_tokens=2", "rollout.engine=hf",
                          f"model.path={tiny_policy}"], cuda_available=False)
    start_ray("local", num_cpus=4)
    group = WorkerGroup(EngineThreadProbe, 1, False, 1, {"config": to_dict(cfg), "model_path": tiny_policy,
                                                         "plan": cpu_worker_plan(cfg)}, max_concurrency=2)
    try:
        replica = group.workers[0]
        prompt = [1, 2, 3, 4]
        batch = Batch(meta={"prompt_ids": [prompt], "groups": [0]})
        greedy = {"n": 1, "max_new_tokens": 6, "temperature": 0.0, "logprobs": True}
        outs = [ray.get(replica.generate.remote(batch, greedy)) for _ in range(4)]
        model = AutoModelForCausalLM.from_pretrained(tiny_policy, torch_dtype=torch.float32)
        ray.get(replica.load_published.remote(pack([(n, t.detach()) for n, t in model.named_parameters()]), 1))
        built_on, engine_thread, calls = ray.get(replica.threads.remote())
        callers = set(ray.get([replica.caller.remote() for _ in range(4)]))
    finally:
        group.shutdown()
    assert all(len(o[0].response_ids) == 6 for o in outs)
    assert built_on == engine_thread
    kinds = [name for name, _ in calls]
    assert kinds.count("generate") == 4 * 3 and "update_weights" in kinds  # 3 segments of 2 tokens per call
    assert {ident for _, ident in calls} == {engine_thread}
    assert engine_thread not in callers  # the premise: Ray's calls arrive on other threads
