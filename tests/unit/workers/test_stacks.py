"""Stack dumps: the run directory gets a ``stacks/`` folder only when a dump was asked for (a hang)."""
import faulthandler
import shutil

from reasonrl.workers import stacks
from reasonrl.workers.stacks import DUMP_SIGNAL, collect_stack_dump, install_stack_dump, scratch_stack_dir


def test_stacks_folder_made_only_when_a_dump_is_asked_for(tmp_path):
    scratch = scratch_stack_dir() / "Worker_rank0.txt"
    run_stacks = tmp_path / "run" / "stacks"
    pid = install_stack_dump(None, str(scratch))  # this process stands in for the worker: the signal comes to it
    try:
        assert scratch.exists() and not scratch.is_relative_to(tmp_path)
        assert not run_stacks.exists()  # installed, nothing asked: no folder in the run directory
        text = collect_stack_dump(pid, scratch, run_stacks / scratch.name)
    finally:
        faulthandler.unregister(DUMP_SIGNAL)
        stacks._dump_file.close()
        stacks._dump_file = None
        shutil.rmtree(scratch.parent)
    assert "test_stacks_folder_made_only_when_a_dump_is_asked_for" in text  # this test's frame, from faulthandler
    assert (run_stacks / "Worker_rank0.txt").read_text() == text
