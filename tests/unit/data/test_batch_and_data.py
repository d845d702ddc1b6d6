"""Batch container, rollout collation, the epoch sampler and the data lookup order."""
import dataclasses
import json

import pytest
import torch

from reasonrl.data import Batch, EpochSampler
from reasonrl.data.collate import collate_rollout
from reasonrl.datasets import DataError, read_rows, task_files, write_parquet
from reasonrl.datasets.gsm8k import gold_answer


def test_batch_chunk_concat_round_trip():
    b = Batch({"x": torch.arange(6).view(6, 1)}, {"t": list("abcdef")})
    parts = b.chunk(3)
    assert [p["t"] for p in parts] == [["a", "b"], ["c", "d"], ["e", "f"]]
    again = Batch.concat(parts)
    assert torch.equal(again["x"], b["x"]) and again["t"] == b["t"]
    with pytest.raises(ValueError):
        b.chunk(4)  # 6 rows do not split evenly into 4: ranks must get equal work


def test_collate_layout():
    # prompt [1,2] and [3]; responses [7,8,9] and [5]; pad 0 -> P=2, T=3
    b = collate_rollout([[1, 2], [3]], [[7, 8, 9], [5]], [[-1.0, -2.0, -3.0], [-0.5]], pad_id=0)
    assert b["input_ids"].tolist() == [[1, 2, 7, 8, 9], [0, 3, 5, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    # positions = cumsum(attention) - 1, clamped at 0: row 2 is cumsum [0,1,2,2,2] - 1 -> [0,0,1,1,1]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 1, 1]]
    assert b["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["rollout_log_probs"].tolist() == [[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]]


def test_epoch_sampler_resumes_with_same_order():
    a = EpochSampler(10, 4, seed=3)
    first = [a.next_indices() for _ in range(2)]
    state = a.state_dict()
    rest = [a.next_indices() for _ in range(3)]
    b = EpochSampler(10, 4, seed=3)
    b.load_state_dict(state)
    assert [b.next_indices() for _ in range(3)] == rest
    assert all(len(x) == 4 for x in first + rest)
    assert state == {"epoch": 0, "offset": 8}
    assert b.epoch == 2  # 10 prompts, batches of 4: a new epoch starts every 2 batches (tail of 2 dropped)


def test_gsm8k_gold_answer():
    assert gold_answer("... so 3 + 4 = 7\n#### 1,000") == "1000"


def test_lookup_order_env_data_dir_then_cache(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REASONRL_DATA_DIR", str(data_dir))
    files = task_files("gsm8k", "val")
    assert files == [str(tmp_path / "cache" / "data" / "gsm8k" / "test.parquet")]
    rows = read_rows(files[0])
    assert len(rows) == 1319 and rows[0]["reward_model"]["ground_truth"] == "18"
    # Once prepared, the cache is used even without the data dir.
    monkeypatch.delenv("REASONRL_DATA_DIR")
    assert task_files("gsm8k", "val") == files


def test_no_data_offline_names_the_prepare_command(tmp_path, monkeypatch):
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REASONRL_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as err:
        task_files("gsm8k", "train")
    assert "python -m reasonrl.datasets.prepare gsm8k" in str(err.value)


def test_broken_row_fails_with_its_index(tmp_path):
    good = {"data_source": "x", "prompt": [{"role": "user", "content": "hi"}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": 0}}
    path = tmp_path / "d.jsonl"
    bad = dict(good, prompt="just a string")
    path.write_text("\n".join(json.dumps(r) for r in [good, good, bad]))
    with pytest.raises(DataError, match="row 2"):
        read_rows(str(path))
    with pytest.raises(DataError, match="row 1"):
        write_parquet([good, dict(good, reward_model={"style": "rule"})], tmp_path / "x.parquet")


def test_arith_test_split_is_held_out_from_train():
    """The generated task's test problems never occur in train (a fixed fifth of the 1,800-problem space is kept
    for test) and are distinct, so held-out accuracy is not recall of training prompts."""
    from reasonrl.datasets import arith

    question = lambda row: row["prompt"][0]["content"]  # noqa: E731
    train, test = arith.build_rows("train"), arith.build_rows("test")
    assert len(train) == arith.SIZES["train"] and len(test) == arith.SIZES["test"]
    assert not {question(r) for r in train} & {question(r) for r in test}
    assert len({question(r) for r in test}) == len(test)
    # e.g. 5 + 10: (5 * 31 + 10) * 2 + 0 = 330, divisible by 5 -> held out; 5 + 11: 332 -> train
    assert arith.held_out(5, 10, "+") and not arith.held_out(5, 11, "+")
    assert all(arith.held_out(*map(int, q.split("What is ")[1].split("?")[0].split()[::2]),
                             q.split()[3]) for q in map(question, test))
    assert [question(r) for r in test] == [question(r) for r in arith.build_rows("test")]  # deterministic


def test_batch_plan_derives_every_size_once():
    from reasonrl.config import load_config
    from reasonrl.config.batch_plan import BatchPlan

    cfg, _ = load_config(["data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=4", "actor.ppo_epochs=2",
                          "actor.micro_batch_size_per_worker=3", "trainer.profile=none"], cuda_available=False)
    plan = BatchPlan.from_config(cfg, world_size=2)
    plan.check()
    # 8 prompts x 4 = 32 responses; mini-batches of 4 prompts = 16 responses, 8 per worker; 8 / 3 -> 3 micro-batches;
    # 8 / 4 = 2 mini-batches per pass x 2 epochs = 4 optimizer steps.
    assert dict(plan.table()) == {
        "prompts per step (data.train_batch_size)": 8, "samples per prompt (rollout.n)": 4, "responses per step": 32,
        "workers (data-parallel ranks)": 2, "prompts per worker per step": 4,
        "mini-batches per step (optimizer steps x ppo_epochs)": 4, "responses per mini-batch": 16,
        "responses per mini-batch per worker": 8, "micro-batches per mini-batch per worker": 3}
    # A worker's share of 16 rows (the full plan) is 16 x 2 / 16 = 2 mini-batches; dynamic sampling leaving it 8
    # rows gives 1; a share smaller than one mini-batch (3 rows: 6 / 16 = 0) still trains as 1.
    assert [plan.mini_batches_for(rows) for rows in (16, 8, 3)] == [2, 1, 1]
    # No mini-batch size: the whole step is one mini-batch (8 prompts x 4 = 32 responses).
    whole, _ = load_config(["data.train_batch_size=8", "rollout.n=4", "trainer.profile=none"], cuda_available=False)
    assert BatchPlan.from_config(whole, 1).responses_per_mini_batch == 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.world_size = 4


def test_batch_plan_refuses_uneven_splits():
    from reasonrl.config.batch_plan import BatchPlan

    # 6 prompts over 4 workers: the table shows 6/4! and check names data.train_batch_size.
    uneven = BatchPlan(prompts_per_step=6, samples_per_prompt=2, world_size=4, mini_batch_prompts=6, ppo_epochs=1,
                       micro_batch_rows=2)
    assert dict(uneven.table())["prompts per worker per step"] == "6/4!"
    with pytest.raises(ValueError, match="data.train_batch_size=6"):
        uneven.check()
    # 8 prompts split evenly, but a mini-batch of 3 prompts x 1 sample = 3 responses does not split over 2 workers.
    with pytest.raises(ValueError, match="ppo_mini_batch_size x rollout.n = 3"):
        BatchPlan(prompts_per_step=8, samples_per_prompt=1, world_size=2, mini_batch_prompts=3, ppo_epochs=1,
                  micro_batch_rows=2).check()
