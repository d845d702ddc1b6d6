"""benchmarks/gpu_cap_locate.py's GEMM sweep (issue 48): the linears it covers and the three forms of each, by hand
for the tiny shape, and a CPU sweep in float32 against float32 (every run finite, no difference)."""
import torch
from helpers import benchmark_module


def test_gemm_forms_and_sweep_on_the_tiny_shape():
    locate = benchmark_module("gpu_cap_locate")
    from reasonrl.bench.shapes import SHAPES

    tiny = SHAPES["tiny"]
    # hidden 128, 2 heads of 64, 1 key-value head: k_proj 128 -> 64; MLP 128 -> 256 -> 128; vocabulary 4096
    assert locate.gemm_forms(tiny) == {"q_proj": (128, 128), "k_proj": (128, 64), "mlp_up": (128, 256),
                                       "mlp_down": (256, 128), "lm_head": (128, 4096)}
    sweep = locate.gemm_sweep(tiny, tokens=32, repeats=2, device="cpu", dtype=torch.float32)
    assert sorted(sweep) == sorted(f"{name}.{form}" for name in ("q_proj", "k_proj", "mlp_up", "mlp_down", "lm_head")
                                   for form in ("forward", "grad_input", "grad_weight"))
    for check in sweep.values():
        assert check["runs"] == 2 and check["nonfinite_runs"] == 0 and check["max_abs_diff"] == 0.0
