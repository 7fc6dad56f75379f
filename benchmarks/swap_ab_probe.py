"""Experiment (branch exp/swap-ab): W4A16 on the sm90_swap_ab backend by name beside the backends that
serve the same calls today (skinny, sm90_engine) and humming-kernels, one process, the same weight
bytes, weights rotated past L2. Each backend's output is checked against dispatch's.

    FP4_GEMM_BUILD_DIR=.build-fmt python benchmarks/swap_ab_probe.py --out swap-ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemm_peers as grid  # noqa: E402
from kernels import get_local_kernel  # noqa: E402

SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120), (8192, 8192), (4096, 7168), (7168, 2048)]
MS = [1, 8, 16, 32, 64, 128, 256]
FORMATS = {"w4a16-nvfp4": "nvfp4", "w4a16-mxfp4": "mxfp4"}
BACKENDS = ["sm90_swap_ab", "sm90_engine", "skinny"]


def build() -> object:
    return get_local_kernel(Path(os.environ.get("FP4_GEMM_BUILD_DIR", "build")).resolve())


def rows_for(fp4, fmt: str, n: int, k: int, ms: list[int]) -> list[dict]:
    weight_format = FORMATS[fmt]
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    mode = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4"}[weight_format]
    b, sfb = fp4.group_wise_quant(w, mode)
    alpha = torch.ones(1, device="cuda", dtype=torch.float32) if weight_format == "nvfp4" else None
    copies = grid.rotation_copies((b, sfb), grid.l2_bytes("cuda"))
    humming = None
    try:
        layers = [grid.humming_linear(bc, sc, grid.OPERANDS[weight_format]) for bc, sc in copies]
        humming = layers
    except Exception as e:  # not installed, or no kernel for the shape
        print(f"humming: {str(e).splitlines()[0]}")
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        expected = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        fp4.dense_gemm(x, b, None, sfb, expected, alpha=alpha, mode=fmt)
        row = {"format": fmt, "M": m, "N": n, "K": k}
        for backend in BACKENDS:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)

            def call(bc, sc, out=out, backend=backend, x=x):
                fp4._gemm.GemmCall(x, bc, None, sc, "bf16", weight_format, alpha=alpha, out=out).run_on(backend)

            try:
                call(b, sfb)
            except RuntimeError as e:
                row[f"{backend}_note"] = str(e).splitlines()[0]
                continue
            torch.cuda.synchronize()
            row[f"{backend}_check"] = grid.relative_error(out, expected)
            row[f"{backend}_us"] = grid.median_us(grid.Rotation(call, copies))
        if humming is not None:
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            row["humming_us"] = grid.median_us(
                grid.Rotation(lambda layer, x=x, out=out: layer(x, out), [(h,) for h in humming])
            )
            row["humming_check"] = grid.relative_error(humming[0](x, out), expected)
        base = min(row.get(f"{b}_us", float("inf")) for b in ("sm90_engine", "skinny"))
        if "sm90_swap_ab_us" in row:
            row["today_over_swap"] = base / row["sm90_swap_ab_us"]
            if "humming_us" in row:
                row["humming_over_swap"] = row["humming_us"] / row["sm90_swap_ab_us"]
        print({key: round(v, 3) if isinstance(v, float) else v for key, v in row.items()}, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ms", type=int, nargs="+", default=MS)
    parser.add_argument("--shapes", nargs="+", default=None, help="NxK ...")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    fp4 = build()
    rows = [row for fmt in FORMATS for n, k in shapes for row in rows_for(fp4, fmt, n, k, args.ms)]
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
