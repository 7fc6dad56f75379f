"""The skinny tier's two kernels side by side on dense decode: the staged kernel (variant 3) and the
register-streaming kernel (variant 4) at each K split over a cluster (splits S = 1: one CTA per K
range; "auto": the split its planner picks), and the planner's choice of kernel (variant -1),
against cuBLAS bf16 on the dequantized weight, in one process, on the same data, with
bench_gemm_skinny.py's method (the L2 cleared before every run, weights rotated through copies worth
twice the L2, CUDA-event medians, copy bandwidth measured at the start). Each row names the kernel
that ran ("ran": variant 4 runs the staged kernel where its activations do not fit). --sweep-knobs
also times the register-streaming kernel's knobs (warps: K sub-slices of a CTA; stages: 16-row tiles
per CTA) at S = 1 on NVFP4. Above 16 rows (--ms 24 32 48 64) dispatch's choice, the Hopper engine
by default, runs against the register-streaming kernel (sm_90: its 4 and 8 token tiles).

    python benchmarks/bench_skinny_kernels.py --out benchmarks/results/h200-skinny-kernels.json
    python benchmarks/bench_skinny_kernels.py --formats mxfp8 --shapes 17408x5120 5120x17408 4096x7168 \
        2048x7168 1536x7168 --out benchmarks/results/h200-skinny-kernels-mxfp8.json
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
from bench_common import RESULTS, load, write_results
from bench_gemm_skinny import Weight, check, copy_bandwidth_gbps, dense_cases, gemm_op, median_us, rotating

STAGED, REGISTER_STREAM, PLANNER = 3, 4, -1
STAGED_MAX_ROWS = 16
SHAPES = ((17408, 5120), (5120, 17408), (4096, 7168), (1536, 7168))
FORMATS = ("nvfp4", "w4a16-nvfp4")
MS = (1, 4, 8, 16)
SPLITS = (1, 2, 4, 8, 0)  # 0: the register-streaming planner's split
KNOB_MS = (1, 8)
KNOBS = tuple(itertools.product((4, 8), (1, 2, 4, 8)))  # (warps, stages)


def kernel_ran(fn) -> str:
    """The skinny kernel one call of fn launches (torch.profiler), by its template's name."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    for kernel in ("register_stream_kernel", "skinny_gemm_kernel", "engine_kernel"):
        if any(kernel in name for name in names):
            return kernel
    return ",".join(names)


def time_kernel(fp4, weight: Weight, a, sfa, out, variant: int, warps: int, stages: int,
                splits: int) -> tuple[float, str]:  # fmt: skip
    """Median us of the gemm op on the rotating weight copies, the kernel it ran, then one call on
    the first copy into out."""

    def call(b, sfb):
        return gemm_op(fp4, a, b, sfa, sfb, weight.a_format, weight.b_format, out, warps=warps, stages=stages,
                       splits=splits, variant=variant)  # fmt: skip

    us = median_us(rotating(call, weight.copies))
    out.fill_(float("nan"))
    ran = kernel_ran(lambda: call(*weight.copies[0]))
    return us, ran


def configurations(fmt: str, m: int, splits: tuple[int, ...], sweep: bool) -> list[tuple[str, int, int, int, int]]:
    """(kernel, variant, warps, stages, splits) to time for one case. Above 16 rows the staged kernel
    serves nothing: dispatch's choice (the Hopper engine unless the planner takes the
    register-streaming kernel; "ran" names it) against the register-streaming kernel."""
    if m > STAGED_MAX_ROWS:
        return [("planner", PLANNER, 0, 0, 0)] + [("register-stream", REGISTER_STREAM, 0, 0, s) for s in splits]
    configs = [("staged", STAGED, 0, 0, 0)]
    configs += [("register-stream", REGISTER_STREAM, 0, 0, s) for s in splits]
    configs.append(("planner", PLANNER, 0, 0, 0))
    if sweep and fmt == "nvfp4" and m in KNOB_MS:
        configs += [("register-stream", REGISTER_STREAM, wp, st, 1) for wp, st in KNOBS]
    return configs


def shape_rows(fp4, n: int, k: int, copy_bw: float, args: argparse.Namespace) -> list[dict]:
    rows = []
    for c in dense_cases(fp4, n, k, tuple(args.formats), tuple(args.ms)):
        for kernel, variant, warps, stages, splits in configurations(c.fmt, c.m, tuple(args.splits), args.sweep_knobs):
            us, ran = time_kernel(fp4, c.weight, c.a, c.sfa, c.out, variant, warps, stages, splits)
            fraction = c.traffic / us / 1e3 / copy_bw
            err = check(c.out, c.peer)
            rows.append({"format": c.fmt, "kernel": kernel, "splits": splits, "warps": warps, "stages": stages,
                         "ran": ran, "M": c.m, "N": n, "K": k, "bytes": c.traffic, "ours_us": round(us, 2),
                         "cublas_bf16_us": round(c.peer_us, 2), "fraction_of_copy_bw": round(fraction, 3),
                         "copy_bw": round(copy_bw, 1), "check": err})  # fmt: skip
            print(f"{c.fmt:12s} {kernel:16s} S={splits} w={warps} s={stages} M={c.m:2d} {n:5d}x{k:5d} {us:8.2f} us "
                  f"({fraction:5.3f} of copy bw) cuBLAS {c.peer_us:7.2f} us check {err:.1e} ran {ran}",
                  flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-skinny-kernels.json")
    parser.add_argument("--shapes", type=lambda s: tuple(int(x) for x in s.split("x")), nargs="+", default=SHAPES)
    parser.add_argument("--ms", type=int, nargs="+", default=MS)
    parser.add_argument("--formats", nargs="+", default=FORMATS)
    parser.add_argument("--splits", type=int, nargs="+", default=SPLITS)
    parser.add_argument("--sweep-knobs", action="store_true")
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth_gbps()
    print(f"device-to-device copy: {copy_bw:.0f} GB/s", flush=True)
    rows = []
    for n, k in args.shapes:
        rows += shape_rows(fp4, n, k, copy_bw, args)
        torch.cuda.empty_cache()
    write_results(args.out, rows, copy_bw_GBps=round(copy_bw, 1))


if __name__ == "__main__":
    main()
