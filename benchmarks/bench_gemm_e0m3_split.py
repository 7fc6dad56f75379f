"""The E0M3 split backend (csrc/gemm/e0m3_split.cu), run by name on an H200: what splitting each E0M3
integer into two E2M1 values costs against the Hopper engine, which reads E0M3 itself, and how much
of it is the NVFP4 GEMM over K' (the same GEMM alone, on operands split once; the difference is the
split kernels plus the spread between two separately timed medians). On Blackwell the split feeds
the CUTLASS FP4 kernels instead (not measured: no Blackwell GPU). One process, same operands, the
engine first, medians of CUDA-event timings (triton.testing.do_bench).

    python benchmarks/bench_gemm_e0m3_split.py --out benchmarks/results/h200-gemm-e0m3-split.json
"""

from __future__ import annotations

import torch
from bench_common import median_us, run

SHAPES = [(256, 4096, 4096), (4096, 4096, 4096), (4096, 17408, 5120)]  # (M, N, K)
A_FORMATS = {"nvfp4": 1, "e0m3": 0}  # name -> e0m3_weight_gemm_fp16's a_format


def gemm_on(fp4, backend: str, a, b, sfa, sfb, a_format: str, b_format: str, out) -> None:
    fp4._gemm.GemmCall(a, b, sfa, sfb, a_format, b_format, out=out, out_format="fp16", pdl=False).run_on(backend)


def operand(fp4, fmt: str, rows: int, k: int):
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    return fp4.quantize_e0m3_sfa_fp16(x.half()) if fmt == "e0m3" else fp4.quantize_fp4_sfa_bf16(x)


def row_for(fp4, a_format: str, m: int, n: int, k: int) -> dict:
    a, sfa = operand(fp4, a_format, m, k)
    b, sfb = operand(fp4, "e0m3", n, k)
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    split = 2 * (2 if a_format == "e0m3" else 1)
    # The inner GEMM alone: NVFP4 operands of the split's K' (their values do not change its time).
    a2, sfa2 = operand(fp4, "nvfp4", m, split * k)
    b2, sfb2 = operand(fp4, "nvfp4", n, split * k)
    engine_us = median_us(lambda: fp4.e0m3_weight_gemm_fp16(a, b, sfa, sfb, a_format=A_FORMATS[a_format], out=out))
    split_us = median_us(lambda: gemm_on(fp4, "e0m3_split", a, b, sfa, sfb, a_format, "e0m3", out))
    inner_us = median_us(lambda: gemm_on(fp4, "sm90_engine", a2, b2, sfa2, sfb2, "nvfp4", "nvfp4", out))
    row = {
        "a_format": a_format,
        "shape": [m, n, k],
        "k_prime": split * k,
        "engine_us": round(engine_us, 1),
        "split_us": round(split_us, 1),
        "inner_gemm_us": round(inner_us, 1),
        "split_time_vs_engine": round(split_us / engine_us, 2),
    }
    print(f"{a_format:6s} {str(row['shape']):20s} engine {engine_us:8.1f} us  split {split_us:8.1f} us "
          f"(the GEMM over K' alone {inner_us:8.1f} us) x{split_us / engine_us:.2f}")  # fmt: skip
    return row


if __name__ == "__main__":
    run("h200-gemm-e0m3-split.json", lambda fp4: [row_for(fp4, f, *shape) for f in A_FORMATS for shape in SHAPES])
