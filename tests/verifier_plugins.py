"""Write a plugin as an installed distribution (a ``.dist-info`` with an ``entry_points.txt``) into a folder that the
test then puts on sys.path: a verifier by default (the VerifierPool hands its sys.path to its workers, which find the
plugin through the ``reasonrl.verifiers`` entry-point group), or another group's entry (``group=``)."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def write_plugin(root: Path, module: str, source: str, name: str, class_name: str,
                 group: str = "reasonrl.verifiers") -> Path:
    """``<root>/<module>.py`` holding ``source``, registered in ``group`` as ``name`` -> ``module:class_name``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(source)
    dist = root / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:{class_name}\n")
    return root


@contextmanager
def installed_plugin(root: Path, module: str, source: str, name: str, class_name: str,
                     group: str = "reasonrl.verifiers") -> Iterator[Path]:
    """``write_plugin``, with ``root`` on sys.path while the context lasts."""
    write_plugin(root, module, source, name, class_name, group)
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
