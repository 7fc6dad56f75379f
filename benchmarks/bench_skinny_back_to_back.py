"""Decode GEMMs one at a time against back to back: where the M <= 16 time goes besides the weight.

bench_gemm_skinny.py times one call after an L2 clear. A decode step instead runs its layers' GEMMs
back to back, each on a weight the L2 does not hold. For NVFP4 x NVFP4 with bf16 output (the gemm op,
dispatch's choice) and cuBLAS bf16 on the exact dequantized weight, on each shape and M:
- `flush_us`: one call after an L2 clear (triton.testing.do_bench, bench_gemm_skinny.py's method);
- `b2b_us`: COPIES calls on COPIES weight copies (each one cold), launched from Python back to back
  without PDL, per call (the host's launch cost bounds it where a call's GPU time is below it);
- `graph_pdl_us`: the same calls captured in one CUDA graph (with PDL for ours), replayed, per call.
Medians of CUDA-event timings. --no-cublas leaves the peer out (for diagnostic builds of our kernels,
benchmarks/experiments/).

    python benchmarks/bench_skinny_back_to_back.py --out benchmarks/results/h200-skinny-back-to-back.json
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

import torch
from bench_common import RESULTS, events_us, graph_us, load, write_results
from bench_gemm_skinny import Weight, activation, copy_bandwidth_gbps, median_us, nbytes

COPIES, REPEATS = 20, 15
SHAPES = ((2112, 5120), (4224, 5120), (8448, 5120), (17408, 5120), (4096, 7168), (1536, 7168), (8192, 8192))


def per_call_us(call: Callable[[int], object], graph: bool) -> float:
    """call(0 .. COPIES - 1), per call: launched back to back, or replayed from one CUDA graph."""
    calls = [functools.partial(call, i) for i in range(COPIES)]
    if graph:
        return graph_us(calls, REPEATS)
    return events_us(lambda: [c() for c in calls], COPIES, REPEATS)


def case_row(fp4, weights: list[tuple[torch.Tensor, ...]], dense: list[torch.Tensor], m: int) -> dict:
    """One M on one shape's weight copies (and their dequantized bf16 copies where the peer runs)."""
    n, k = weights[0][0].shape[0], weights[0][0].shape[1] * 2
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    a, sfa, _ = activation(fp4, "nvfp4", x)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

    def ours(i: int, pdl: bool) -> None:
        fp4._gemm.GemmCall(a, weights[i][0], sfa, weights[i][1], "nvfp4", "nvfp4", out=out, pdl=pdl).run()

    def peer(i: int) -> None:
        torch.mm(x, dense[i].T, out=out)

    row = {"N": n, "K": k, "M": m, "bytes": nbytes(*weights[0], a, sfa, out),
           "flush_us": median_us(lambda: ours(0, False)),
           "b2b_us": per_call_us(lambda i: ours(i, False), graph=False),
           "graph_pdl_us": per_call_us(lambda i: ours(i, True), graph=True)}  # fmt: skip
    if dense:
        row |= {"cublas_flush_us": median_us(lambda: peer(0)), "cublas_b2b_us": per_call_us(peer, graph=False),
                "cublas_graph_us": per_call_us(peer, graph=True)}  # fmt: skip
    return {key: round(v, 2) if isinstance(v, float) else v for key, v in row.items()}


def shape_rows(fp4, n: int, k: int, ms: tuple[int, ...], cublas: bool) -> list[dict]:
    weight = Weight(fp4, "nvfp4", (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16))
    weights = list(weight.copies) + [tuple(t.clone() for t in weight.copies[0])
                                     for _ in range(COPIES - len(weight.copies))]  # fmt: skip
    dense = [weight.bf16] + [weight.bf16.clone() for _ in range(COPIES - 1)] if cublas else []
    rows = []
    for m in ms:
        rows.append(case_row(fp4, weights, dense, m))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-skinny-back-to-back.json")
    parser.add_argument("--shapes", type=lambda s: tuple(int(x) for x in s.split("x")), nargs="+", default=SHAPES)
    parser.add_argument("--ms", type=int, nargs="+", default=(1,))
    parser.add_argument("--no-cublas", dest="cublas", action="store_false")
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth_gbps()
    rows = []
    for n, k in args.shapes:
        rows += shape_rows(fp4, n, k, tuple(args.ms), args.cublas)
        torch.cuda.empty_cache()
    write_results(args.out, rows, copy_bw_GBps=round(copy_bw, 1))


if __name__ == "__main__":
    main()
