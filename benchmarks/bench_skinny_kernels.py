"""The skinny tier's two kernels side by side on dense decode: the staged kernel (variant 3) and the
register-streaming kernel (variant 4), against cuBLAS bf16 on the dequantized weight, in one
process, on the same data, with bench_gemm_skinny.py's method (the L2 cleared before every run,
weights rotated through copies worth twice the L2, CUDA-event medians, copy bandwidth measured at
the start). --sweep-knobs also times the register-streaming kernel's knobs (warps: K slices of a
CTA; stages: 16-row tiles per CTA) on NVFP4.

    python benchmarks/bench_skinny_kernels.py --out benchmarks/results/h200-skinny-kernels.json
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
from bench_common import RESULTS, load, write_results
from bench_gemm_skinny import Weight, check, copy_bandwidth_gbps, dense_cases, gemm_op, median_us, rotating

KERNELS = {"staged": 3, "register-stream": 4}
SHAPES = ((17408, 5120), (8192, 8192), (4096, 7168), (1536, 7168))
FORMATS = ("nvfp4", "w4a16-nvfp4", "mxfp4", "w4a16-mxfp4")
MS = (1, 2, 4, 8)
KNOB_MS = (1, 8)
KNOBS = tuple(itertools.product((4, 8), (1, 2, 4, 8)))  # (warps, stages)


def time_kernel(fp4, weight: Weight, a, sfa, out, variant: int, warps: int, stages: int) -> float:
    """Median us of the gemm op on the rotating weight copies, then one call on the first into out."""

    def call(b, sfb):
        return gemm_op(fp4, a, b, sfa, sfb, weight.a_format, weight.b_format, out, warps=warps, stages=stages,
                       variant=variant)  # fmt: skip

    us = median_us(rotating(call, weight.copies))
    out.fill_(float("nan"))
    call(*weight.copies[0])
    return us


def shape_rows(fp4, n: int, k: int, copy_bw: float, sweep: bool) -> list[dict]:
    rows = []
    for c in dense_cases(fp4, n, k, FORMATS, MS):
        knobs = [(kernel, variant, 0, 0) for kernel, variant in KERNELS.items()]
        if sweep and c.fmt == "nvfp4" and c.m in KNOB_MS:
            knobs += [("register-stream", KERNELS["register-stream"], wp, st) for wp, st in KNOBS]
        for kernel, variant, warps, stages in knobs:
            us = time_kernel(fp4, c.weight, c.a, c.sfa, c.out, variant, warps, stages)
            fraction = c.traffic / us / 1e3 / copy_bw
            err = check(c.out, c.peer)
            rows.append({"format": c.fmt, "kernel": kernel, "warps": warps, "stages": stages, "M": c.m, "N": n,
                         "K": k, "bytes": c.traffic, "ours_us": round(us, 2), "cublas_bf16_us": round(c.peer_us, 2),
                         "fraction_of_copy_bw": round(fraction, 3), "copy_bw": round(copy_bw, 1),
                         "check": err})  # fmt: skip
            print(f"{c.fmt:12s} {kernel:16s} w={warps} s={stages} M={c.m:2d} {n:5d}x{k:5d} {us:8.2f} us "
                  f"({fraction:5.3f} of copy bw) cuBLAS {c.peer_us:7.2f} us check {err:.1e}", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-skinny-kernels.json")
    parser.add_argument("--sweep-knobs", action="store_true")
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth_gbps()
    print(f"device-to-device copy: {copy_bw:.0f} GB/s", flush=True)
    rows = []
    for n, k in SHAPES:
        rows += shape_rows(fp4, n, k, copy_bw, args.sweep_knobs)
        torch.cuda.empty_cache()
    write_results(args.out, rows, copy_bw_GBps=round(copy_bw, 1))


if __name__ == "__main__":
    main()
