"""How much of a short GEMM's time is its code arriving: each call timed after an L2 clear (the
benchmarks' method) with and without a warm-up call of the same kernel just before it.

The warm-up runs the same op on the same shape but on other copies of both operands, so it leaves
the kernel's instructions (and those of any helper launch) in L2 and the SM's instruction caches
while the timed call's operands, their TLB entries and tensor maps stay as cold as without it.
"cold" minus "warm code" is what fetching the code costs the call; cuBLAS bf16 is timed the same way
as the peer. Medians of CUDA-event timings of the timed call alone.

    python benchmarks/bench_cold_code.py --shapes 64x7168x2048,1x1536x7168 --json /tmp/cold.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from bench_common import load
from bench_engine_builds import dense_operands

L2_CLEAR_BYTES = 256 << 20  # triton.testing.do_bench's cache clear
HOST_LEAD_CYCLES = 400_000  # a GPU sleep (~0.2 ms) that keeps the host's launches ahead of the timing


def cold_us(calls: list[Callable[[], object]], warm_code: bool, repeats: int) -> float:
    """Median time of calls[0] after an L2 clear; with warm_code, calls[1] (the same kernel on other
    operands) runs between the clear and the timed call."""
    scratch = torch.empty(L2_CLEAR_BYTES, dtype=torch.int8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        scratch.zero_()
        torch.cuda._sleep(HOST_LEAD_CYCLES)
        if warm_code:
            calls[1]()
        start.record()
        calls[0]()
        end.record()
        end.synchronize()
        times.append(1000.0 * start.elapsed_time(end))
    return statistics.median(times)


def gemm_calls(fp4, ref, fmt: str, shape: tuple[int, int, int], backend: str) -> tuple[list, list]:
    """(ours, cuBLAS bf16): two calls each, on two copies of the operands."""
    m, n, k = shape
    ours, peer = [], []
    for copy in range(2):
        g = torch.Generator(device="cuda").manual_seed(m + n + k + copy)
        xa = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        xb = (torch.randn(n, k, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        a, sfa, b, sfb, af, bf, a_bf, b_bf = dense_operands(fp4, ref, fmt, xa, xb)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        call = fp4._gemm.GemmCall(a, b, sfa, sfb, af, bf, out=out)
        ours.append(call.run if backend == "dispatch" else lambda call=call: call.run_on(backend))
        peer.append(lambda a_bf=a_bf, b_bf=b_bf: torch.mm(a_bf, b_bf.T))
    return ours, peer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="64x7168x2048,64x4096x7168,256x7168x2048,1x1536x7168,1x7168x2048")
    parser.add_argument("--formats", default="nvfp4,mxfp8")
    parser.add_argument("--backend", default="dispatch", help="dispatch, or a backend by name")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fp4 = load()
    ref = importlib.import_module(fp4.__name__ + ".reference")
    rows = []
    for shape in [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]:
        for fmt in args.formats.split(","):
            ours, peer = gemm_calls(fp4, ref, fmt, shape, args.backend)
            for calls in (ours, peer):
                for c in calls:
                    c()
            row = dict(m=shape[0], n=shape[1], k=shape[2], fmt=fmt, backend=args.backend)
            for name, calls in (("cublas_bf16", peer), ("ours", ours)):
                row[f"{name}_cold_us"] = cold_us(calls, False, args.repeats)
                row[f"{name}_warm_code_us"] = cold_us(calls, True, args.repeats)
            rows.append(row)
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
