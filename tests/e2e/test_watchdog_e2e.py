"""A worker that never answers: the run names the phase and the rank, prints the worker's stack, and exits 4 instead
of hanging. The hang is made on purpose (``REASONRL_FAULT_AT=worker0.generate#1=hang`` blocks rank 0 on an event
before its first generate), so the outcome never depends on timing: the watchdog's ceiling is the only clock. That
ceiling is short (8 s), as the test waits it out in full: the first watched phase is the hung generate (the workers'
start-up is not watched), so no honest phase can reach it first. The policy is conftest's ``tiny_policy`` (a random
2-layer Llama with SmolLM2's tokenizer): the hang comes before the model's first token."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_hung_worker_is_named_with_its_stack_and_the_run_exits(tmp_path, tiny_policy):
    out = tmp_path / "run"
    args = ["task=gsm8k", f"model.path={tiny_policy}", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_new_tokens=8", "actor.micro_batch_size_per_worker=4", "reward.workers=1",
            "trainer.logger=[jsonl]", "trainer.num_workers=1", "trainer.total_steps=2", "trainer.watchdog_max_s=8",
            f"trainer.output_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", REASONRL_FAULT_AT="worker0.generate#1=hang")
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", *args], capture_output=True, text=True,
                          timeout=800, env=env, start_new_session=True)
    log = proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.returncode == 4, log
    assert "watchdog: phase 'generate' (ActorRolloutRefWorker) has not finished on rank(s) " in proc.stderr, log
    assert proc.stderr.split("rank(s) ", 1)[1].split(" after", 1)[0] == "0", log
    # The stuck worker's own Python stack, printed and kept in the run directory. (One worker: the CI machine has
    # little memory to spare.)
    assert "---- stacks of ActorRolloutRefWorker rank 0 ----" in proc.stderr, log
    dump = (out / "stacks" / "ActorRolloutRefWorker_rank0.txt").read_text()
    assert "hang_here" in dump and "fault_points.py" in dump, dump
    assert "hang_here" in proc.stderr.split("---- stacks of ActorRolloutRefWorker rank 0 ----", 1)[1]
    assert "Traceback" not in proc.stderr, log
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()
