"""FSDP2 helpers: shard a Hugging Face causal LM, move full (unsharded) state dicts in and out, and offload a model's
shards, gradients and optimizer state to CPU memory between the phases that use them."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from reasonrl.models.loader import decoder_layers  # noqa: F401  (re-exported: FSDP2 shards these blocks)

from .host_memory import HostArena, aligned, storage_bytes


def compile_decoder_layers(model) -> int:
    """Regional ``torch.compile``: compile each decoder layer in place (``Module.compile``, so parameter names and
    state-dict keys do not change), ``fullgraph=False`` so that anything Dynamo cannot trace runs eagerly. Call it
    before ``shard_model`` (compile, then ``fully_shard``, as torchtitan does): FSDP2's hooks then run around the
    compiled layer. All layers share one compiled graph (modules are graph inputs), and a sequence length not seen
    before recompiles once, after which Dynamo marks it dynamic. Returns the number of layers compiled."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(fullgraph=False)
    return len(layers)


def shard_model(model, mesh, device: str, compute_dtype: torch.dtype) -> None:
    """``fully_shard`` every decoder layer, then the root; parameters keep their dtype (fp32 for a trained model, the
    compute dtype for a bf16 reference), compute in ``compute_dtype``."""
    model.to(device)
    kwargs = {"mesh": mesh}
    if compute_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


@torch.no_grad()
def fix_gradient_dtypes(model, device: str) -> None:
    """One 1-token forward through a freshly sharded causal LM, while its trainable parameters still require grad.

    FSDP2 fixes each parameter group's gradient dtypes (the fp32 reduce, the fp32 gradient) at the model's first
    forward, from the parameters that require grad *then*. A LoRA actor's reference pass runs with peft's adapters
    disabled, which turns ``requires_grad`` off on the adapters: were that the first forward (on-policy, no old-log-prob
    pass), the groups would get no gradient dtype and the first backward would hand bf16 gradients to the fp32
    adapters and fail ("attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with grad_dtype
    'Float'"; met on the H200, pytorch/pytorch#186998). A forward is a collective: every rank runs it."""
    model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))


def full_state_dict(model, optimizer) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Full model and optimizer state dicts on CPU (a collective: every rank must call it)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state_dict(model, optimizer, model_sd: Dict[str, torch.Tensor], optim_sd: dict,
                         strict: bool = True) -> None:
    """Load full state dicts into the sharded model and its optimizer; ``strict`` False: ``model_sd`` may hold only
    some of the parameters (a LoRA checkpoint's adapters)."""
    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, model_sd, options=options)
    set_optimizer_state_dict(model, optimizer, optim_sd, options=options)


def clip_grad_norm(model, max_norm: float) -> float:
    """Clip the global gradient norm of ``model`` (0: measure only) and return it as a float; with FSDP2 the norm
    is a DTensor over all ranks, made full here."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


# ---------------------------------------------------------------------------------------------------------------
# Offload: keep a model's shards, its gradients and its optimizer's state in CPU memory between the phases that use
# them, so that the colocated engine's KV cache (or another model) gets the device memory. Everything here works on
# any device; on a CPU worker every move is a no-op (the tensors are already there).

def _synchronize(devices) -> None:
    for device in devices:
        if device.type not in ("cpu", "meta"):  # meta: nothing to wait for (tests move to it)
            torch.get_device_module(device.type).synchronize(device)


def _empty_cache(devices) -> None:
    """Hand the freed blocks back to the driver: the engine (or a colocated worker process) allocates outside
    PyTorch's caching allocator and would not see them otherwise."""
    for device in devices:
        if device.type not in ("cpu", "meta"):
            torch.get_device_module(device.type).empty_cache()


def _moved(tensor: torch.Tensor, device: torch.device, pin_memory: bool, always_copy: bool,
           arena: Optional[HostArena] = None) -> torch.Tensor:
    """``tensor`` on ``device`` with the same dtype, shape and strides (a DTensor keeps its mesh and placements:
    only its local shard moves). The same object when it is already there, unless ``always_copy``. A copy from an
    accelerator to the CPU lands in pinned memory when ``pin_memory``, so that the way back can be asynchronous: in
    ``arena`` (exactly sized, ``host_memory.HostArena``) where given and it has room, else torch's pinned allocator.
    With ``arena`` a copy to the CPU from the CPU (``always_copy``) lands in the arena too (the tests see it)."""
    if isinstance(tensor, DTensor):
        local = tensor.to_local()
        out = _moved(local, device, pin_memory, always_copy, arena)
        if out is local:
            return tensor
        # Not DTensor.from_local: it moves a local tensor to the mesh's device type (a CUDA mesh would pull the
        # offloaded shard straight back to the GPU). The same spec (mesh, placements, shape, stride, dtype) fits.
        return DTensor(out, tensor._spec, requires_grad=tensor.requires_grad)
    if tensor.device == device and not always_copy:
        return tensor
    if device.type == "cpu" and arena is not None:
        if arena.holds(tensor):  # moved already (a tied weight is visited once per module that holds it)
            return tensor
        out = arena.take(tensor.size(), tensor.stride(), tensor.dtype)
        if out is not None:
            return out.copy_(tensor, non_blocking=tensor.device.type != "cpu")
    if device.type == "cpu" and tensor.device.type != "cpu" and pin_memory:
        out = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device, pin_memory=True)
        return out.copy_(tensor, non_blocking=True)
    if tensor.device == device:
        return tensor.clone()
    return tensor.to(device, non_blocking=tensor.device.type == "cpu" and tensor.is_pinned())


@torch.no_grad()
def move_fsdp_model(model: torch.nn.Module, device, *, pin_memory: bool = True, always_copy: bool = False,
                    arena: Optional[HostArena] = None) -> float:
    """Move the parameters (FSDP2: the local shards of the DTensors), their gradients where not None, and the
    buffers of ``model`` to ``device``; returns the seconds taken (the copies are finished when it returns).

    Parameter objects keep their identity, so an optimizer built on them stays valid. It goes through
    ``Module._apply`` like ``model.to()``: on an FSDP2 module that first reshards (a forward leaves the root's
    parameters unsharded) and afterwards re-points FSDP's own references to the moved shards (a shard that FSDP
    pads, dim 0 not divisible by the ranks, is re-padded by FSDP into pageable memory: correct, only its copies are
    slower). ``always_copy`` copies even tensors that are already on ``device`` (tests use it to see that every
    tensor is reached). ``arena``: a move to the CPU copies into it (``begin`` sized for every tensor moved)."""
    start = time.perf_counter()
    device = torch.device(device)
    params = list(model.parameters())
    tensors = [*params, *(p.grad for p in params if p.grad is not None), *model.buffers()]
    if not always_copy and all(t.device == device for t in tensors):
        return time.perf_counter() - start  # already there (a CPU worker): nothing to do
    if arena is not None and device.type == "cpu":
        if hasattr(model, "reshard"):  # FSDP2's root stays unsharded after a forward: size the arena for shards
            model.reshard()
            params = list(model.parameters())
            tensors = [*params, *(p.grad for p in params if p.grad is not None), *model.buffers()]
        arena.begin(_arena_bytes(tensors, device, always_copy))
    sources = set()

    def move(t: torch.Tensor) -> torch.Tensor:
        sources.add(t.device)
        return _moved(t, device, pin_memory, always_copy, arena)

    model._apply(move)
    _synchronize(sources | {device})
    return time.perf_counter() - start


def _arena_bytes(tensors, device: torch.device, always_copy: bool) -> int:
    """The arena bytes a move of ``tensors`` to ``device`` takes: each distinct tensor that will be copied (a DTensor:
    its local shard), its storage span rounded up to the arena's alignment."""
    total, seen = 0, set()
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        if id(t) in seen or (local.device == device and not always_copy):
            continue
        seen.add(id(t))
        total += aligned(storage_bytes(local.size(), local.stride(), local.dtype))
    return total


def _stays_on_host(group: dict, value: torch.Tensor) -> bool:
    """torch optimizers keep a scalar ``step`` on the CPU unless they are ``capturable`` or ``fused``."""
    return value.dim() == 0 and not isinstance(value, DTensor) and not (group.get("capturable") or group.get("fused"))


@torch.no_grad()
def move_optimizer(optimizer: torch.optim.Optimizer, device, *, pin_memory: bool = True,
                   always_copy: bool = False, arena: Optional[HostArena] = None) -> float:
    """Move every tensor of the optimizer's state (AdamW: ``exp_avg``, ``exp_avg_sq`` and ``step``) to ``device``;
    returns the seconds taken. Moving to an accelerator leaves a scalar ``step`` on the CPU where the optimizer keeps
    it (not capturable, not fused). An optimizer that has not stepped yet has no state: nothing moves."""
    start = time.perf_counter()
    device = torch.device(device)
    moving = [(state, key, value) for group in optimizer.param_groups for param in group["params"]
              for state in [optimizer.state.get(param) or {}] for key, value in state.items()
              if torch.is_tensor(value) and not (device.type != "cpu" and _stays_on_host(group, value))]
    if arena is not None and device.type == "cpu":
        arena.begin(_arena_bytes([value for *_, value in moving], device, always_copy))
    sources = set()
    for state, key, value in moving:
        sources.add(value.device)
        state[key] = _moved(value, device, pin_memory, always_copy, arena)
    _synchronize(sources | {device})
    return time.perf_counter() - start


def _devices_of(tensors) -> set:
    return {t.device for t in tensors if t is not None}


def offload_fsdp_model(model: torch.nn.Module, empty_cache: bool = True, arena: Optional[HostArena] = None) -> float:
    """Parameters, gradients and buffers of ``model`` to (pinned) CPU memory, in ``arena`` where given; returns
    seconds (``move_fsdp_model``)."""
    devices = _devices_of([*model.parameters(), *model.buffers()])
    seconds = move_fsdp_model(model, "cpu", arena=arena)
    if empty_cache:
        _empty_cache(devices)
    return seconds


def onload_fsdp_model(model: torch.nn.Module, device) -> float:
    """Parameters, gradients and buffers of ``model`` back to ``device``; returns seconds."""
    return move_fsdp_model(model, device)


def offload_optimizer(optimizer: torch.optim.Optimizer, empty_cache: bool = True,
                      arena: Optional[HostArena] = None) -> float:
    """The optimizer's state to (pinned) CPU memory, in ``arena`` where given; returns seconds. See
    ``move_optimizer``."""
    devices = _devices_of([v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)])
    seconds = move_optimizer(optimizer, "cpu", arena=arena)
    if empty_cache:
        _empty_cache(devices)
    return seconds


def onload_optimizer(optimizer: torch.optim.Optimizer, device) -> float:
    """The optimizer's state back to ``device``; returns seconds."""
    return move_optimizer(optimizer, device)


def iter_full_params(model: torch.nn.Module, device, dtype: torch.dtype,
                     select: Optional[Callable[[str], bool]] = None) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, full parameter) in ``dtype`` on ``device``, one at a time (a collective: every rank iterates). An
    offloaded model is gathered from the CPU: each shard is copied to ``device`` on its own and all-gathered there,
    so the weight sync never needs the whole model back on the device. ``select(name)``: only those parameters
    (LoRA: the adapters), the others are not gathered."""
    device = torch.device(device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if select is not None and not select(name):
                continue
            param = _moved(param.detach(), device, pin_memory=False, always_copy=False)
            full = param.full_tensor() if isinstance(param, DTensor) else param
            yield name, full.to(dtype)


class Offloader:
    """Where one model (and its optimizer) lives between phases. With ``params`` the parameters and gradients stay in
    CPU memory except inside ``on_device()``; with ``optimizer_state`` the optimizer's state does too, except inside
    ``on_device(optimizer=True)``. Both off: everything stays on the device and ``on_device`` does nothing. The
    seconds spent moving are summed per direction until ``pop_metrics``. Offloaded tensors live in two
    ``HostArena``s (parameters and gradients; optimizer state), exactly sized and reused by every offload."""

    def __init__(self, name: str, model: torch.nn.Module, device, params: bool, optimizer=None,
                 optimizer_state: bool = False) -> None:
        self.name, self.model, self.optimizer, self.device = name, model, optimizer, torch.device(device)
        self.params, self.optimizer_state = params, optimizer_state and optimizer is not None
        self.seconds = {"offload": 0.0, "onload": 0.0}
        self.moves = 0
        self.params_home = self.optim_home = True  # on the device
        self.param_arena, self.optim_arena = HostArena(f"{name} parameters"), HostArena(f"{name} optimizer state")

    @property
    def enabled(self) -> bool:
        return self.params or self.optimizer_state

    def offload(self) -> None:
        """Move what is configured to be offloaded to the CPU (a no-op when it is there already)."""
        if self.params and self.params_home:
            self._count("offload", offload_fsdp_model(self.model, arena=self.param_arena))
            self.params_home = False
        if self.optimizer_state and self.optim_home:
            self._count("offload", offload_optimizer(self.optimizer, arena=self.optim_arena))
            self.optim_home = False

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory the arenas hold (what this model's offload costs the host)."""
        return self.param_arena.capacity + self.optim_arena.capacity

    def onload(self, optimizer: bool = False) -> None:
        if not self.params_home:
            self._count("onload", onload_fsdp_model(self.model, self.device))
            self.params_home = True
        if optimizer and not self.optim_home:
            self._count("onload", onload_optimizer(self.optimizer, self.device))
            self.optim_home = True

    @contextmanager
    def on_device(self, optimizer: bool = False):
        """The model (and with ``optimizer`` its optimizer state) on the device inside, offloaded again after."""
        self.onload(optimizer)
        try:
            yield
        finally:
            self.offload()

    def _count(self, direction: str, seconds: float) -> None:
        self.seconds[direction] += seconds
        self.moves += 1

    def pop_metrics(self) -> Dict[str, float]:
        """``timing_s/offload_<name>`` and ``timing_s/onload_<name>`` since the last call (empty when nothing moved)."""
        out = {f"timing_s/{d}_{self.name}": s for d, s in self.seconds.items()} if self.moves else {}
        self.seconds = {"offload": 0.0, "onload": 0.0}
        self.moves = 0
        return out
