"""``model.attn_implementation=varlen`` on the GPU: log-probs and gradients of packed rows through torch's varlen
kernel against the padded sdpa path, and the time of each -> JSON.

    PYTHONPATH=. python3 benchmarks/gpu_varlen_check.py [--shape qwen2.5-1.5b] [--rows 32] [--prompt-len 128]
        [--median 400] [--max-len 2048] [--repeats 3] [--out PATH]
    PYTHONPATH=. python3 benchmarks/gpu_varlen_check.py --shape tiny     # the CPU dry run (fp32, per-sequence sdpa)

Needs only torch (2.11 on: ``torch.nn.attention.varlen``), transformers and peft: no Ray, vLLM or OmegaConf. One
random-weight Qwen2 model of ``--shape`` (``reasonrl.bench.shapes.SHAPES``; bf16 on a GPU, fp32 on a CPU) scores
``--rows`` long-tailed rows (``reasonrl.bench.lengths.response_lengths("longtail", ...)``, random prompt and
response tokens):

- ``padded_sdpa``: the rows padded (prompts left, responses right), sdpa with the padding mask, as
  ``actor.use_packing=false`` runs them;
- ``packed_varlen``: the same model switched to ``varlen`` (reasonrl/models/varlen_attention.py) on the packed row,
  as ``actor.use_packing`` with ``model.attn_implementation=auto`` runs them on a GPU.

Each: the token-mean log-prob loss's forward + backward (gradient checkpointing on the GPU), ``--repeats`` times after
one untimed call. On a GPU a third, untimed pass gives the reference: the same model in float32 on the packed row
(float32 runs each sequence through sdpa alone: exact causal attention with no padding). Both bf16 paths are
compared with it (log-prob differences on response tokens; each parameter's relative gradient difference
``|g - g_ref| / |g_ref|``): the check passes (exit 0) when varlen's error is at most ``ERROR_RATIO`` times the padded
sdpa path's (plus a floor of 1e-3), i.e. the new default is as accurate as the path it replaces, and the varlen kernel
itself ran (``kernel``). On the CPU (fp32, no kernel) varlen's per-sequence fallback must equal padded sdpa to 1e-4.
Written to ``--out``, else ``$OUT/gpu_varlen_check.json`` when OUT is set, else
benchmarks/results/gpu_varlen_check[_tiny].json.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from reasonrl.bench.lengths import response_lengths  # noqa: E402
from reasonrl.bench.records import RESULTS, exit_with_status, recorded  # noqa: E402
from reasonrl.bench.shapes import SHAPES  # noqa: E402
from reasonrl.data.collate import collate_rollout  # noqa: E402
from reasonrl.models import varlen_attention  # noqa: E402
from reasonrl.models.forward import micro_batch_log_probs  # noqa: E402

ERROR_RATIO = 1.25
"""On a GPU: varlen's error against the float32 reference may be at most this times padded sdpa's (bf16 both)."""
ERROR_FLOOR = 1e-3
FP32_TOLERANCE = 1e-4
"""On the CPU (fp32): the largest log-prob and relative gradient difference between the two paths."""


def build_model(shape: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, Qwen2Config

    vocab = int(SHAPES[shape]["vocab_size"])
    config = Qwen2Config(**SHAPES[shape], hidden_act="silu", initializer_range=0.02, use_sliding_window=False,
                         bos_token_id=None, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if device == "cuda":
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    return model.train()


def long_tailed_rows(args, vocab: int, device: str) -> Dict[str, torch.Tensor]:
    rng = random.Random(0)
    lengths = response_lengths("longtail", args.rows, args.max_len, args.median, seed=0)
    prompts = [[rng.randrange(1, vocab - 1) for _ in range(rng.randint(args.prompt_len // 2, args.prompt_len))]
               for _ in range(args.rows)]
    responses = [[rng.randrange(1, vocab - 1) for _ in range(n)] for n in lengths]
    batch = collate_rollout(prompts, responses, [[0.0] * len(r) for r in responses], pad_id=vocab - 1)
    return {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids", "responses",
                                              "response_mask")}


def forward_backward(model, rows: Dict[str, torch.Tensor], packed: bool) -> torch.Tensor:
    """The token-mean log-prob loss's forward and backward; returns the log-probs [rows, T] (detached)."""
    model.zero_grad(set_to_none=True)
    log_probs, _ = micro_batch_log_probs(model, rows["input_ids"], rows["attention_mask"], rows["position_ids"],
                                         rows["responses"], packed=packed)
    mask = rows["response_mask"].float()
    (-(log_probs * mask).sum() / mask.sum()).backward()
    return log_probs.detach()


def timed_runs(model, rows, packed: bool, repeats: int, device: str) -> Tuple[torch.Tensor, List[float]]:
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    log_probs = forward_backward(model, rows, packed)  # untimed: kernels chosen, allocator warm
    seconds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        log_probs = forward_backward(model, rows, packed)
        sync()
        seconds.append(time.perf_counter() - start)
    return log_probs, seconds


def gradients(model) -> Dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def errors_against(ref_lp: torch.Tensor, ref_grads: Dict[str, torch.Tensor], lp: torch.Tensor,
                   grads: Dict[str, torch.Tensor], mask: torch.Tensor) -> Dict[str, Any]:
    """Log-prob differences on the response tokens and relative gradient differences of ``lp``/``grads`` against
    the reference ones."""
    diff = (lp.float() - ref_lp.float())[mask].abs()
    rel = compare(ref_grads, grads)
    worst = max(rel, key=rel.get)
    return {"log_prob_mean": float(diff.mean()), "log_prob_max": float(diff.max()), "grad_rel_max": rel[worst],
            "grad_rel_max_parameter": worst, "grad_rel_median": statistics.median(rel.values())}


def compare(reference: Dict[str, torch.Tensor], other: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Relative difference |other - reference| / |reference| of each parameter's gradient (float32 norms)."""
    out = {}
    for name, ref in reference.items():
        ref32, oth32 = ref.float(), other[name].float()
        out[name] = float((oth32 - ref32).norm() / ref32.norm().clamp_min(1e-30))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--median", type=int, default=400)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.shape == "tiny":  # the CPU dry run: short rows
        args.rows, args.prompt_len, args.median, args.max_len = min(args.rows, 8), 16, 24, 64
    default_out = Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS
    out = args.out or default_out / ("gpu_varlen_check_tiny.json" if args.shape == "tiny" else "gpu_varlen_check.json")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    result: Dict[str, Any] = {
        "benchmark": "gpu_varlen_check", "shape": args.shape, "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""), "args": vars(args) | {"out": str(out)},
        "varlen_attn_importable": varlen_attention.varlen_kernel_importable(),
    }
    with recorded(out, result, time.perf_counter()):
        if result["varlen_attn_importable"]:
            result["varlen_attn_parameters"] = sorted(varlen_attention._varlen_parameters())
        model = build_model(args.shape, device, dtype)
        rows = long_tailed_rows(args, int(SHAPES[args.shape]["vocab_size"]), device)
        valid = int(rows["attention_mask"].sum())
        result["tokens"] = {"valid": valid, "padded": int(rows["input_ids"].numel()),
                            "response": int(rows["response_mask"].sum())}
        padded_lp, padded_s = timed_runs(model, rows, packed=False, repeats=args.repeats, device=device)
        padded_grads = gradients(model)
        varlen_attention.register_varlen_attention()
        model.set_attn_implementation(varlen_attention.VARLEN_ATTENTION)
        probe = torch.zeros(1, 1, 1, 1, device=device, dtype=dtype)
        result["kernel"] = varlen_attention.uses_kernel(probe)  # the varlen kernel, not the per-sequence fallback
        packed_lp, packed_s = timed_runs(model, rows, packed=True, repeats=args.repeats, device=device)
        packed_grads = gradients(model)
        mask = rows["response_mask"].bool()
        result["seconds"] = {"padded_sdpa": padded_s, "packed_varlen": packed_s,
                             "padded_sdpa_median": statistics.median(padded_s),
                             "packed_varlen_median": statistics.median(packed_s)}
        result["speedup"] = result["seconds"]["padded_sdpa_median"] / result["seconds"]["packed_varlen_median"]
        if device == "cuda":
            result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
        result["finite"] = bool(torch.isfinite(padded_lp[mask]).all() and torch.isfinite(packed_lp[mask]).all())
        failures = [] if result["finite"] else ["non-finite log-probs"]
        if device == "cuda":
            model.float()  # the reference: float32, each sequence alone (the fallback), no padding
            ref_lp, _ = timed_runs(model, rows, packed=True, repeats=0, device=device)
            ref_grads = gradients(model)
            errors = {name: errors_against(ref_lp, ref_grads, lp, grads, mask)
                      for name, lp, grads in (("padded_sdpa", padded_lp, padded_grads),
                                              ("packed_varlen", packed_lp, packed_grads))}
            result["error_vs_fp32"] = errors
            result["error_ratio_limit"] = ERROR_RATIO
            for key in ("log_prob_mean", "log_prob_max", "grad_rel_max", "grad_rel_median"):
                bound = ERROR_RATIO * errors["padded_sdpa"][key] + ERROR_FLOOR
                if errors["packed_varlen"][key] > bound:
                    failures.append(f"varlen's {key} error {errors['packed_varlen'][key]:.4g} > {bound:.4g} "
                                    f"({ERROR_RATIO} x padded sdpa's {errors['padded_sdpa'][key]:.4g})")
            if not result["kernel"]:
                failures.append("the varlen kernel did not run (torch without torch.nn.attention.varlen?)")
        else:
            between = errors_against(padded_lp, padded_grads, packed_lp, packed_grads, mask)
            result["difference"] = between
            if max(between["log_prob_max"], between["grad_rel_max"]) > FP32_TOLERANCE:
                failures.append(f"varlen's fallback differs from padded sdpa: {between}")
        result["checks_passed"] = not failures
        result["failures"] = failures
        print({k: result.get(k) for k in ("device", "torch", "kernel", "tokens", "seconds", "speedup", "error_vs_fp32",
                                          "difference", "failures")}, flush=True)
        if failures:
            raise AssertionError("; ".join(failures))
    exit_with_status(result)


if __name__ == "__main__":
    main()
