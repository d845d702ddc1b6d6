"""A fleet replica's heartbeat (``RolloutWorker.watch_progress``): its engine's steps reach the progress board while
a generate call still runs, which is how the fleet's watchdog tells a long call from a stuck one.

The RolloutWorker is built in this process (conftest's ``tiny_policy``, hf engine). The order is explicit: the
engine's step counter holds the generation at its 10th step until the board has been told of a step, so a beat
during the call is guaranteed rather than likely."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from helpers import cpu_worker_plan


class HeldAtTen:
    """A step counter whose 10th step waits until ``released`` (the board saw a step), at most 60 s."""

    def __init__(self, released: threading.Event) -> None:
        self._count, self.released, self.held = 0, released, False

    @property
    def count(self) -> int:
        return self._count

    @count.setter
    def count(self, value: int) -> None:
        if value == 10:
            self.held = self.released.wait(timeout=60)
        self._count = value


@pytest.mark.slow
def test_the_engines_steps_reach_the_board_while_a_call_runs(tiny_policy):
    from reasonrl.config import load_config, to_dict
    from reasonrl.data.batch import Batch
    from reasonrl.workers.rollout_worker import RolloutWorker

    cfg, _ = load_config(["task=arith", "trainer.mode=async", "fleet.enabled=true", "rollout.engine=hf",
                          f"model.path={tiny_policy}"], cuda_available=False)
    worker = RolloutWorker(to_dict(cfg), tiny_policy, rank=3, world_size=4, plan=cpu_worker_plan(cfg))
    seen, calling, released = [], threading.Event(), threading.Event()

    def beat(rank, steps):  # the board's beat, as the replica's thread calls it (board.beat.remote)
        seen.append((rank, steps, calling.is_set()))
        if steps > 0:
            released.set()

    counter = HeldAtTen(released)
    worker.host.engine.steps = counter
    worker.watch_progress(SimpleNamespace(beat=SimpleNamespace(remote=beat)), every_s=0.01)
    prompt = worker.tokenizer.encode("What is 17 + 25?")
    calling.set()
    out = worker.generate(Batch(meta={"prompt_ids": [prompt], "groups": [0]}),
                          {"n": 1, "max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True})
    calling.clear()
    assert counter.held, "the call reached its 10th step before the board heard of any step"
    assert len(out[0].response_ids) == 16 and counter.count >= 16  # every decode step counted
    during = [steps for rank, steps, in_call in seen if in_call and steps > 0]
    assert during and all(rank == 3 for rank, _, _ in seen)
