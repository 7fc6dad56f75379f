"""Dense GEMM rows run by backend name, a few calls each, for a profiler to capture (ncu, nsys).

Each row is MxNxK:format:backend (format of bench_engine_builds.py: nvfp4, mxfp8, mxfp4, w4a16).
Every row runs `--calls` times after its operands are made; with ncu, skip the warm-up calls and
capture the last, e.g. the engine of two rows and the composition's kernels of a third:

    ncu --section SpeedOfLight --section WarpStateStats -k regex:engine_kernel --launch-skip 2 \\
        --launch-count 1 python benchmarks/profile_rows.py 256x7168x2048:nvfp4:sm90_engine
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch
from bench_engine_builds import dense_operands
from kernels import get_local_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", help="MxNxK:format:backend")
    parser.add_argument("--build", type=Path, default=Path(__file__).resolve().parents[1], help="repository path")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    fp4 = get_local_kernel(args.build)
    ref = importlib.import_module(fp4.__name__ + ".reference")
    for row in args.rows:
        shape, fmt, backend = row.split(":")
        m, n, k = map(int, shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        xa = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        xb = (torch.randn(n, k, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        a, sfa, b, sfb, af, bf = dense_operands(fp4, ref, fmt, xa, xb)[:6]
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        call = fp4._gemm.GemmCall(a, b, sfa, sfb, af, bf, out=out)
        torch.cuda.synchronize()
        for _ in range(args.calls):
            call.run_on(backend)
        torch.cuda.synchronize()
        print(f"{row}: {args.calls} calls", flush=True)


if __name__ == "__main__":
    main()
