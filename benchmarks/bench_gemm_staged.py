"""NVFP4-output and GeGLU GEMMs through the staged backend (csrc/gemm/staged.cu): what staging costs
over the same GEMM with a bf16 output, and the speed-up over the reference these functions ran
before (float64 math with PyTorch ops on the GPU). One process, same operands, the reference first,
medians of CUDA-event timings (triton.testing.do_bench).

    python benchmarks/bench_gemm_staged.py --out benchmarks/results/h200-gemm-staged.json
"""

from __future__ import annotations

import torch
from bench_common import median_us, on_reference, run

TIMING = {"warmup": 5, "rep": 50}  # the reference rows take seconds each
# (M, N_out, K): decode (the stage on the M <= 16 kernels), then the engine's
SHAPES = [(1, 17408, 5120), (16, 17408, 5120), (256, 4096, 4096), (4096, 4096, 4096), (4096, 17408, 5120)]


def nvfp4(fp4, rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return fp4.quantize_fp4_sfa_bf16(torch.randn(rows, k, device="cuda", dtype=torch.bfloat16))


def rows_for(fp4, m: int, n: int, k: int) -> list[dict]:
    a, sfa = nvfp4(fp4, m, k)
    b, sfb = nvfp4(fp4, n, k)
    b2, sfb2 = nvfp4(fp4, 2 * n, k)  # GeGLU's interleaved gate/up weight
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    calls = {
        "nvfp4_gemm_bf16": (a, b, sfa, sfb),
        "nvfp4_gemm_nvfp4": (a, b, sfa, sfb),
        "nvfp4_gemm_bias_gelu_nvfp4_fp16": (a, b, sfa, sfb, bias),
        "nvfp4_gemm_geglu_nvfp4_fp16": (a, b2, sfa, sfb2),
    }
    bf16_us = median_us(lambda: fp4.nvfp4_gemm_bf16(a, b, sfa, sfb), **TIMING)
    rows = []
    for name, args in calls.items():
        ours = getattr(fp4, name)
        theirs = on_reference(fp4, ours)
        reference_us = median_us(lambda fn=theirs, args=args: fn(*args), **TIMING)
        ours_us = median_us(lambda fn=ours, args=args: fn(*args), **TIMING)
        rows.append(
            {
                "op": name,
                "shape": [m, n, k],
                "us": round(ours_us, 1),
                "reference_us": round(reference_us, 1),
                "speedup_vs_reference": round(reference_us / ours_us, 1),
                "time_vs_bf16_output": round(ours_us / bf16_us, 2),
            }
        )
        r = rows[-1]
        print(f"{name:34s} {str(r['shape']):20s} {r['us']:9.1f} us  ref {r['reference_us']:10.1f} us  "
              f"x{r['speedup_vs_reference']:7.1f}  {r['time_vs_bf16_output']:.2f} of bf16-output time")  # fmt: skip
    return rows


if __name__ == "__main__":
    run("h200-gemm-staged.json", lambda fp4: [row for shape in SHAPES for row in rows_for(fp4, *shape)])
