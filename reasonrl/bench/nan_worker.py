"""``NanProbeWorker``: the actor worker of ``benchmarks/gpu_nan_probe.py``. It trains exactly as
``ActorRolloutRefWorker`` does; the probe only watches.

``nan_probe_setup`` puts a ``NonFiniteGradCatcher`` on the actor's policy: it checks the accumulated gradients
after every micro-batch's backward (at the next micro-batch's forward, and at the optimizer's ``zero_grad``, which
ends every mini-batch), and at the first non-finite one keeps that micro-batch (on the CPU) and the actor's full state
dict as it was (the optimizer skips a step whose gradient norm is not finite, so the parameters that produced it are
still on the model). ``nan_probe_analyse`` then, with the training over, replays that micro-batch through the real
update's loss (``actor_update.policy_update`` with an optimizer that never steps):

* on the actor itself (FSDP, mixed precision as trained) under ``nan_trace.GradTrace``: the first operation whose
  backward made a non-finite gradient, and the masks the attention function was handed;
* on plain copies of the model (the captured weights, no FSDP) in bf16 and fp32, with attention ``sdpa`` under each
  SDPA backend (torch's choice, MATH, EFFICIENT_ATTENTION, FLASH_ATTENTION, CUDNN_ATTENTION) and ``eager``: which give a
  non-finite gradient norm (and, for each that does, the traced culprit);
* the padding facts of the micro-batch (``nan_trace.padding_facts``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from reasonrl.data.batch import Batch
from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker
from reasonrl.workers.dispatch import RANK_ZERO, dispatch
from reasonrl.workers.policy import Policy

from .nan_trace import GradTrace, forced_sdpa_backend, inject_nan_grad, localize, padding_facts

SDPA_BACKENDS = (None, "MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION")
"""The SDPA backends a replay is forced to (None: torch's own choice)."""


def grads_finite(model: torch.nn.Module) -> bool:
    """Whether every gradient on ``model``'s parameters is finite (no gradient yet: True)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return True
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    return bool(torch.stack([n.float() for n in torch._foreach_norm(local)]).isfinite().all())


class NonFiniteGradCatcher:
    """Watches a ``Policy``'s update for the first micro-batch whose backward leaves a non-finite gradient (see the
    module docstring); ``capture`` is then ``{"where": ..., "micro_batch": {name: CPU tensor}, "state": state dict}``.
    It wraps the policy's ``mb_log_probs`` and its optimizer's ``zero_grad`` on the instances; the update itself runs
    unchanged."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.capture: Optional[Dict[str, Any]] = None
        self.pending: Optional[Batch] = None
        self.where = {"zero_grads": 0, "micro_batch_in_mini": 0}
        forward, clear = policy.mb_log_probs, policy.optimizer.zero_grad

        def mb_log_probs(mb: Batch, with_entropy: bool):
            if torch.is_grad_enabled() and policy.model.training:
                self._check()
                self.pending = mb
                self.where["micro_batch_in_mini"] += 1
            return forward(mb, with_entropy)

        def zero_grad(*args: Any, **kwargs: Any):
            self._check()
            self.pending = None
            self.where = {"zero_grads": self.where["zero_grads"] + 1, "micro_batch_in_mini": 0}
            return clear(*args, **kwargs)

        policy.mb_log_probs = mb_log_probs  # type: ignore[method-assign]
        policy.optimizer.zero_grad = zero_grad  # type: ignore[method-assign]

    def _check(self) -> None:
        if self.capture is not None or self.pending is None or grads_finite(self.policy.model):
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.policy.model, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
        self.capture = {"where": dict(self.where), "rows": len(self.pending),
                        "micro_batch": {k: v.detach().cpu() for k, v in self.pending.tensors.items()},
                        "state": state, "time": time.time()}


class _NoStepOptimizer:
    """The replay's optimizer: clears gradients, never steps (the captured weights stay as they are)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        pass


class _NoScheduler:
    def step(self) -> None:
        pass

    def get_last_lr(self) -> List[float]:
        return [0.0]


class NanProbeWorker(ActorRolloutRefWorker):
    """``ActorRolloutRefWorker`` plus the probe's three calls (see the module docstring)."""

    catcher: Optional[NonFiniteGradCatcher] = None

    @dispatch(RANK_ZERO)
    def nan_probe_setup(self, inject_module: str = "") -> Dict[str, Any]:
        """Start watching the actor's update; ``inject_module``: a module name (``model.layers.3.mlp``) whose backward
        is made to emit NaN (the dry run's stand-in for the defect). Returns the model's facts."""
        self.catcher = NonFiniteGradCatcher(self.policy)
        self.inject_module = inject_module
        if inject_module:
            inject_nan_grad(self.policy.model.get_submodule(inject_module))
        cfg = self.policy.model.config
        return {"attn_implementation": cfg._attn_implementation, "compute_dtype": str(self.compute_dtype),
                "model_type": cfg.model_type, "layers": cfg.num_hidden_layers}

    @dispatch(RANK_ZERO)
    def nan_probe_captured(self) -> Optional[Dict[str, Any]]:
        """Where the first non-finite gradient was caught (None: not yet)."""
        return None if self.catcher is None or self.catcher.capture is None else \
            {"where": self.catcher.capture["where"], "rows": self.catcher.capture["rows"]}

    @dispatch(RANK_ZERO)
    def nan_probe_analyse(self, capture_dir: str, save_state: bool = True) -> Dict[str, Any]:
        """Save the capture to ``capture_dir`` (``micro_batch.pt``; ``model_state.pt`` when ``save_state``) and run
        the replays (see the module docstring)."""
        cap = self.catcher.capture
        out_dir = Path(capture_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(cap["micro_batch"], out_dir / "micro_batch.pt")
        result: Dict[str, Any] = {"where": cap["where"], "rows": cap["rows"], "capture_dir": str(out_dir),
                                  "files": ["micro_batch.pt"]}
        if save_state:
            torch.save(cap["state"], out_dir / "model_state.pt")
            result["files"].append("model_state.pt")
        mb_cpu = Batch(dict(cap["micro_batch"]))
        result["padding"] = padding_facts(mb_cpu["attention_mask"])
        result["micro_batch_stats"] = _batch_stats(mb_cpu)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # a copy: set_model_state_dict turns the dict's tensors into DTensors in place
        set_model_state_dict(self.policy.model, dict(cap["state"]), options=StateDictOptions(full_state_dict=True))
        mb = mb_cpu.to(self.device)
        result["actor_trace"] = self._replay(self.policy.model, mb, trace=True)
        result["variants"] = self._variants(cap["state"], mb)
        return result

    def _replay(self, model: torch.nn.Module, mb: Batch, trace: bool, backend: Optional[str] = None) -> Dict[str, Any]:
        """The real micro-batch loss and backward on ``model`` (``policy_update`` over the one micro-batch, nothing
        stepped); with ``trace``: the GradTrace report. Gradients are cleared afterwards."""
        from reasonrl.workers.actor_update import policy_update

        replay = Policy("actor", model, self.cfg, self.batch_plan, self.device, self.world_size, self.policy.offload,
                        self.policy.max_tokens, _NoStepOptimizer(model), _NoScheduler())
        start = time.perf_counter()
        out: Dict[str, Any] = {"sdpa_backend": backend or "default"}
        try:
            with forced_sdpa_backend(backend):
                if trace:
                    with GradTrace(model) as tracer:
                        metrics = policy_update(replay, mb, 0.0)
                    records = tracer.records
                    out.update(localize(records))
                    out["attention_masks"] = tracer.masks[:2] + ([{"more": len(tracer.masks) - 2}]
                                                                 if len(tracer.masks) > 2 else [])
                    out["records"] = records
                else:
                    metrics = policy_update(replay, mb, 0.0)
            out["grad_norm"] = metrics.get("actor/grad_norm")
            out["nonfinite"] = not torch.isfinite(torch.tensor(out["grad_norm"])).item()
            out["pg_loss"] = metrics.get("actor/pg_loss")
        except Exception as exc:  # a backend that cannot run this mask/dtype: recorded, the others still run
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        finally:
            model.zero_grad(set_to_none=True)
        out["seconds"] = round(time.perf_counter() - start, 2)
        return out

    def _variants(self, state: Dict[str, torch.Tensor], mb: Batch) -> List[Dict[str, Any]]:
        """Plain copies of the model (no FSDP) in bf16 and fp32, attention sdpa (each backend) and eager."""
        from reasonrl.models.loader import load_causal_lm

        out = []
        for dtype in (torch.bfloat16, torch.float32):
            for attn in ("sdpa", "eager"):
                model = load_causal_lm(self.model_path, dtype, self.cfg.model.trust_remote_code, attn)
                loaded = model.load_state_dict({k: _full(v).to(dtype) for k, v in state.items()}, strict=False)
                model.config.use_cache = False
                model.to(self.device).train()
                if self.inject_module:
                    inject_nan_grad(model.get_submodule(self.inject_module))
                for backend in (SDPA_BACKENDS if attn == "sdpa" else (None,)):
                    row = {"dtype": str(dtype).replace("torch.", ""), "attn": attn,
                           "missing_keys": len(loaded.missing_keys), "unexpected_keys": len(loaded.unexpected_keys),
                           **self._replay(model, mb, trace=False, backend=backend)}
                    if row.get("nonfinite"):  # where, in this variant
                        traced = self._replay(model, mb, trace=True, backend=backend)
                        row["culprit"] = traced.get("culprit")
                        row["candidates"] = traced.get("candidates", [])[:5]
                        row["first_nonfinite_grad"] = traced.get("first_nonfinite_grad")
                    out.append(row)
                    print(f"nan probe variant {row['dtype']} {attn} {row['sdpa_backend']}: grad norm "
                          f"{row.get('grad_norm')} {row.get('error', '')}", flush=True)
                del model
                if self.device == "cuda":
                    torch.cuda.empty_cache()
        return out


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _batch_stats(mb: Batch) -> Dict[str, Any]:
    """A few facts of the captured micro-batch: shapes, response lengths, advantages."""
    out: Dict[str, Any] = {k: list(v.shape) for k, v in mb.tensors.items()}
    if "response_mask" in mb:
        lengths = mb["response_mask"].sum(-1)
        out["response_len_min_max"] = [int(lengths.min()), int(lengths.max())]
    if "advantages" in mb:
        adv = mb["advantages"]
        out["advantages_abs_max"] = float(adv.abs().max())
        out["rows_with_zero_advantage"] = int((adv.abs().sum(-1) == 0).sum())
    if "old_log_probs" in mb and "response_mask" in mb:
        lp = mb["old_log_probs"][mb["response_mask"] > 0]
        out["old_log_probs_min_mean"] = [float(lp.min()), float(lp.mean())] if lp.numel() else None
    return out
