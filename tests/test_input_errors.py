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
    }


CASES = ["missing_column", "missing_ground_truth", "empty_prompt_list", "empty_content", "not_parquet", "empty_file",
         "zero_rows"]


@pytest.mark.parametrize("case", CASES)
def test_train_names_the_bad_data_file(tmp_path, case, capsys, model_path):
    from reasonrl.train import main

    path, words = _bad_files(tmp_path)[case]
    status = main(["rollout.engine=hf", f"data.train_files=[{path}]", f"trainer.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and str(path) in err[0] and words in err[0], err
    import ray

    assert not ray.is_initialized()  # the data was checked before Ray started


@pytest.mark.parametrize("case", CASES)
def test_eval_names_the_bad_data_file(tmp_path, case, capsys, model_path):
    from reasonrl.eval.cli import main

    path, words = _bad_files(tmp_path)[case]
    status = main(["rollout.engine=hf", f"data.val_files=[{path}]", f"eval.output_dir={tmp_path / 'eval'}"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("INFO")]
    assert status == 2
    assert len(err) == 1 and str(path) in err[0] and words in err[0], err


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
