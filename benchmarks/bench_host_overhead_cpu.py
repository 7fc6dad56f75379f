"""Host cost per call of the Python layer and the op dispatch, on a machine without a GPU.

bench_host_overhead.py's calls on CPU tensors, with every registered op of the package given a
native (C++) CPU kernel that does nothing: what remains is the public function's
validation, output allocation, building the op call and the dispatcher's parse of its arguments,
as on the GPU, without the kernels' CUDA host code (backend choice, launch). torch.mm on the same
CPU is printed beside it (it computes, so it is a rough yardstick only). A tool for cutting host
cost, not the measurement the package reports (bench_host_overhead.py on a GPU).

    python benchmarks/bench_host_overhead_cpu.py [--only nvfp4_gemm_bf16,dense_gemm] [--calls 20000]

The no-op kernels: bench_host_overhead.stub_ops.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from bench_common import load
from bench_host_overhead import M, N, gemm_calls, quantizer_calls, stub_ops

K = 128

def per_call_us(fn: Callable[[], object], calls: int, repeats: int = 7) -> float:
    """Fastest of `repeats` timings of `calls` back-to-back calls, per call (a loaded machine adds time,
    never removes it, so the fastest is the least disturbed)."""
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated function names (default: all)")
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    calls = {**gemm_calls(fp4, "cpu"), **quantizer_calls(fp4, "cpu")}  # operands made by the real ops
    stub_ops(fp4, "CPU")
    x = torch.randn(M, K, dtype=torch.bfloat16)
    wt = torch.randn(K, N, dtype=torch.bfloat16)
    print(f"{'torch.mm (CPU, computes)':44s} {per_call_us(lambda: torch.mm(x, wt), args.calls):7.2f} us")
    wanted = set(filter(None, args.only.split(",")))
    for name, fn in calls.items():
        if not wanted or name in wanted:
            print(f"{name:44s} {per_call_us(fn, args.calls):7.2f} us")


if __name__ == "__main__":
    main()
