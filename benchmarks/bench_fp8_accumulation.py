"""How exactly Hopper's FP8 tensor cores sum one k32 block of E4M3 products (issue 16: MXFP8 on FP8
wgmma, with the block scales applied to float32 partial sums, is exact under docs/FORMATS.md only if
each k32 partial errs by far less than K * 2^-24 * sum |a b|).

One wgmma's worth: C = A @ B^T with A, B E4M3 [64, 32], by a Triton kernel (tl.dot of two fp8 tiles,
which Triton lowers to wgmma ... k32 .e4m3.e4m3 on sm_90a: the PTX is checked) and by torch._scaled_mm
(cuBLASLt, unit scales, float32 output), against the exact sum in float64. Two input sets:
- "dominated": every row and column has one large product 448 * 448 and 31 equal small products whose
  size runs from 2^9.6 down to 2^-12.4 over the (row, column) grid; the error as a fraction of the small
  products' sum shows from which ratio on they are truncated away.
- "random": every finite E4M3 code equally likely, 20 draws; the error against the test bound of
  FORMATS.md for K = 32 (ulp of the result + 32 * 2^-24 * sum |a b|), and against 2^-24 * sum |a b| ("unit").

    python benchmarks/bench_fp8_accumulation.py --out /tmp/fp8.json
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import triton
import triton.language as tl
from bench_common import RESULTS, write_results

K = 32


@triton.jit
def _k32_dot(a, b, c, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    k = tl.arange(0, 32)
    x = tl.load(a + r[:, None] * 32 + k[None, :])
    y = tl.load(b + r[:, None] * 32 + k[None, :])
    tl.store(c + r[:, None] * BLOCK + r[None, :], tl.dot(x, tl.trans(y)))


def triton_k32(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, str]:
    c = torch.empty(64, 64, dtype=torch.float32, device="cuda")
    compiled = _k32_dot[(1,)](a, b, c, BLOCK=64, num_warps=4)
    ptx = compiled.asm["ptx"]
    wgmma = sorted({line.split()[0] for line in ptx.splitlines() if "wgmma.mma_async" in line})
    return c, ",".join(wgmma)


def cublas_k32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    one = torch.ones((), device="cuda")
    return torch._scaled_mm(a, b.T, one, one, out_dtype=torch.float32, use_fast_accum=False)


def exact(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = a.double(), b.double()
    return x @ y.T, x.abs() @ y.abs().T


def dominated() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A, B and the small products' exponent per (row, column)."""
    i = torch.arange(64)
    a_exp = 8 - i // 4  # rows: 2^8 .. 2^-7
    b_exp = -(i // 8)  # columns: 2^0 .. 2^-7 (1.75 * 2^-7 is the subnormal 7 * 2^-9)
    a = (1.75 * torch.pow(2.0, a_exp.double()))[:, None].expand(64, K).clone()
    b = (1.75 * torch.pow(2.0, b_exp.double()))[:, None].expand(64, K).clone()
    a[:, 0] = 448.0
    b[:, 0] = 448.0
    small_exp = a_exp[:, None] + b_exp[None, :]
    return a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), small_exp


def random_e4m3(g: torch.Generator) -> torch.Tensor:
    codes = torch.randint(0, 256, (64, K), generator=g, dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes)  # no NaN codes
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The float32 unit in the last place of |x| (2^-149 at 0)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0**-126)))
    return torch.pow(2.0, e - 23)


def dominated_rows(name: str, run) -> list[dict]:
    a, b, small_exp = dominated()
    got, _ = run(a.cuda(), b.cuda())
    want, _ = exact(a, b)
    small = a.double()[:, 1:2] * b.double()[:, 1:2].T * (K - 1)
    lost = (got.double().cpu() - want) / small
    rows = []
    for e in sorted(set(small_exp.flatten().tolist()), reverse=True):
        sel = small_exp == e
        ratio = math.log2(448.0 * 448.0) - (e + 2 * math.log2(1.75))
        rows.append(
            dict(set="dominated", path=name, small_product_log2=e + 2 * math.log2(1.75),
                 large_over_small_log2=ratio, lost_fraction_min=lost[sel].min().item(),
                 lost_fraction_max=lost[sel].max().item())
        )  # fmt: skip
    return rows


def random_rows(name: str, run, draws: int) -> dict:
    g = torch.Generator().manual_seed(0)
    worst_bound, worst_sum, violations, elements = 0.0, 0.0, 0, 0
    for _ in range(draws):
        a, b = random_e4m3(g), random_e4m3(g)
        got, _ = run(a.cuda(), b.cuda())
        want, magnitude = exact(a, b)
        err = (got.double().cpu() - want).abs()
        bound = ulp(want) + K * 2.0**-24 * magnitude
        worst_bound = max(worst_bound, (err / bound).max().item())
        worst_sum = max(worst_sum, (err / (2.0**-24 * magnitude).clamp_min(2.0**-149)).max().item())
        violations += int((err > bound).sum())
        elements += err.numel()
    return dict(set="random", path=name, draws=draws, elements=elements, max_error_over_bound=worst_bound,
                max_error_over_unit_sum_abs=worst_sum, elements_over_bound=violations)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-fp8-accumulation.json")
    parser.add_argument("--draws", type=int, default=20)
    args = parser.parse_args()
    instructions = {}

    def run_triton(a, b):
        c, wgmma = triton_k32(a, b)
        instructions["triton"] = wgmma
        return c, None

    paths = {"triton_wgmma": run_triton, "cublaslt_scaled_mm": lambda a, b: (cublas_k32(a, b), None)}
    rows = []
    for name, run in paths.items():
        rows += dominated_rows(name, run)
        rows.append(random_rows(name, run, args.draws))
        for r in rows[-1:]:
            print(r, flush=True)
    for r in rows:
        if r["set"] == "dominated":
            print(f"{r['path']:20s} large/small 2^{r['large_over_small_log2']:6.2f}: lost "
                  f"{r['lost_fraction_min']:+.4f} .. {r['lost_fraction_max']:+.4f}")  # fmt: skip
    write_results(args.out, rows, triton_instructions=instructions.get("triton", ""))


if __name__ == "__main__":
    main()
