"""reasonrl/fleet/audit.py: a run's ledger against a reference run's, over journals written here by the real
``Ledger`` (rounds of 2 prompts, ids ``step * 2 + k``, as the fleet names them): lost, duplicated, dropped with their
reasons, and prompts drawn in another order, counted per prompt."""
from pathlib import Path

from reasonrl.fleet.audit import audit, read_ledger
from reasonrl.fleet.ledger import Ledger

BATCH = 2


def write_round(folder: Path, step: int, data, trained=True, fail=None, meta=True) -> None:
    """Round ``step``'s journal: its prompts drawn from the dataset positions ``data``, each issued and answered (or
    failed, ``fail``: position in the round -> reason), the answered ones trained when ``trained``."""
    ids = [step * BATCH + k for k in range(len(data))]
    ledger = Ledger.open(folder / f"round_{step:06d}.jsonl", step, ids,
                         meta={"data_indices": list(data)} if meta else None)
    for k, i in enumerate(ids):
        attempt = ledger.issue(i, f"replica{k % 2}")
        if fail and k in fail:
            assert ledger.fail(i, attempt, fail[k])
        else:
            assert ledger.complete(i, attempt, {"replica": f"replica{k % 2}", "samples": 2})
            if trained:
                ledger.trained(i)
    ledger.close()


def reference(tmp_path: Path, meta=True) -> Path:
    folder = tmp_path / "reference"
    for step, data in enumerate([(5, 1), (3, 0), (4, 2)]):
        write_round(folder, step, data, meta=meta)
    return folder


def test_the_same_ledger_audits_clean_per_dataset_position(tmp_path):
    ref = reference(tmp_path)
    run = tmp_path / "run"
    for step, data in enumerate([(5, 1), (3, 0), (4, 2)]):
        write_round(run, step, data)
    result = audit(ref, run)
    assert result.key == "data_index"
    assert result.counts() == {"lost": 0, "duplicated": 0, "dropped": 0, "misplaced": 0, "trained": 6, "expected": 6}


def test_a_round_verified_but_never_trained_and_a_missing_round_are_lost(tmp_path):
    ref = reference(tmp_path)
    run = tmp_path / "run"
    write_round(run, 0, (5, 1))
    write_round(run, 1, (3, 0), trained=False)  # killed between the round and the update, never resumed
    result = audit(ref, run)  # and round 2 was never drawn
    assert result.lost == {3: 1, 0: 1, 4: 1, 2: 1}
    assert result.duplicated == {} and result.counts()["lost"] == 4 and result.counts()["trained"] == 2


def test_prompts_drawn_again_after_a_resume_are_duplicated_and_the_skipped_ones_lost(tmp_path):
    """A resume that restored the data position of step 0 instead of step 1: step 1 trains step 0's prompts again."""
    ref = reference(tmp_path)
    run = tmp_path / "run"
    for step, data in enumerate([(5, 1), (5, 1), (3, 0)]):
        write_round(run, step, data)
    result = audit(ref, run)
    assert result.duplicated == {5: 1, 1: 1}
    assert result.lost == {4: 1, 2: 1}  # step 2's prompts of the reference never came
    assert result.misplaced == [2, 3, 4, 5]  # ids 2..5 trained other positions than the reference's
    assert result.counts()["duplicated"] == 2 and result.counts()["lost"] == 2


def test_a_failed_prompt_is_dropped_with_its_reason_not_lost(tmp_path):
    ref = reference(tmp_path)
    run = tmp_path / "run"
    write_round(run, 0, (5, 1))
    write_round(run, 1, (3, 0), fail={1: "failed on every replica"})
    write_round(run, 2, (4, 2))
    result = audit(ref, run)
    assert result.dropped == {0: ["failed on every replica"]}
    assert result.lost == {} and result.duplicated == {}
    assert result.counts()["dropped"] == 1 and result.counts()["trained"] == 5


def test_without_dataset_positions_prompts_are_their_ids(tmp_path):
    ref = reference(tmp_path, meta=False)
    run = tmp_path / "run"
    write_round(run, 0, (5, 1))
    write_round(run, 2, (4, 2))  # with positions recorded here, but not in the reference: ids are compared
    result = audit(ref, run)
    assert result.key == "prompt_id"
    assert result.lost == {2: 1, 3: 1} and result.misplaced == []


def test_the_header_keeps_the_positions_through_a_reopen_and_a_torn_line_is_left_out(tmp_path):
    folder = tmp_path / "run"
    write_round(folder, 0, (5, 1), trained=False)
    path = folder / "round_000000.jsonl"
    ledger = Ledger.open(path, 0, [0, 1])  # a resumed process: the meta comes from the journal's header
    assert ledger.meta == {"data_indices": [5, 1]}
    ledger.trained(0)
    ledger.close()
    with open(path, "ab") as f:
        f.write(b'{"op":"train","i":1')  # killed inside the write: not on disk as a record
    seen = read_ledger(folder)
    assert seen.data_index == {0: 5, 1: 1} and dict(seen.trained) == {0: 1}
    assert path.read_bytes().endswith(b'"i":1')  # reading wrote nothing
