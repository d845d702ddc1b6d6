"""The benchmarks' random-weight model is written by a child process on a GPU (``bench.shapes.write_random_model``),
so the driver never holds a CUDA context beside its workers. Here (no GPU) the child is asked for explicitly: it
writes the same model the driver would, and a directory already there is kept without starting one."""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from reasonrl.bench.shapes import SHAPES, write_random_model


def test_the_child_writes_the_same_model_and_a_kept_directory_is_not_rewritten(tmp_path):
    here = write_random_model("tiny", tmp_path / "here", seed=3, in_child=False)
    child = write_random_model("tiny", tmp_path / "child", seed=3, in_child=True)
    config = json.loads((child / "config.json").read_text())
    assert config["hidden_size"] == SHAPES["tiny"]["hidden_size"] and (child / "tokenizer.json").exists()
    a, b = load_file(here / "model.safetensors"), load_file(child / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)  # the same seed, the same weights
    (child / "model.safetensors").write_bytes(b"kept")  # were it rewritten, these bytes would go
    write_random_model("tiny", child, seed=3, in_child=True)
    assert (child / "model.safetensors").read_bytes() == b"kept"
