"""Decode and speculative-verify GEMMs (M <= 16): ours against cuBLAS bf16 on the dequantized weight, in
one process, on the same data, the peer first.

For each format, (N, K) and M: random bf16 activations [M, K] and weights [N, K] (N(0, 0.05)) are
quantized with the package (group_wise_quant); cuBLAS multiplies the exactly dequantized bf16 operands
(torch.nn.functional.linear), ours the quantized bytes through the public function named in "op". Both
cycle through copies of their weight worth more than twice the L2, and triton.testing.do_bench clears
the L2 before every run: each run streams the weight from HBM, as decode does. Times are medians.

Per row: bytes = the weight's values and scales + the activation's values and scales + the bf16
output; GBps = bytes / ours_us; fraction_of_copy_bw = GBps / 4250 (the device-to-device copy bandwidth
measured on the H200); target_us = 1.25 * bytes / 4.25 TB/s (the issue's target);
ratio_vs_cublas_bf16 = cuBLAS time / ours (above 1, ours is faster); check = max |ours - cuBLAS| /
max |cuBLAS| (both exact up to float32 summation order and the bf16 output rounding).

    python benchmarks/bench_gemm_skinny.py --out benchmarks/results/h200-gemm-skinny.json
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from pathlib import Path

import torch
from bench_common import RESULTS, load, median_us, write_results

COPY_BW_GBPS = 4250.0
TARGET_FACTOR = 1.25
L2_BYTES = 60 * 2**20
FORMATS = ("nvfp4", "mxfp4", "mxfp8")
MODES = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4", "mxfp8": "w8a8-mxfp8"}
MS = (1, 2, 4, 8, 16)
SHAPES = ((17408, 5120), (5120, 17408), (12288, 5120))

Tensor = torch.Tensor


def nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def copies(tensors: tuple[Tensor, ...]) -> list[tuple[Tensor, ...]]:
    """Enough copies of a weight that cycling through them overruns the L2 twice."""
    count = max(2, -(-2 * L2_BYTES // nbytes(*tensors)))
    return [tuple(t.clone() for t in tensors) for _ in range(count)]


def rotating(fn: Callable[..., Tensor], weights: list[tuple[Tensor, ...]]) -> Callable[[], Tensor]:
    """fn on the next weight copy at every call."""
    cycle = itertools.cycle(weights)
    return lambda: fn(*next(cycle))


def ours_calls(fp4, fmt: str, a: Tensor, sfa: Tensor, weights: list[tuple[Tensor, ...]], out: Tensor) -> dict:
    """op name -> (call(b, sfb) writing out, the weight copies it takes) for this format and M."""
    if fmt != "nvfp4":
        return {"dense_gemm": (lambda b, sfb: fp4.dense_gemm(a, b, sfa, sfb, out, mode=MODES[fmt]), weights)}
    calls = {
        "nvfp4_gemm_bf16": (lambda b, sfb: fp4.nvfp4_gemm_bf16(a, b, sfa, sfb, out=out), weights),
        "fp4_w4a4_gemm_warpsplit_mrows_bf16": (
            lambda b, sfb: fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(a, b, sfa, sfb, out=out),
            weights,
        ),
    }
    if a.shape[0] == 1:
        streamed = [(fp4.fp4_repack_b_interleaved_sm120(b), sfb) for b, sfb in weights]
        calls["fp4_w4a4_gemv_warpsplit_interleaved_bf16"] = (
            lambda b, sfb: fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, b, sfa, sfb, out=out),
            streamed,
        )
    return calls


def shape_rows(fp4, fmt: str, n: int, k: int) -> list[dict]:
    ref = fp4.reference
    fmt_info = ref.FORMATS[fmt]
    b, sfb = fp4.group_wise_quant((torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16), MODES[fmt])
    weights = copies((b, sfb))
    dense_weights = copies((ref.dequantize(b, sfb, fmt_info).to(torch.bfloat16),))
    rows = []
    for m in MS:
        a, sfa = fp4.group_wise_quant(torch.randn(m, k, device="cuda").to(torch.bfloat16), MODES[fmt])
        a_bf16 = ref.dequantize(a, sfa, fmt_info).to(torch.bfloat16)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        peer_out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        cublas = rotating(lambda w, a_bf16=a_bf16, peer_out=peer_out: torch.mm(a_bf16, w.T, out=peer_out),
                          dense_weights)  # fmt: skip
        traffic = nbytes(b, sfb, a, sfa, out)
        for op, (call, op_weights) in ours_calls(fp4, fmt, a, sfa, weights, out).items():
            cublas_us = median_us(cublas)  # the peer first, then ours
            ours_us = median_us(rotating(call, op_weights))
            call(*op_weights[0])
            peer = torch.mm(a_bf16, dense_weights[0][0].T)
            check = float((out.float() - peer.float()).abs().max() / peer.float().abs().max())
            gbps = traffic / ours_us / 1e3
            rows.append(
                {
                    "op": op,
                    "format": fmt,
                    "M": m,
                    "N": n,
                    "K": k,
                    "bytes": traffic,
                    "ours_us": round(ours_us, 2),
                    "cublas_bf16_us": round(cublas_us, 2),
                    "ratio_vs_cublas_bf16": round(cublas_us / ours_us, 3),
                    "GBps": round(gbps, 1),
                    "fraction_of_copy_bw": round(gbps / COPY_BW_GBPS, 3),
                    "target_us": round(TARGET_FACTOR * traffic / COPY_BW_GBPS / 1e3, 2),
                    "check": round(check, 5),
                }
            )
            r = rows[-1]
            print(
                f"{op:42s} {fmt:6s} M={m:2d} {n:5d}x{k:5d} ours {r['ours_us']:8.1f} us (target {r['target_us']:6.1f})"
                f" cuBLAS {r['cublas_bf16_us']:8.1f} us x{r['ratio_vs_cublas_bf16']:5.2f}"
                f" {r['fraction_of_copy_bw']:5.2f} of copy bw, check {r['check']:.1e}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-gemm-skinny.json")
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    rows = []
    for fmt in args.formats:
        for n, k in SHAPES:
            rows += shape_rows(fp4, fmt, n, k)
            torch.cuda.empty_cache()
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
