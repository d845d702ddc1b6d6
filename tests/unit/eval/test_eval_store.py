"""The eval checkpoint (samples.jsonl), records of verified samples, and model-path resolution (no model loaded)."""
import json

import pyarrow.parquet as pq
import pytest

from reasonrl.eval.runner import (EvalError, outcome_of, problem_record, prompt_fingerprint, resolve_eval_model,
                                  table_row)
from reasonrl.eval.store import EvalStoreError, SampleStore
from reasonrl.rollout.base import Completion
from reasonrl.verifiers import VerifyResult

ROW = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+1?"}], "ability": "math",
       "reward_model": {"style": "rule", "ground_truth": "2"},
       "extra_info": {"split": "test", "index": 7, "level": 3, "subject": None}}


def _record(problem: int) -> dict:
    comps = [Completion([1, 2], "\\boxed{2}", [-0.1, -0.2], "stop"), Completion([3], "loop", [-1.0], "length")]
    results = [VerifyResult(1.0, True, {"extracted": "2", "reason": "equal"}),
               VerifyResult(0.0, False, {"timed_out": True, "reason": "timeout after 10s"})]
    return problem_record(problem, [10, 11, 12], ROW, comps, results)


def test_problem_record_marks_a_verification_timeout_as_incorrect():
    r = _record(0)
    assert r["problem"] == 0 and r["index"] == 7 and r["level"] == "3" and r["subject"] is None
    assert r["ground_truth"] == "2" and r["question"] == "1+1?"
    assert r["correct"] == [True, False] and r["timed_out"] == [False, True]
    assert r["extracted"] == ["2", None]  # a timed-out sample casts no maj@k vote
    assert r["reasons"] == ["equal", "timeout after 10s"]
    assert r["num_tokens"] == [2, 1] and r["finish_reasons"] == ["stop", "length"]
    assert r["prompt_sha"] == prompt_fingerprint([10, 11, 12]) != prompt_fingerprint([10, 11])


def test_a_sample_without_a_verdict_is_recorded_as_failed_and_incorrect():
    comps = [Completion([1], "x", [0.0], "stop"), Completion([2], "y", [0.0], "stop")]
    results = [VerifyResult.failure("verifier 'math' returned the non-finite score nan", extracted="7"),
               VerifyResult(1.0, True, {"extracted": "2"})]
    r = problem_record(0, [1], ROW, comps, results)
    assert r["failed"] == [True, False] and r["timed_out"] == [False, False]
    assert r["correct"] == [False, True] and r["scores"] == [0.0, 1.0] and r["extracted"] == [None, "2"]
    assert outcome_of(r).failed == [True, False]


def test_a_timeout_is_incorrect_even_if_the_result_claims_correct():
    comps = [Completion([1], "x", [0.0], "stop")]
    r = problem_record(0, [1], ROW, comps, [VerifyResult(1.0, True, {"timed_out": True})])
    assert r["correct"] == [False] and r["scores"] == [0.0] and r["reasons"] == ["timed out"]


def test_store_appends_reloads_and_drops_a_torn_last_line(tmp_path):
    store = SampleStore(str(tmp_path))
    store.append([_record(0), _record(1)])
    with open(store.samples_path, "a") as f:  # a crash in the middle of writing problem 2
        f.write(json.dumps(_record(2))[:40])
    loaded = SampleStore(str(tmp_path)).load()
    assert sorted(loaded) == [0, 1]
    assert loaded[1] == _record(1)
    # The torn bytes are cut off, so the next append starts on a clean line.
    store.append([_record(2)])
    assert sorted(SampleStore(str(tmp_path)).load()) == [0, 1, 2]


def test_store_refuses_samples_made_with_other_settings(tmp_path):
    store = SampleStore(str(tmp_path))
    store.check_settings({"n": 4, "temperature": 1.0})
    store.append([_record(0)])
    store.check_settings({"n": 4, "temperature": 1.0})  # same settings: resume is fine
    with pytest.raises(EvalStoreError, match="temperature"):
        store.check_settings({"n": 4, "temperature": 0.7})


def test_table_row_and_parquet(tmp_path):
    row = table_row(_record(0), [1, 2])
    # n=2, c=1: pass@1 = 1/2, pass@2 = 1; the only vote is "2" (correct) -> maj@1 = maj@2 = 1.
    assert row["num_correct"] == 1 and row["pass@1"] == 0.5 and row["pass@2"] == 1.0
    assert row["majority_answer"] == "2" and row["maj@1"] == 1.0 and row["maj@2"] == 1.0
    path = SampleStore(str(tmp_path)).write_parquet([row, table_row(_record(1), [1, 2])])
    schema = pq.read_schema(path)
    # subject is None in every row: stored as a string column, not arrow's null type.
    assert str(schema.field("subject").type) == "string"
    table = pq.read_table(path).to_pylist()
    assert [t["problem"] for t in table] == [0, 1]
    assert table[0]["extracted"] == ["2", None] and table[0]["timed_out"] == [False, True]


def test_checkpoint_and_run_directories_resolve_to_their_hf_export(tmp_path):
    model = tmp_path / "plain"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert resolve_eval_model(str(model)) == str(model)
    for step in ("step_000010", "step_000020", "step_000030.tmp"):  # .tmp: a checkpoint still being written
        (tmp_path / "run" / "checkpoints" / step / "hf").mkdir(parents=True)
        (tmp_path / "run" / "checkpoints" / step / "hf" / "config.json").write_text("{}")
    ckpt = tmp_path / "run" / "checkpoints" / "step_000010"
    assert resolve_eval_model(str(ckpt)) == str(ckpt / "hf")
    assert resolve_eval_model(str(tmp_path / "run")) == str(tmp_path / "run" / "checkpoints" / "step_000020" / "hf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalError, match="config.json"):
        resolve_eval_model(str(tmp_path / "empty"))


def test_command_reports_bad_input_clearly(tmp_path, monkeypatch, capsys, data_dir):
    """Bad input ends with exit status 2 and one line naming the problem, before any model is loaded."""
    from reasonrl.eval import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("REASONRL_DATA_DIR", str(data_dir))
    out = f"eval.output_dir={tmp_path}"
    assert main(["task=gsm8k", f"model.path={tmp_path}/missing-model", out]) == 2
    err = capsys.readouterr().err
    assert f"model.path={tmp_path}/missing-model" in err and err.count("\n") == 1, err
    assert main(["task=gsm8k", "eval.n=2", "eval.k=[4]", out]) == 2  # k > n
    assert "eval.k" in capsys.readouterr().err
    assert main(["task=gsm8k", "eval.n=2", "eval.temperature=0", out]) == 2  # greedy cannot give 2 samples
    assert "eval.temperature" in capsys.readouterr().err
