"""Whole tiles against stream-K on the Hopper engine, by shape (issue 16: where the work split costs).

At M >= 1024 the engine's bf16 ceiling (the same pipeline fed bf16 operands) ran 0.50-0.58x cuBLAS on
the shapes whose 128 x 256 tiles make 2 to 8 part-filled waves (stream-K: 8192 x 8192 and
4096 x 7168 at M >= 2048, 17408 x 5120 at M = 1024), and 0.93-0.96x where whole tiles run
(17408 x 5120 at M >= 2048). Stream-K gives CTA c the units [c U / G, (c + 1) U / G): at any moment
the 132 CTAs sit on 132 tiles spread over the whole output, each at its own K offset, so no two share
an operand tile in L2. This times, per (format, M, N, K), the engine by name (backend sm90_engine)
with its own split (stream-K on those shapes) and with whole tiles in tile order (sm_count = 1: the
backend's split then finds no part-filled wave), against cuBLAS bf16 on the dequantized operands and
the composition backend, all on the same operands in one process.

    python benchmarks/bench_engine_split.py --out /tmp/split.json
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch
from bench_common import RESULTS, load, median_us, write_results

SHAPES = ((17408, 5120), (8192, 8192), (4096, 7168), (7168, 2048))
MS = (512, 1024, 2048, 4096)
FORMATS = ("bf16", "nvfp4", "mxfp8", "mxfp4")
MODES = {"nvfp4": "w4a4-nvfp4", "mxfp8": "w8a8-mxfp8", "mxfp4": "w4a4-mxfp4"}


def operands(fp4, ref, fmt: str, xa: torch.Tensor, xb: torch.Tensor) -> tuple:
    """(A, sfa, B, sfb, A bf16, B bf16) of one format; "bf16" is the ceiling (no scales)."""
    if fmt == "bf16":
        return xa, None, xb, torch.empty(0, dtype=torch.uint8, device=xa.device), xa, xb
    a, sfa = fp4.group_wise_quant(xa, MODES[fmt])
    b, sfb = fp4.group_wise_quant(xb, MODES[fmt])
    a_bf, b_bf = (ref.dequantize(v, s, ref.FORMATS[fmt]).to(torch.bfloat16) for v, s in ((a, sfa), (b, sfb)))
    return a, sfa, b, sfb, a_bf, b_bf


def row(fp4, ref, fmt: str, m: int, n: int, k: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    xa = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    xb = (torch.randn(n, k, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    a, sfa, b, sfb, a_bf, b_bf = operands(fp4, ref, fmt, xa, xb)
    cublas = median_us(lambda: torch.mm(a_bf, b_bf.T))
    result = dict(fmt=fmt, m=m, n=n, k=k, cublas_bf16_us=cublas)
    outs = {}
    runs = (("engine_own_split", "sm90_engine", -1), ("engine_whole_tiles", "sm90_engine", 1),
            ("composition", "composition", -1))  # fmt: skip
    for name, backend, sm_count in runs:
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        call = fp4._gemm.GemmCall(a, b, sfa, sfb, fmt, fmt, out=out, sm_count=sm_count)
        if backend not in call.backends(90):
            continue
        result[f"{name}_us"] = median_us(lambda call=call, backend=backend: call.run_on(backend))
        result[f"{name}_ratio_vs_cublas_bf16"] = cublas / result[f"{name}_us"]
        outs[name] = out.float()
    fp32_mm = a_bf.float() @ b_bf.float().T
    want = fp32_mm.abs().max().item()
    result["max_diff_vs_fp32_mm"] = {name: (o - fp32_mm).abs().max().item() / want for name, o in outs.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-engine-split.json")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    args = parser.parse_args()
    fp4 = load()
    ref = importlib.import_module(fp4.__name__ + ".reference")
    rows = []
    for fmt in args.formats.split(","):
        for n, k in SHAPES:
            for m in map(int, args.ms.split(",")):
                r = row(fp4, ref, fmt, m, n, k)
                rows.append(r)
                print(
                    f"{fmt:6s} {m:5d} {n:6d} {k:5d} cublas {r['cublas_bf16_us']:8.1f}"
                    f" own {r['engine_own_split_us']:8.1f} ({r['engine_own_split_ratio_vs_cublas_bf16']:.2f})"
                    f" whole {r['engine_whole_tiles_us']:8.1f} ({r['engine_whole_tiles_ratio_vs_cublas_bf16']:.2f})"
                    + (f" comp {r['composition_us']:8.1f}" if "composition_us" in r else ""),
                    flush=True,
                )
    write_results(args.out, rows, method="triton.testing.do_bench medians (L2 cleared per run), one process")


if __name__ == "__main__":
    main()
