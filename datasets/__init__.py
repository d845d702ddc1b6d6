"""reasonrl.datasets — recipes that turn public datasets into parquet with one schema (DESIGN.md)."""
from .common import DataError, check_row, find_split, prepare, read_rows, write_parquet

# task -> (recipe module, train split, validation split)
TASKS = {
    "gsm8k": ("gsm8k", "train", "test"),
    "math": ("math", "train", "test"),
    "math500": ("math", "test", "test"),
    "arith": ("arith", "train", "test"),
    "mbpp": ("mbpp", "train", "test"),
    "humaneval": ("humaneval", "test", "test"),
    "minif2f": ("minif2f", "valid", "test"),
    "math_tool": ("math_tool", "train", "test"),
}


def task_files(task: str, which: str, explicit=None) -> list:
    """Parquet files for ``task``; ``which`` is "train" or "val"."""
    if task not in TASKS:
        raise DataError(f"unknown task {task!r}; known: {', '.join(sorted(TASKS))}")
    name, train_split, val_split = TASKS[task]
    return find_split(name, train_split if which == "train" else val_split, explicit)


__all__ = ["DataError", "TASKS", "check_row", "find_split", "prepare", "read_rows", "task_files", "write_parquet"]
