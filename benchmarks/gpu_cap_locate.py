"""Which operation goes non-finite when the trainer's kernels are capped to a share of the SMs? -> JSON.

Issue 48, thirty-third session: under MPS with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60`` the real actor update alone
(``benchmarks/gpu_mps_nan.sh``, no replica beside it) had a NaN gradient norm and loss, and the no-grad comparison of
the fused and full-logits log-prob paths was NaN, where the same update with no limit was finite
(``benchmarks/results/s33_mps_nan_*.json``). Run this once as an MPS client with the limit and once without, in the
same environment; it records, each part on its own so that one failure leaves the others:

* ``ops``: each large operation of the 1.5B shape alone, on random inputs, against the same operation in float32 on
  the same device: the LM head's GEMM (a micro-batch of tokens x the vocabulary), the log-softmax over its output,
  the MLP's up projection, torch's varlen attention kernel (``reasonrl.models.varlen_attention._varlen_causal``,
  forward and backward) against one causal sdpa per sequence, and padded causal sdpa. Finite? Largest difference?
* ``gemms``: every GEMM of one decoder layer and the LM head, each in its three forms (the forward ``x @ w.T``, the
  input gradient ``dy @ w`` and the weight gradient ``dy.T @ x``, whose inner dimension is the micro-batch's tokens:
  the shape a library may split over the SMs), ``--repeats`` times each on fresh inputs: how many runs were not
  finite, and the largest difference from float32. The thirty-fourth session's lease (``s34_cap_locate_*.json``)
  found every op above finite under the cap, yet the traced grad pass had a NaN gradient norm with every module's
  activation gradient finite (packed varlen rows), and a NaN ``k_proj`` output in the forward (padded sdpa rows).
* ``passes``: the real actor (``benchmarks/gpu_update_mfu.py``'s worker: FSDP2, bf16, the GPU's default path, or
  what ``--set`` changes) on ``--rows`` rows of the synthetic batch, under ``reasonrl.bench.nan_trace.GradTrace``:
  no-grad log-probs through full logits and through the fused head (the first module whose forward output is not
  finite), then the fused log-probs' mean with grad and its backward (``localize``: the module whose own backward
  made the first non-finite gradient), ``--grad-repeats`` times; each repeat names the parameters whose gradient is
  not finite (``nonfinite_params``) and the norm again in float64 on the CPU (is the GPU's reduction the culprit?).

``--blas cublas|cublaslt`` sets torch's preferred BLAS library first (``torch.backends.cuda.preferred_blas_library``):
a workaround to try if the GEMMs are what the cap breaks.

    python benchmarks/gpu_cap_locate.py --out /tmp/out/cap_locate.json [--blas cublaslt] [--set KEY=VALUE ...]
    python benchmarks/gpu_cap_locate.py --shape tiny --out /tmp/cap_locate.json     # the CPU dry run
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any, Callable, Dict, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import reasonrl.models.forward as forward_module  # noqa: E402
from reasonrl.bench.nan_trace import GradTrace, compared, localize  # noqa: E402
from reasonrl.bench.records import exit_with_status, recorded, write  # noqa: E402
from reasonrl.bench.shapes import SHAPES, write_random_model  # noqa: E402
from reasonrl.bench.update_worker import (add_worker_arguments, fill_length_defaults, make_worker,  # noqa: E402
                                          synthetic_batch)
from reasonrl.models import varlen_attention  # noqa: E402


def guarded(fn: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """``fn()``, or the error it raised (one failing check leaves the others)."""
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # recorded, not raised: the JSON keeps every other check
        out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


def op_checks(shape: Dict[str, Any], tokens: int, device: str, dtype: torch.dtype) -> Dict[str, Any]:
    """Each large operation of the shape alone, in ``dtype`` against float32 (see the module docstring)."""
    g = torch.Generator(device=device).manual_seed(0)
    hidden, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = hidden // heads

    def rand(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=g, device=device) * scale).to(dtype)

    def gemm(cols: int) -> Dict[str, Any]:
        x, w = rand(tokens, hidden), rand(cols, hidden, scale=0.02)
        return compared(x @ w.T, x.float() @ w.float().T)

    def log_softmax() -> Dict[str, Any]:
        logits = rand(tokens, vocab, scale=3.0)
        return compared(torch.log_softmax(logits.float(), dim=-1), torch.log_softmax(logits.double(), -1).float())

    lengths = [tokens // 4, tokens // 4 + 7, tokens // 2 - 7]  # three sequences end to end
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device, dtype=torch.int32)
    n = int(cu_seqlens[-1])

    def varlen() -> Dict[str, Any]:
        q = rand(n, heads, head_dim).requires_grad_(True)
        k, v = rand(n, kv_heads, head_dim).requires_grad_(True), rand(n, kv_heads, head_dim).requires_grad_(True)
        if not varlen_attention.uses_kernel(q):
            return {"skipped": "no varlen kernel here (CPU, float32 or this torch)"}
        out = varlen_attention._varlen_causal(q, k, v, cu_seqlens, max(lengths))
        out.float().square().mean().backward()
        grads = [t.grad.clone() for t in (q, k, v)]
        ref_in = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
        ref = varlen_attention._per_sequence_sdpa(*ref_in, cu_seqlens, None)
        ref.square().mean().backward()
        return {"forward": compared(out, ref),
                **{f"grad_{name}": compared(a, b.grad) for name, a, b in zip("qkv", grads, ref_in)}}

    def padded_sdpa() -> Dict[str, Any]:
        rows, width = 4, min(tokens // 4, 2048)
        q, k, v = (rand(rows, heads, width, head_dim) for _ in range(3))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return compared(out, F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True))

    return {"gemm_lm_head": guarded(lambda: gemm(vocab)), "log_softmax_vocab": guarded(log_softmax),
            "gemm_mlp_up": guarded(lambda: gemm(inter)), "varlen_attention": guarded(varlen),
            "sdpa_padded": guarded(padded_sdpa)}


def gemm_forms(shape: Dict[str, Any]) -> Dict[str, Tuple[int, int]]:
    """(in_features, out_features) of each distinct linear of the shape: one decoder layer's and the LM head."""
    hidden, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = shape["num_key_value_heads"] * (hidden // shape["num_attention_heads"])
    return {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "mlp_up": (hidden, inter), "mlp_down": (inter, hidden),
            "lm_head": (hidden, vocab)}


def gemm_sweep(shape: Dict[str, Any], tokens: int, repeats: int, device: str, dtype: torch.dtype) -> Dict[str, Any]:
    """Each linear's forward, input-gradient and weight-gradient GEMM, ``repeats`` times on fresh inputs, in ``dtype``
    against float32: the runs that were not finite and the largest difference over all runs."""
    g = torch.Generator(device=device).manual_seed(1)
    out: Dict[str, Any] = {}
    for name, (fan_in, fan_out) in gemm_forms(shape).items():
        for form in ("forward", "grad_input", "grad_weight"):
            def one() -> Dict[str, Any]:
                bad, worst = 0, 0.0
                for _ in range(repeats):
                    x = torch.randn(tokens, fan_in, generator=g, device=device).to(dtype)
                    w = (torch.randn(fan_out, fan_in, generator=g, device=device) * 0.02).to(dtype)
                    dy = (torch.randn(tokens, fan_out, generator=g, device=device) * 0.01).to(dtype)
                    a, b = {"forward": (x, w.T), "grad_input": (dy, w), "grad_weight": (dy.T, x)}[form]
                    check = compared(a @ b, a.float() @ b.float())
                    bad += check["nonfinite_count"] > 0
                    worst = max(worst, check["max_abs_diff"])
                return {"runs": repeats, "nonfinite_runs": bad, "max_abs_diff": worst}
            out[f"{name}.{form}"] = guarded(one)
    return out


def traced_passes(worker, batch, grad_repeats: int = 1) -> Dict[str, Any]:
    """No-grad full-logits and fused log-probs, then the fused ones with grad and backward (``grad_repeats`` times:
    ``grad_fused``, ``grad_fused_1``, ...), each under GradTrace."""
    model = worker.policy.model
    mb = batch.to(worker.device)
    args = (mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"])
    mask = mb["response_mask"].float()

    def no_grad(fused: bool) -> Dict[str, Any]:
        model.eval()
        with torch.no_grad(), GradTrace(model) as tracer:
            lp, _ = forward_module.response_log_probs(model, *args, fused=fused)
        records = tracer.records
        bad = [r for r in records if not r["finite"]]
        return {"finite": bool(torch.isfinite(lp).all()), "log_prob_mean": float(lp[torch.isfinite(lp)].mean()),
                "nonfinite_records": len(bad), "records": len(records),
                "first_nonfinite_forward": bad[0] if bad else None}

    def with_grad() -> Dict[str, Any]:
        model.train()
        with GradTrace(model) as tracer:
            lp, _ = forward_module.response_log_probs(model, *args, fused=True)
            loss = -(lp * mask).sum() / mask.sum()
            loss.backward()
        found = localize(tracer.records)
        # FSDP2's gradients are DTensors: their local shards (all of it on one rank) for the checks and the CPU copy
        grads = [(name, getattr(p.grad, "to_local", lambda g=p.grad: g)()) for name, p in model.named_parameters()
                 if p.grad is not None]
        norm = torch.sqrt(sum(grad.float().square().sum() for _, grad in grads))
        bad = [name for name, grad in grads if not bool(torch.isfinite(grad).all())]
        cpu_sq = sum(float(grad.detach().to("cpu", torch.float64).square().sum()) for _, grad in grads)
        model.zero_grad(set_to_none=True)
        return {"loss": loss.item(), "grad_norm": norm.item(), "grad_norm_cpu_float64": cpu_sq ** 0.5,
                "nonfinite_params": len(bad), "nonfinite_param_names": bad[:12], **found}

    return {"no_grad_full_logits": guarded(lambda: no_grad(False)),
            "no_grad_fused": guarded(lambda: no_grad(True)),
            **{f"grad_fused_{i}" if i else "grad_fused": guarded(with_grad) for i in range(grad_repeats)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_worker_arguments(p)
    p.add_argument("--rows", type=int, default=8, help="rows of the traced passes (the path check's 8)")
    p.add_argument("--op-tokens", type=int, default=None, help="tokens of the model-free checks (default 8192; "
                                                                "tiny: 256): a micro-batch's budget")
    p.add_argument("--repeats", type=int, default=5, help="runs of each GEMM form in the sweep")
    p.add_argument("--grad-repeats", type=int, default=3, help="runs of the traced grad pass")
    p.add_argument("--blas", choices=["default", "cublas", "cublaslt"], default="default",
                   help="torch.backends.cuda.preferred_blas_library before anything runs (GPU only)")
    args = p.parse_args()
    if args.blas != "default" and torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library(args.blas)
    fill_length_defaults(args)
    op_tokens = args.op_tokens or (256 if args.shape == "tiny" else 8192)
    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    wall_start = time.perf_counter()
    result: Dict[str, Any] = {
        "benchmark": "gpu_cap_locate", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "cpus": os.cpu_count(),
                    "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else None,
                    "mps_active_thread_percentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                    "blas": str(torch.backends.cuda.preferred_blas_library()) if on_gpu else None},
    }
    with recorded(args.out, result, wall_start):
        result["ops"] = op_checks(SHAPES[args.shape], op_tokens, device, dtype)
        write(args.out, result)
        result["gemms"] = gemm_sweep(SHAPES[args.shape], op_tokens, args.repeats, device, dtype)
        write(args.out, result)
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        worker = make_worker(model_dir, args, False, on_gpu, extra=args.set)
        result["passes"] = traced_passes(worker, synthetic_batch(args, int(SHAPES[args.shape]["vocab_size"])),
                                         args.grad_repeats)
    for part in ("ops", "gemms", "passes"):
        for name, check in result.get(part, {}).items():
            print(part, name, {k: v for k, v in check.items() if k not in ("candidates", "first_nonfinite_grad")},
                  flush=True)
    print(f"wrote {args.out} ({result['status']})", flush=True)
    exit_with_status(result)


if __name__ == "__main__":
    main()
