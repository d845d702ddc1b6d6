"""Bad data files and model ids end the train and eval commands with one line naming the problem and exit 2 —
before Ray or a model starts, never a traceback."""
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

GOOD = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2+2?"}], "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"split": "train", "index": 0}}


def _parquet(path, rows, schema=None):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def _bad_files(tmp_path):
    """name -> (file, words the message must contain)"""
    no_column = {k: v for k, v in GOOD.items() if k != "ability"}
    no_truth = dict(GOOD, reward_model={"style": "rule", "ground_truth": None})
    empty_truth = dict(GOOD, reward_model={"style": "rule", "ground_truth": "  "})
    unknown_source = dict(GOOD, data_source="mystery/source")
    unknown_verifier = dict(GOOD, verifier="no_such_verifier")
    empty_prompt = dict(GOOD, prompt=[])
    empty_content = dict(GOOD, prompt=[{"role": "user", "content": "  "}])
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("this is a text file, not parquet\n")
    empty_file = tmp_path / "empty.parquet"
    empty_file.write_bytes(b"")
    zero_rows = _parquet(tmp_path / "zero.parquet", [], pa.Table.from_pylist([GOOD]).schema)
    return {
        "missing_column": (_parquet(tmp_path / "a.parquet", [no_column]), "missing column(s) ability"),
        "missing_ground_truth": (_parquet(tmp_path / "b.parquet", [no_truth]), "ground_truth"),
        "empty_prompt_list": (_parquet(tmp_path / "c.parquet", [empty_prompt]), "non-empty list"),
        "empty_content": (_parquet(tmp_path / "d.parquet", [GOOD, empty_content]),
                          "row 1: prompt message 0 has an empty"),
        "not_parquet": (not_parquet, "cannot read parquet"),
        "empty_file": (empty_file, "cannot read parquet"),
        "zero_rows": (zero_rows, "no rows"),
        "empty_ground_truth": (_parquet(tmp_path / "e.parquet", [GOOD, empty_truth]),
                               "row 1: 'reward_model.ground_truth' is empty"),
        "unknown_data_source": (_parquet(tmp_path / "f.parquet", [GOOD, unknown_source]),
                                "row 1: no verifier for data_source 'mystery/source'"),
        # pyarrow takes the columns from the first row: the row with a verifier column comes first
        "unknown_verifier": (_parquet(tmp_path / "g.parquet", [unknown_verifier, GOOD]),
                             "row 0 (data_source 'openai/gsm8k') names the verifier 'no_such_verifier', which is "
                             "not registered"),
    }


CASES = ["missing_column", "missing_ground_truth", "empty_prompt_list", "empty_content", "not_parquet", "empty_file",
         "zero_rows", "empty_ground_truth", "unknown_data_source", "unknown_verifier"]
NAMED_FILE = {"unknown_data_source": False, "unknown_verifier": False}  # named by split and row, not by file


@pytest.mark.parametrize("case", CASES)
def test_train_names_the_bad_data_file(tmp_path, case, capsys, model_path):
    from reasonrl.train import main

    path, words = _bad_files(tmp_path)[case]
    status = main(["rollout.engine=hf", f"data.train_files=[{path}]", f"trainer.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and (str(path) in err[0] or not NAMED_FILE.get(case, True)) and words in err[0], err
    import ray

    assert not ray.is_initialized()  # the data was checked before Ray started


@pytest.mark.parametrize("case", CASES)
def test_eval_names_the_bad_data_file(tmp_path, case, capsys, model_path):
    from reasonrl.eval.cli import main

    path, words = _bad_files(tmp_path)[case]
    status = main(["rollout.engine=hf", f"data.val_files=[{path}]", f"eval.output_dir={tmp_path / 'eval'}"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("INFO")]
    assert status == 2
    assert len(err) == 1 and (str(path) in err[0] or not NAMED_FILE.get(case, True)) and words in err[0], err


def test_zero_rows_are_not_blamed_on_prompt_length(tmp_path, capsys, model_path):
    from reasonrl.train import main

    path, _ = _bad_files(tmp_path)["zero_rows"]
    assert main(["rollout.engine=hf", f"data.train_files=[{path}]", f"trainer.output_dir={tmp_path}"]) == 2
    assert "max_prompt_length" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["reasonrl.train", "reasonrl.eval"])
def test_unknown_hub_id_offline_is_one_line_naming_it(tmp_path, command):
    proc = subprocess.run([sys.executable, "-m", command, "rollout.engine=hf", "model.path=nobody/no-such-model",
                           f"trainer.output_dir={tmp_path / 'run'}", f"eval.output_dir={tmp_path / 'eval'}"],
                          capture_output=True, text=True, timeout=300, env=dict(__import__("os").environ,
                                                                               HF_HUB_OFFLINE="1"))
    err = [line for line in proc.stderr.strip().splitlines() if not line.startswith("INFO")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(err) == 1 and "nobody/no-such-model" in err[0] and "HF_HUB_OFFLINE" in err[0], err


@pytest.mark.parametrize("args, words", [
    (["rollout.max_new_tokens=9000"], "config key 'rollout.max_new_tokens': data.max_prompt_length (384) + "
                                      "rollout.max_new_tokens (9000) = 9384 exceeds the model's context of 8192"),
    (["actor.betas=[0.9]"], "config key 'actor.betas': must be two numbers"),
    (["reward.score_range=[1.0,0.0]"], "config key 'reward.score_range': must be two finite numbers"),
])
def test_train_refuses_settings_the_model_or_optimizer_cannot_take(tmp_path, capsys, model_path, args, words):
    from reasonrl.train import main

    status = main(["rollout.engine=hf", f"trainer.output_dir={tmp_path / 'run'}", *args])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("reasonrl:")]
    assert status == 2
    assert len(err) == 1 and words in err[0], err
    import ray

    assert not ray.is_initialized()


@pytest.mark.parametrize("args, words", [
    (["reward.remote.url=http://127.0.0.1:9/score", "reward.remote.api_key_env=REASONRL_TEST_UNSET_KEY"],
     "config key 'reward.remote.api_key_env': names the environment variable REASONRL_TEST_UNSET_KEY, which is not "
     "set"),
    (["reward.judge.url=http://127.0.0.1:9/v1", "reward.judge.model=j",
      "reward.judge.api_key_env=REASONRL_TEST_EMPTY_KEY"],
     "config key 'reward.judge.api_key_env': names the environment variable REASONRL_TEST_EMPTY_KEY, which is not set "
     "(or is empty)"),
    (["actor.lora.rank=8", "actor.lora.target_modules=[q_proj,qkv_proj]"],
     "config key 'actor.lora.target_modules': qkv_proj not in LlamaForCausalLM's decoder layers; candidates: "
     "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    (["actor.lora.target_modules=[q_proj]"],
     "config key 'actor.lora.rank': is 0 (LoRA off: the whole actor would train), but actor.lora.target_modules="),
], ids=["remote_key_unset", "judge_key_empty", "lora_target_unknown", "lora_targets_with_rank_0"])
def test_train_refuses_late_failing_settings_before_anything_starts(tmp_path, capsys, monkeypatch, model_path, args,
                                                                    words):
    """Each used to fail 50 s in, after Ray and the workers (an unset key, an unknown LoRA target) or never (rank 0
    with targets trained the whole actor); now one line naming the keys, exit 2, before Ray. A key's value (the
    remote's, set here) is never printed."""
    from reasonrl.train import main

    monkeypatch.delenv("REASONRL_TEST_UNSET_KEY", raising=False)
    monkeypatch.setenv("REASONRL_TEST_EMPTY_KEY", "")
    monkeypatch.setenv("REASONRL_TEST_SET_KEY", "sk-test-value-never-printed")
    extra = ["reward.remote.url=http://127.0.0.1:9/score", "reward.remote.api_key_env=REASONRL_TEST_SET_KEY"] \
        if "judge" in args[0] else []  # a set key besides the missing one: its value must not leak
    status = main(["rollout.engine=hf", f"trainer.output_dir={tmp_path / 'run'}", *extra, *args])
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.startswith("reasonrl:")]
    assert status == 2
    assert len(lines) == 1 and words in lines[0], lines
    assert "sk-test-value-never-printed" not in out + err
    import ray

    assert not ray.is_initialized()


@pytest.mark.parametrize("arg, words", [
    ("data.train_files=[{tmp}/no_such_train.parquet]", "error: data.train_files: {tmp}/no_such_train.parquet does not "
                                                       "exist"),
    ("model.path={tmp}/no_such_model", "error: model.path: {tmp}/no_such_model does not exist"),
    ("trainer.logger=[console,tensorbord]", "error: trainer.logger: unknown logger 'tensorbord'"),
])
def test_a_path_or_name_that_is_not_there_exits_2_before_the_config_table(tmp_path, capsys, arg, words):
    from reasonrl.train import main

    status = main(["rollout.engine=hf", f"trainer.output_dir={tmp_path / 'run'}", arg.format(tmp=tmp_path)])
    out = capsys.readouterr()
    assert status == 2  # bad input, as every other bad input (not 3: a missing component)
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"reasonrl: {words.format(tmp=tmp_path)}. Fix: "), err
    assert "effective config" not in out.out  # the error is not buried above the config table


@pytest.mark.parametrize("arg, words", [("task=gms8k", "unknown task 'gms8k' (did you mean 'gsm8k'?)"),
                                        ("algorithm=grop", "unknown algorithm 'grop' (did you mean 'grpo'?)"),
                                        ("task=zzz", "unknown task 'zzz'; known:")])
def test_a_misspelled_task_or_algorithm_gets_a_suggestion(capsys, arg, words):
    from reasonrl.train import main

    assert main([arg]) == 2
    err = capsys.readouterr().err
    assert words in err and ("did you mean" in words or "did you mean" not in err), err
