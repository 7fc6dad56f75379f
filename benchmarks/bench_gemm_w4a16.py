"""W4A16 above the decode rows: bf16 activations x a 4-bit weight (the `w4a16-nvfp4` and `w4a16-mxfp4`
modes of dense_gemm, default dispatch), M = 32 .. 4096, against cuBLAS bf16 on the weight's exact
bf16 values, in one process on the same data. Weights rotate through copies worth twice the L2
(the small-M rows stream them). Each row names the backend dispatch gave the call
(sm90_engine, composition, ...), so a row never passes one backend's time off as another's.

    python benchmarks/bench_gemm_w4a16.py [--out benchmarks/results/h200-gemm-w4a16.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_common import RESULTS, load, write_results
from bench_gemm_skinny import MODES, check, copies, dequantized_bf16, median_us, rotating

FORMATS = ("w4a16-nvfp4", "w4a16-mxfp4")
MS = (32, 64, 256, 1024, 4096)
SHAPES = ((17408, 5120), (8192, 8192), (4096, 7168))

Tensor = torch.Tensor


def backend(fp4, b_format: str, m: int, n: int, k: int) -> str:
    major, minor = torch.cuda.get_device_capability()
    call = fp4._gemm.described_call("bf16", b_format, m=m, n=n, k=k)
    return call.backend(10 * major + minor) or "reference"


def timed_row(fp4, fmt: str, x: Tensor, packed: list, bf16: list) -> dict:
    """One format at one M: cuBLAS bf16 first, then ours, on the same activations and weight (packed:
    the weight's rotation copies, bf16: those of its exact bf16 values)."""
    w_bf16 = bf16[0][0]
    m, k, n = x.shape[0], x.shape[1], w_bf16.shape[0]
    b_format = fmt.removeprefix("w4a16-")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    cublas_us = median_us(rotating(lambda wb: torch.mm(x, wb.T, out=out), bf16))
    peer = torch.mm(x, w_bf16.T)

    def ours(b: Tensor, sfb: Tensor) -> None:
        fp4.dense_gemm(x, b, None, sfb, out, mode=fmt)

    ours_us = median_us(rotating(ours, packed))
    ours(*packed[0])  # the checked output: the first copy's
    r = {"op": "dense_gemm", "format": fmt, "M": m, "N": n, "K": k, "backend": backend(fp4, b_format, m, n, k),
         "ours_us": round(ours_us, 2), "cublas_bf16_us": round(cublas_us, 2),
         "ratio_vs_cublas_bf16": round(cublas_us / ours_us, 3), "check": check(out, peer)}  # fmt: skip
    print(f"{fmt:12s} M={m:5d} {n:5d}x{k:5d} {r['backend']:12s} ours {ours_us:8.1f} us cuBLAS bf16"
          f" {cublas_us:8.1f} us x{r['ratio_vs_cublas_bf16']:5.2f} check {r['check']:.1e}", flush=True)  # fmt: skip
    return r


def shape_rows(fp4, n: int, k: int) -> list[dict]:
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    weights = {}
    for fmt in FORMATS:
        b_format = fmt.removeprefix("w4a16-")
        b, sfb = fp4.group_wise_quant(w, MODES[b_format])
        weights[fmt] = (copies((b, sfb)), copies((dequantized_bf16(fp4, b, sfb, b_format),)))
    rows = []
    for m in MS:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        rows += [timed_row(fp4, fmt, x, packed, bf16) for fmt, (packed, bf16) in weights.items()]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-gemm-w4a16.json")
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    rows = []
    for n, k in SHAPES:
        rows += shape_rows(fp4, n, k)
        torch.cuda.empty_cache()
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
