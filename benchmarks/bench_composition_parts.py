"""Where the composition backend's time goes, for several builds of the package in one process: the
dequantization of A and of B alone (the op the backend runs first, on the same swizzled operands),
cuBLAS bf16 on the dequantized operands, and the composition by name; what is left over is
composition - dequantize A - dequantize B - cuBLAS (the epilogue scalars, launch gaps, cuBLASLt's
algorithm against torch's).

Each build is a repository path whose build/ holds a variant, as in bench_engine_builds.py; outputs
are compared bit for bit against the first build's. Medians of triton.testing.do_bench (L2 cleared
before every run). The dequantizer's fraction of copy bandwidth: (code bytes + scale bytes + output
bytes) / time over a device-to-device copy's (read + written bytes) / time, measured in this process.

    python benchmarks/bench_composition_parts.py base=/path/to/old/repo new=. --json /tmp/parts.json
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import torch
from bench_engine_builds import MODES, dense_operands, median_us
from kernels import get_local_kernel

SHAPES = ((1024, 8192, 8192), (2048, 8192, 8192), (4096, 8192, 8192), (2048, 4096, 7168), (4096, 7168, 2048))
RECIPES = {"nvfp4": "nvfp4", "mxfp4": "mxfp4", "mxfp8": "mxfp8"}


def copy_gbps() -> float:
    """Device-to-device copy bandwidth, bytes read + written per second, of a 1 GiB buffer."""
    src = torch.empty(1 << 29, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.nbytes / median_us(lambda: dst.copy_(src)) / 1e3


def dequantize_us(
    fp4, values: torch.Tensor, scales: torch.Tensor, fmt: str, rows: int, k: int
) -> tuple[float, torch.Tensor]:
    """The dequantizer's median on one operand, and its output."""
    out = torch.empty(rows, k, dtype=torch.bfloat16, device="cuda")
    run = lambda: fp4.ops.dequantize(values, scales, RECIPES[fmt], True, out)  # noqa: E731
    run()
    return median_us(run), out.clone()


def operand_bytes(values: torch.Tensor, scales: torch.Tensor, rows: int, k: int) -> int:
    return values.nbytes + scales.nbytes + rows * k * 2


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return torch.equal(x.view(torch.int16), y.view(torch.int16))


def build_row(fp4, operands: tuple, m: int, n: int, k: int, fmt: str, gbps: float) -> tuple[dict, list[torch.Tensor]]:
    """One build's times on one row (dequantize A and B where block-scaled, the composition by name),
    and its outputs in that order."""
    a, sfa, b, sfb, af, bf = operands[:6]
    row, outs = {}, []
    for side, values, scales, rows in (("a", a, sfa, m), ("b", b, sfb, n)):
        if scales is None:
            continue
        us, out = dequantize_us(fp4, values, scales, fmt, rows, k)
        row[f"dequantize_{side}_us"] = us
        row[f"dequantize_{side}_fraction_of_copy"] = round(operand_bytes(values, scales, rows, k) / us / 1e3 / gbps, 3)
        outs.append(out)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    call = fp4._gemm.GemmCall(a, b, sfa, sfb, af, bf, out=out)
    call.run_on("composition")
    row["composition_us"] = median_us(lambda: call.run_on("composition"))
    outs.append(out.clone())
    return row, outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", help="name=repository path, the first is the reference")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: SHAPES)")
    parser.add_argument("--formats", default="nvfp4,mxfp8", help="comma-separated, of " + ", ".join(MODES) + ", w4a16")
    args = parser.parse_args()
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    builds = {name: get_local_kernel(Path(path)) for name, path in (b.split("=", 1) for b in args.builds)}
    first = next(iter(builds.values()))
    ref = importlib.import_module(first.__name__ + ".reference")
    gbps = copy_gbps()
    print(f"copy bandwidth {gbps:.0f} GB/s", flush=True)
    rows = []
    for m, n, k in shapes:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        xa = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        xb = (torch.randn(n, k, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        for fmt in args.formats.split(","):
            operands = dense_operands(first, ref, fmt, xa, xb)
            a_bf, b_bf = operands[6:]
            cublas = median_us(lambda a_bf=a_bf, b_bf=b_bf: torch.mm(a_bf, b_bf.T))
            per_build, reference_outs, same = {}, None, True
            for name, fp4 in builds.items():
                part, outs = build_row(fp4, operands, m, n, k, "nvfp4" if fmt == "w4a16" else fmt, gbps)
                part["rest_us"] = (
                    part["composition_us"] - cublas - part.get("dequantize_a_us", 0.0) - part["dequantize_b_us"]
                )
                part["ratio_vs_cublas_bf16"] = round(cublas / part["composition_us"], 3)
                per_build[name] = part
                reference_outs = reference_outs or outs
                same = same and all(same_bits(x, y) for x, y in zip(reference_outs, outs, strict=True))
            rows.append(dict(m=m, n=n, k=k, fmt=fmt, cublas_us=cublas, bitwise_equal=same, builds=per_build))
            cells = "  ".join(
                f"{name}: deqA {p.get('dequantize_a_us', 0):6.1f} ({p.get('dequantize_a_fraction_of_copy', 0):.2f}) "
                f"deqB {p['dequantize_b_us']:6.1f} ({p['dequantize_b_fraction_of_copy']:.2f}) "
                f"comp {p['composition_us']:7.1f} rest {p['rest_us']:5.1f} x{p['ratio_vs_cublas_bf16']:.3f}"
                for name, p in per_build.items()
            )
            print(f"{m:5d} {n:6d} {k:5d} {fmt:6s} cublas {cublas:7.1f}  {cells}  same={same}", flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"gpu": torch.cuda.get_device_name(), "copy_GBps": gbps, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
