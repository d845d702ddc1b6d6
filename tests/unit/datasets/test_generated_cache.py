"""A generated recipe's cached split is rebuilt when the recipe's source changes (datasets/common.py)."""
import hashlib

from paths import REPO

from reasonrl.config.tasks import get_task
from reasonrl.datasets import read_rows, task_files, write_parquet
from reasonrl.datasets import arith


def test_a_cached_generated_split_is_rebuilt_when_its_source_digest_differs(tmp_path, monkeypatch):
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path))
    split = get_task("arith").val_split
    fresh = arith.build_rows(split)
    path = task_files("arith", "val")[0]
    assert path == str(tmp_path / "data" / "arith" / f"{split}.parquet") and read_rows(path) == fresh
    sidecar = tmp_path / "data" / "arith" / f"{split}.parquet.source"
    source = (REPO / "datasets" / "arith.py").read_bytes()
    assert sidecar.read_text().strip() == hashlib.sha256(source).hexdigest()

    # the digest matches: the cache is read as it is (one row left in it stays one row)
    write_parquet(fresh[:1], tmp_path / "data" / "arith" / f"{split}.parquet")
    assert read_rows(task_files("arith", "val")[0]) == fresh[:1]
    # made by other code (another digest), or before digests were written (none): built again
    sidecar.write_text("0" * 64 + "\n")
    assert read_rows(task_files("arith", "val")[0]) == fresh
    write_parquet(fresh[:1], tmp_path / "data" / "arith" / f"{split}.parquet")
    sidecar.unlink()
    assert read_rows(task_files("arith", "val")[0]) == fresh and sidecar.exists()
