"""reasonrl.datasets — recipes that turn public datasets into parquet with one schema (docs/tasks.md)."""
from reasonrl.config.tasks import TASKS, get_task

from .common import DataError, check_row, find_split, prepare, read_rows, write_parquet


def task_files(task: str, which: str, explicit=None) -> list:
    """Parquet files for ``task`` (a name in the task registry, reasonrl/config/tasks.py); ``which`` is "train"
    or "val"."""
    if task not in TASKS:
        raise DataError(f"unknown task {task!r}; known: {', '.join(sorted(TASKS))}")
    spec = get_task(task)
    return find_split(spec.recipe, spec.train_split if which == "train" else spec.val_split, explicit)


__all__ = ["DataError", "TASKS", "check_row", "find_split", "prepare", "read_rows", "task_files", "write_parquet"]
