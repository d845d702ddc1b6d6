"""reasonrl.sandboxes — run untrusted code under limits. Imports neither torch nor ray.

Backends: ``bwrap`` (bubblewrap + rlimits as an unprivileged uid), ``docker`` (warm container pool with an
in-container dispatcher), and ``subprocess`` (no isolation: the speed ceiling for benchmarks, trusted code only).
``get_sandbox("auto")`` picks bwrap when it works here, else docker.
"""
from __future__ import annotations

from typing import Any

from reasonrl.registry import Registry

from .base import ExecResult, FileMap, Limits, Sandbox, SandboxError, SandboxUnavailable

SANDBOXES = Registry("sandbox backend", config_key="sandbox.backend")
"""Sandbox classes by name, imported when first asked for (each backend's module checks its own tools)."""
SANDBOXES.register_lazy("bwrap", f"{__package__}.bwrap:BwrapSandbox")
SANDBOXES.register_lazy("docker", f"{__package__}.docker_pool:DockerSandbox")
SANDBOXES.register_lazy("subprocess", f"{__package__}.local:SubprocessSandbox")
BACKENDS = tuple(SANDBOXES)


def get_sandbox(name: str = "auto", **options: Any) -> Sandbox:
    """Build a sandbox backend by name ("auto", "bwrap", "docker", "subprocess"); options go to its constructor."""
    if name == "auto":
        name = default_backend()
    return SANDBOXES.build(name, **options)


def default_backend() -> str:
    """"bwrap" when a bwrap sandbox runs here, else "docker" when its daemon and image are there."""
    from .bwrap import bwrap_usable
    ok, why_bwrap = bwrap_usable()
    if ok:
        return "bwrap"
    from .docker_pool import docker_usable
    ok, why_docker = docker_usable()
    if ok:
        return "docker"
    raise SandboxUnavailable(f"no sandbox backend works here: bwrap ({why_bwrap}); docker ({why_docker})")


__all__ = ["BACKENDS", "SANDBOXES", "ExecResult", "FileMap", "Limits", "Sandbox", "SandboxError", "SandboxUnavailable",
           "default_backend", "get_sandbox"]
