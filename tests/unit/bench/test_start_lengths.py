"""The benchmark's replicas take their response lengths as they start (``with_start_lengths``): the fleet sends a
replica its first call as the trainer is built, so lengths sent after it came too late once (thirtieth session)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import cpu_worker_plan


def test_the_lengths_travel_with_the_class_to_a_fresh_process():
    import ray.cloudpickle as cloudpickle

    from reasonrl.bench.async_step import BenchRolloutWorker, with_start_lengths

    cls = with_start_lengths([7, 3, 5])
    assert issubclass(cls, BenchRolloutWorker) and BenchRolloutWorker.START_LENGTHS is None
    # a fresh interpreter, as a Ray worker is: the class comes by value, its lengths with it
    loaded = subprocess.run([sys.executable, "-c", "import pickle, sys; cls = pickle.loads(sys.stdin.buffer.read()); "
                             "print(cls.__name__, cls.START_LENGTHS, cls.__mro__[1].__name__)"],
                            input=cloudpickle.dumps(cls), capture_output=True, check=True, timeout=120)
    assert loaded.stdout.decode().split("\n")[0] == "BenchRolloutWorkerWithLengths [7, 3, 5] BenchRolloutWorker"


@pytest.mark.slow
def test_a_worker_applies_its_start_lengths_while_it_is_built(tiny_policy):
    from reasonrl.bench.async_step import BenchRolloutWorker, with_start_lengths
    from reasonrl.config import load_config, to_dict

    cfg, _ = load_config(["task=arith", "trainer.mode=async", "fleet.enabled=true", "rollout.engine=hf",
                          f"model.path={tiny_policy}"], cuda_available=False)
    args = (to_dict(cfg), tiny_policy)
    kwargs = {"rank": 0, "world_size": 1, "plan": cpu_worker_plan(cfg)}
    assert BenchRolloutWorker(*args, **kwargs).START_LENGTHS is None  # no lengths: built as a RolloutWorker
    # with lengths the constructor applies them, which the hf engine refuses by name (only vLLM takes them)
    with pytest.raises(ValueError, match="per-sample response lengths need the vLLM engine"):
        with_start_lengths([4, 2])(*args, **kwargs)
