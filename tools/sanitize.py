#!/usr/bin/env python3
"""Run every native kernel family once at small shapes, for compute-sanitizer:

    compute-sanitizer --tool memcheck  python tools/sanitize.py
    compute-sanitizer --tool racecheck python tools/sanitize.py --no-cluster-split --skip-backends composition \
        --ms 1 5 16 32 64 256

Quantizers (every recipe and layout), the dequantizer, SwiGLU + quant, the MoE permute, the repack,
and every GEMM backend of the build that serves each case on this GPU, run by name (`gemm_on`):
dense M = 1 .. 1024 (every operand pair, W4A16 included) with each kernel of the skinny tier (cluster
K splits included) and each engine tile and schedule, grouped (masked, contiguous), NVFP4 outputs.
Loads the build the way the tests do (FP4_GEMM_BUILD_DIR, else build/). Prints one line per launch
group; results are checked by the tests, not here. racecheck's options: the skinny tier's cluster
hand-over and cuBLAS's own kernels are what it cannot judge (the options' help says why).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from types import ModuleType

import torch
from kernels import get_local_kernel

ROOT = Path(__file__).resolve().parent.parent
MODES = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4", "mxfp8": "w8a8-mxfp8"}
N, K = 256, 4096
# knobs that pick a kernel or a schedule inside a backend (docs/API.md): the skinny tier's staged (3)
# and register-streaming (4) kernels with their cluster K splits, the engine's tiles and stream-K (on
# 3 SMs, 1024 rows: whole tiles before the split ones)
KNOBS = [
    {},
    {"variant": 3, "splits": 1},
    {"variant": 3, "splits": 3},
    {"variant": 4, "splits": 1},
    {"variant": 4, "splits": 2},
    {"variant": 4, "splits": 8},
    {"variant": 0},
    {"variant": 1},
    {"variant": 2},
    {"schedule": "streamk"},
    {"sm_count": 3},
]


def load() -> ModuleType:
    build = Path(os.environ.get("FP4_GEMM_BUILD_DIR", ROOT / "build")).resolve()
    return get_local_kernel(ROOT if build == ROOT / "build" else build)


def operands(fp4: ModuleType, fmt: str, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16)
    if fmt == "bf16":
        return x, None
    if fmt == "e0m3":
        return fp4.quantize_e0m3_sfa_fp16(x.half())
    return fp4.group_wise_quant(x, MODES[fmt])


def run_quantizers(fp4: ModuleType) -> None:
    x = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
    for mode in MODES.values():
        fp4.group_wise_quant(x, mode)
        fp4.group_wise_quant(x, mode, use_swizzle=False)
    packed, sf = fp4.quantize_fp4_sfa_fp16(x.half())
    fp4.quantize_fp4_sfa_mse_bf16(x)
    fp4.quantize_e0m3_sfa_fp16(x.half())
    fp4.dequantize_fp4_sfa_fp16(packed, sf)
    fp4.fp4_repack_b_interleaved_sm120(packed[:296])
    counts = torch.tensor([100, 37, 0], device="cuda", dtype=torch.int32)
    fp4.fused_swiglu_quant(torch.randn(3 * 128, 1024, device="cuda", dtype=torch.bfloat16), counts, True)
    tokens = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    scales = torch.randint(0, 2**31 - 1, (64, 2), device="cuda", dtype=torch.int32)
    topk = torch.randint(0, 8, (64, 2), device="cuda", dtype=torch.int64)
    fp4.prefill_permute_to_masked_gemm(tokens, scales, topk, 8, 128)
    print("quantizers, dequantizer, swiglu_quant, permute, repack: launched")


SKINNY_VARIANTS = (3, 4)  # the knobs' names of the skinny tier's kernels, whose `splits` they take
SKINNY_ROWS = 16  # up to these rows the composing backends (staged, e0m3_split) run the skinny tier


def picks_own_split(backend: str, knobs: dict, m: int) -> bool:
    """Whether `backend` may run a skinny kernel with the K split its planner picks, whatever `splits`
    says: the skinny backend unless the variant names one of its kernels, and at most SKINNY_ROWS rows
    the backends that compose it (docs/API.md: `splits` is the named kernel's)."""
    if backend == "skinny":
        return knobs.get("variant") not in SKINNY_VARIANTS
    return backend in ("staged", "e0m3_split") and m <= SKINNY_ROWS


def run_gemms(fp4: ModuleType, cc: int, ms: list[int], skip: set[str], one_cta_per_k: bool) -> None:
    gemm_call = fp4._gemm.GemmCall
    pairs = [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8", "mxfp8"), ("nvfp4", "e0m3"), ("bf16", "nvfp4"),
             ("bf16", "mxfp4")]  # fmt: skip
    for a_format, b_format in pairs:
        b, sfb = operands(fp4, b_format, N, seed=1)
        for m in ms:
            a, sfa = operands(fp4, a_format, m, seed=m)
            for out_format in ("bf16", "nvfp4"):
                out = torch.empty(m, N if out_format == "bf16" else N // 2, device="cuda",
                                  dtype=torch.bfloat16 if out_format == "bf16" else torch.uint8)  # fmt: skip
                out_scales = None if out_format == "bf16" else torch.empty(
                    fp4.sfa_size_bytes(m, N), device="cuda", dtype=torch.uint8)  # fmt: skip
                ran = set()
                for knobs in KNOBS:
                    call = gemm_call(a, b, sfa, sfb, a_format, b_format, out=out, out_scales=out_scales,
                                     out_format=out_format, pdl=False, **knobs)  # fmt: skip
                    for backend in call.backends(cc):
                        if backend in skip or (one_cta_per_k and picks_own_split(backend, knobs, m)):
                            continue
                        call.run_on(backend)
                        ran.add(backend)
                torch.cuda.synchronize()
                print(f"{a_format} x {b_format} M={m} N={N} K={K} -> {out_format}: {sorted(ran)}")


def run_grouped(fp4: ModuleType) -> None:
    groups, rows = 4, 40
    b, sfb = operands(fp4, "nvfp4", groups * N, seed=7)
    b = b.reshape(groups, N, -1)
    a, sfa = operands(fp4, "nvfp4", groups * rows, seed=8)
    out = torch.empty(groups * rows, N, device="cuda", dtype=torch.bfloat16)
    alpha = torch.ones(groups, device="cuda", dtype=torch.float32)
    masked = torch.tensor([40, 0, 17, 3], device="cuda", dtype=torch.int32)
    fp4.group_masked_gemm(a, b, sfa, sfb, masked, out, alpha=alpha, max_m_per_expert=rows, mode="w4a4-nvfp4")
    experts = torch.arange(groups * rows, device="cuda", dtype=torch.int32) // rows
    fp4.group_contiguous_gemm(a, b, sfa, sfb, experts, out, alpha=alpha, mode="w4a4-nvfp4")
    torch.cuda.synchronize()
    print("grouped masked and contiguous: launched")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 5, 16, 32, 64, 256, 1024], help="GEMM rows")
    parser.add_argument(
        "--no-cluster-split",
        action="store_true",
        help="leave out the skinny kernels' cluster K splits: racecheck reports their hand-over over distributed "
        "shared memory, which cluster-scope mbarriers order (csrc/gemm/skinny/kernel.cuh), as hazards; each "
        "skinny kernel then runs by its variant with splits = 1, and no backend that would pick a split runs",
    )
    parser.add_argument(
        "--skip-backends",
        nargs="+",
        default=[],
        metavar="NAME",
        help="GEMM backends not to run, e.g. composition: racecheck reports hazards inside cuBLAS's own kernels "
        "(nvjet), and excluding those kernels by name makes the sanitizer fail; with --ms below the composition's "
        "rows (768), no other backend calls cuBLAS",
    )
    args = parser.parse_args()
    if args.no_cluster_split:  # every kernel of the tier on one CTA per K range, also where it would pick a split
        KNOBS[:] = [knobs | {"splits": 1} for knobs in KNOBS if knobs.get("splits", 1) == 1]
    fp4 = load()
    major, minor = torch.cuda.get_device_capability()
    run_quantizers(fp4)
    run_gemms(fp4, 10 * major + minor, args.ms, set(args.skip_backends), args.no_cluster_split)
    run_grouped(fp4)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
