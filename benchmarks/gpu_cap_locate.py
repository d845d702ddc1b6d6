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
* ``passes``: the real actor (``benchmarks/gpu_update_mfu.py``'s worker: FSDP2, bf16, the GPU's default path, or
  what ``--set`` changes) on ``--rows`` rows of the synthetic batch, under ``reasonrl.bench.nan_trace.GradTrace``:
  no-grad log-probs through full logits and through the fused head (the first module whose forward output is not
  finite), then the fused log-probs' mean with grad and its backward (``localize``: the module whose own backward
  made the first non-finite gradient).

    python benchmarks/gpu_cap_locate.py --out /tmp/out/cap_locate.json [--set model.attn_implementation=sdpa ...]
    python benchmarks/gpu_cap_locate.py --shape tiny --out /tmp/cap_locate.json     # the CPU dry run
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any, Callable, Dict

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


def traced_passes(worker, batch) -> Dict[str, Any]:
    """No-grad full-logits and fused log-probs, then the fused ones with grad and backward, each under GradTrace."""
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
        norm = torch.sqrt(sum(p.grad.float().square().sum() for p in model.parameters() if p.grad is not None))
        model.zero_grad(set_to_none=True)
        return {"loss": loss.item(), "grad_norm": norm.item(), **found}

    return {"no_grad_full_logits": guarded(lambda: no_grad(False)),
            "no_grad_fused": guarded(lambda: no_grad(True)), "grad_fused": guarded(with_grad)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_worker_arguments(p)
    p.add_argument("--rows", type=int, default=8, help="rows of the traced passes (the path check's 8)")
    p.add_argument("--op-tokens", type=int, default=None, help="tokens of the model-free checks (default 8192; "
                                                                "tiny: 256): a micro-batch's budget")
    args = p.parse_args()
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
                    "mps_active_thread_percentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")},
    }
    with recorded(args.out, result, wall_start):
        result["ops"] = op_checks(SHAPES[args.shape], op_tokens, device, dtype)
        write(args.out, result)
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        worker = make_worker(model_dir, args, False, on_gpu, extra=args.set)
        result["passes"] = traced_passes(worker, synthetic_batch(args, int(SHAPES[args.shape]["vocab_size"])))
    for part in ("ops", "passes"):
        for name, check in result.get(part, {}).items():
            print(part, name, {k: v for k, v in check.items() if k not in ("candidates", "first_nonfinite_grad")},
                  flush=True)
    print(f"wrote {args.out} ({result['status']})", flush=True)
    exit_with_status(result)


if __name__ == "__main__":
    main()
