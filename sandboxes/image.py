"""Where the sandbox image and root filesystem live: a tag and a directory named by the hash of the recipe.

The recipe is ``sandboxes/images/build_rootfs.sh`` + ``packages.txt``; ``.ci/setup_sandboxes.sh`` builds it with
debootstrap (no registry), imports it into Docker as ``reasonrl-sandbox:<hash>`` and keeps the tree under
``$REASONRL_SANDBOX_ROOT/rootfs-<hash>`` (default ``/var/lib/reasonrl``) for the bwrap backend.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

IMAGES_DIR = Path(__file__).resolve().parent / "images"
RECIPE_FILES = ("build_rootfs.sh", "packages.txt")
IMAGE_REPOSITORY = "reasonrl-sandbox"
SETUP_HINT = "run `bash .ci/setup_sandboxes.sh` as root"


def recipe_hash() -> str:
    """First 12 hex digits of sha256 over the recipe files, concatenated (the same as the setup script)."""
    digest = hashlib.sha256()
    for name in RECIPE_FILES:
        digest.update((IMAGES_DIR / name).read_bytes())
    return digest.hexdigest()[:12]


def image_tag() -> str:
    """The docker image the current recipe builds: ``reasonrl-sandbox:<hash>``."""
    return f"{IMAGE_REPOSITORY}:{recipe_hash()}"


def state_dir() -> Path:
    """Directory holding built root filesystems."""
    return Path(os.environ.get("REASONRL_SANDBOX_ROOT", "/var/lib/reasonrl"))


def rootfs_dir() -> Path | None:
    """The built root filesystem for the current recipe, or None when it has not been built here."""
    path = state_dir() / f"rootfs-{recipe_hash()}"
    return path if (path / "usr" / "bin" / "python3").exists() else None
