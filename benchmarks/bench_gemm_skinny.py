"""Decode and speculative-verify GEMMs (M <= 16 rows, per group for the grouped ones): ours against
cuBLAS bf16 on the dequantized weight and torch._grouped_mm bf16, in one process, on the same data,
the peer first.

Dense rows: for each format, (N, K) and M, random bf16 activations [M, K] and weights [N, K]
(N(0, 0.05)); the W4A4/W8A8 formats quantize both with the package (group_wise_quant), the W4A16
ones ("w4a16-nvfp4", "w4a16-mxfp4") only the weight and run the `gemm` op with bf16 activations.
cuBLAS multiplies the exactly dequantized bf16 operands (torch.mm). Both cycle through copies of
their weight worth more than twice the L2, and triton.testing.do_bench clears the L2 before every
run: each run streams the weight from HBM, as decode does. Times are medians.

Grouped rows: E experts x R rows each ("masked", group_masked_gemm with every count R; W4A16 by the
gemm op), (N, K) = (4096, 7168), against torch._grouped_mm on the bf16 weights [E, N, K] (as
[E, K, N] views) with the same row offsets.

Per row: bytes = the (active) weights' values and scales + the activations' values and scales + the
bf16 output; GBps = bytes / ours_us; copy_bw = a 1 GiB device-to-device copy measured at the start
of the run (bytes read + written, GB/s); fraction_of_copy_bw = GBps / copy_bw; target_us = 1.25 *
bytes / copy_bw; ratio_vs_cublas_bf16 = cuBLAS time / ours (above 1, ours is faster); check =
max |ours - peer| / max |peer| (both exact up to float32 summation order and the bf16 rounding).

--sweep also times the kernel's knobs (warps = slab warps per row group, stages = ring depth) on a
few shapes and writes them to --sweep-out.

    python benchmarks/bench_gemm_skinny.py --out benchmarks/results/h200-gemm-skinny.json
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
import triton.testing
from bench_common import RESULTS, load, write_results

TARGET_FACTOR = 1.25
L2_BYTES = 60 * 2**20
FORMATS = ("nvfp4", "mxfp4", "mxfp8", "w4a16-nvfp4", "w4a16-mxfp4")
MODES = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4", "mxfp8": "w8a8-mxfp8"}
MS = (1, 2, 4, 8, 16)
QUALIFICATION_SHAPES = ((17408, 5120), (5120, 17408), (12288, 5120), (8192, 8192))
EXPERT_SHAPES = ((4096, 7168), (7168, 2048), (2048, 7168), (1536, 7168))
GROUPED_CASES = ((64, 4), (256, 8))  # experts x rows per expert
GROUPED_SHAPE = (4096, 7168)
SWEEP_SHAPES = ((17408, 5120), (4096, 7168), (1536, 7168))
SWEEP_KNOBS = tuple(itertools.product((1, 2, 3, 4), (2, 3, 4)))

Tensor = torch.Tensor


def median_us(fn: Callable[[], object]) -> float:
    """Median of CUDA-event timings (L2 cleared before each run), microseconds."""
    return 1000.0 * triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def copy_bandwidth_gbps() -> float:
    """A 1 GiB device-to-device copy, bytes read + written per second."""
    src = torch.randint(0, 256, (2**30,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / median_us(lambda: dst.copy_(src)) / 1e3


def copies(tensors: tuple[Tensor, ...]) -> list[tuple[Tensor, ...]]:
    """Enough copies of a weight that cycling through them overruns the L2 twice."""
    count = max(1, -(-2 * L2_BYTES // nbytes(*tensors)))
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(count - 1)]


def rotating(fn: Callable[..., Tensor], weights: list[tuple[Tensor, ...]]) -> Callable[[], Tensor]:
    """fn on the next weight copy at every call."""
    cycle = itertools.cycle(weights)
    return lambda: fn(*next(cycle))


def gemm_op(fp4, a, b, sfa, sfb, a_format: str, b_format: str, out: Tensor, grouping: str = "dense",
            group_index: Tensor | None = None, group_rows: int = 0, warps: int = 0,
            stages: int = 0, splits: int = 0, variant: int = -1) -> Tensor:  # fmt: skip
    fp4._gemm.GemmCall(
        a, b, None if a_format == "bf16" else sfa, sfb, a_format, b_format, grouping=grouping,
        group_index=group_index, group_rows=group_rows, out=out, variant=variant, warps=warps, stages=stages,
        splits=splits, pdl=False,
    ).run()  # fmt: skip
    return out


def dequantized_bf16(fp4, b: Tensor, sfb: Tensor, fmt: str) -> Tensor:
    """The exact bf16 values of a quantized [rows, K] matrix (the package's dequantize kernel)."""
    out = torch.empty(b.shape[0], b.shape[1] * (2 if b.dtype == torch.uint8 else 1), dtype=torch.bfloat16,
                      device=b.device)  # fmt: skip
    fp4.ops.dequantize(b, sfb, fmt, True, out)
    return out


def check(out: Tensor, peer: Tensor) -> float:
    return round(float((out.float() - peer.float()).abs().max() / peer.float().abs().max()), 5)


def row(op: str, fmt: str, m: int, n: int, k: int, traffic: int, ours_us: float, peer_us: float, peer: str,
        copy_bw: float, err: float, **extra: object) -> dict:  # fmt: skip
    gbps = traffic / ours_us / 1e3
    r = {"op": op, "format": fmt, **extra, "M": m, "N": n, "K": k, "bytes": traffic, "ours_us": round(ours_us, 2),
         f"{peer}_us": round(peer_us, 2), f"ratio_vs_{peer}": round(peer_us / ours_us, 3), "GBps": round(gbps, 1),
         "copy_bw": round(copy_bw, 1), "fraction_of_copy_bw": round(gbps / copy_bw, 3),
         "target_us": round(TARGET_FACTOR * traffic / copy_bw / 1e3, 2), "check": err}  # fmt: skip
    print(
        f"{op:42s} {fmt:12s} M={m:3d} {n:5d}x{k:5d} ours {r['ours_us']:8.1f} us (target {r['target_us']:6.1f})"
        f" {peer} {peer_us:8.1f} us x{r[f'ratio_vs_{peer}']:5.2f} {r['fraction_of_copy_bw']:5.2f} of copy bw,"
        f" check {err:.1e}",
        flush=True,
    )
    return r


# ---- dense decode ----------------------------------------------------------------------------------


class Weight:
    """One format's weight [N, K] quantized by the package, its copies and its bf16 dequantization."""

    def __init__(self, fp4, fmt: str, w: Tensor) -> None:
        self.b_format = fmt.removeprefix("w4a16-")
        self.a_format = "bf16" if fmt.startswith("w4a16") else self.b_format
        b, sfb = fp4.group_wise_quant(w, MODES[self.b_format])
        self.bf16 = dequantized_bf16(fp4, b, sfb, self.b_format)
        self.copies = copies((b, sfb))


def activation(fp4, fmt: str, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(a, sfa, exact bf16 values) for format fmt's activations; W4A16: x itself."""
    if fmt.startswith("w4a16"):
        return x, torch.empty(0, dtype=torch.uint8, device="cuda"), x
    a, sfa = fp4.group_wise_quant(x, MODES[fmt])
    return a, sfa, dequantized_bf16(fp4, a, sfa, fmt)


def dense_calls(fp4, fmt: str, weight: Weight, a: Tensor, sfa: Tensor, out: Tensor) -> dict:
    """op name -> (call(b, sfb) writing out, the weight copies it takes) for this format and M."""
    if fmt.startswith("w4a16"):
        return {"gemm": (lambda b, sfb: gemm_op(fp4, a, b, sfa, sfb, "bf16", weight.b_format, out), weight.copies)}
    if fmt != "nvfp4":
        return {"dense_gemm": (lambda b, sfb: fp4.dense_gemm(a, b, sfa, sfb, out, mode=MODES[fmt]), weight.copies)}
    calls = {"nvfp4_gemm_bf16": (lambda b, sfb: fp4.nvfp4_gemm_bf16(a, b, sfa, sfb, out=out), weight.copies)}
    if a.shape[0] == 1:
        streamed = [(fp4.fp4_repack_b_interleaved_sm120(b), sfb) for b, sfb in weight.copies]
        calls["fp4_w4a4_gemv_warpsplit_interleaved_bf16"] = (
            lambda b, sfb: fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, b, sfa, sfb, out=out),
            streamed,
        )
    return calls


def cublas_us(x: Tensor, dense_copies: list[tuple[Tensor, ...]]) -> float:
    out = torch.empty(x.shape[0], dense_copies[0][0].shape[0], dtype=torch.bfloat16, device="cuda")
    return median_us(rotating(lambda w: torch.mm(x, w.T, out=out), dense_copies))


class DenseCase(NamedTuple):
    """One (M, format) of a shape: the operands, the output buffer, the cuBLAS result and time."""

    m: int
    fmt: str
    weight: Weight
    a: Tensor
    sfa: Tensor
    out: Tensor
    peer: Tensor  # cuBLAS bf16 on the exact bf16 operands
    peer_us: float
    traffic: int  # bytes: the weight's values and scales, A's values and scales, the output


def dense_cases(fp4, n: int, k: int, formats: tuple[str, ...], ms: tuple[int, ...]) -> Iterator[DenseCase]:
    """For each M (cuBLAS bf16 timed first, on the NVFP4 weight's exact values, or the first format's
    without NVFP4) and format: its case."""
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    weights = {fmt: Weight(fp4, fmt, w) for fmt in formats}
    dense_copies = copies((weights.get("nvfp4", next(iter(weights.values()))).bf16,))
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        peer_us = cublas_us(x, dense_copies)  # the peer first
        for fmt, weight in weights.items():
            a, sfa, a_bf16 = activation(fp4, fmt, x)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            yield DenseCase(m, fmt, weight, a, sfa, out, torch.mm(a_bf16, weight.bf16.T), peer_us,
                            nbytes(*weight.copies[0], a, sfa, out))  # fmt: skip


def dense_rows(fp4, n: int, k: int, copy_bw: float) -> list[dict]:
    rows = []
    for c in dense_cases(fp4, n, k, FORMATS, MS):
        for op, (call, op_copies) in dense_calls(fp4, c.fmt, c.weight, c.a, c.sfa, c.out).items():
            ours_us = median_us(rotating(call, op_copies))
            call(*op_copies[0])
            rows.append(row(op, c.fmt, c.m, n, k, c.traffic, ours_us, c.peer_us, "cublas_bf16", copy_bw,
                            check(c.out, c.peer)))  # fmt: skip
    return rows


# ---- grouped decode -------------------------------------------------------------------------------------


def grouped_mm_bf16(a: Tensor, w: Tensor, offs: Tensor) -> Callable[[], Tensor]:
    """torch._grouped_mm on weights [E, N, K] as [E, K, N] (a transposed view; a contiguous copy if
    this torch build wants one)."""
    try:
        torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
        return lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    except RuntimeError:
        wt = w.transpose(-2, -1).contiguous()
        return lambda: torch._grouped_mm(a, wt, offs=offs)


def grouped_call(fp4, fmt: str, a: Tensor, sfa: Tensor, b: Tensor, sfb: Tensor, counts: Tensor, out: Tensor):
    """(op name, call) of a masked grouped decode whose every group owns all its rows."""
    experts, rows = counts.numel(), out.shape[0] // counts.numel()
    if fmt.startswith("w4a16"):
        return "gemm", lambda: gemm_op(
            fp4, a, b, sfa, sfb, "bf16", fmt.removeprefix("w4a16-"), out, "masked", counts, rows
        )
    alpha = torch.ones(experts, device="cuda")
    return "group_masked_gemm", lambda: fp4.group_masked_gemm(
        a, b, sfa, sfb, counts, out, alpha=alpha, max_m_per_expert=rows, mode=MODES[fmt]
    )


def grouped_row(fp4, fmt: str, w_bf16: Tensor, x: Tensor, experts: int, copy_bw: float) -> dict:
    n, k = GROUPED_SHAPE
    per_expert = x.shape[0] // experts
    b_format = fmt.removeprefix("w4a16-")
    b, sfb = fp4.group_wise_quant(w_bf16, MODES[b_format])
    a, sfa, a_bf16 = activation(fp4, fmt, x)
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * per_expert
    peer_call = grouped_mm_bf16(a_bf16, dequantized_bf16(fp4, b, sfb, b_format).reshape(experts, n, k), offs)
    peer_us = median_us(peer_call)  # the peer first
    peer = peer_call()
    counts = torch.full((experts,), per_expert, dtype=torch.int32, device="cuda")
    out = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda")
    op, call = grouped_call(fp4, fmt, a, sfa, b.reshape(experts, n, -1), sfb, counts, out)
    ours_us = median_us(call)
    call()
    traffic = nbytes(b, sfb, a, sfa, out)
    return row(op, fmt, per_expert, n, k, traffic, ours_us, peer_us, "torch_grouped_mm_bf16", copy_bw,
               check(out, peer), grouping="masked", E=experts, rows_per_group=per_expert)  # fmt: skip


def grouped_rows(fp4, copy_bw: float) -> list[dict]:
    n, k = GROUPED_SHAPE
    rows = []
    for experts, per_expert in GROUPED_CASES:
        w_bf16 = (torch.randn(experts * n, k, device="cuda") * 0.05).to(torch.bfloat16)
        x = torch.randn(experts * per_expert, k, device="cuda").to(torch.bfloat16)
        for fmt in ("nvfp4", "mxfp4", "w4a16-nvfp4"):
            rows.append(grouped_row(fp4, fmt, w_bf16, x, experts, copy_bw))
            torch.cuda.empty_cache()
    return rows


# ---- knobs ------------------------------------------------------------------------------------------------


def sweep_row(fp4, fmt: str, weight: Weight, m: int, k: int, warps: int, stages: int, copy_bw: float) -> dict:
    a, sfa, _ = activation(fp4, fmt, torch.randn(m, k, device="cuda").to(torch.bfloat16))
    n = weight.bf16.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    call = lambda b, sfb: gemm_op(fp4, a, b, sfa, sfb, weight.a_format, weight.b_format, out, warps=warps,  # noqa: E731
                                  stages=stages)  # fmt: skip
    us = median_us(rotating(call, weight.copies))
    fraction = nbytes(*weight.copies[0], a, sfa, out) / us / 1e3 / copy_bw
    print(
        f"sweep {fmt:12s} M={m:2d} {n:5d}x{k:5d} warps={warps} stages={stages} {us:8.1f} us {fraction:5.2f}", flush=True
    )
    return {"format": fmt, "M": m, "N": n, "K": k, "warps": warps, "stages": stages, "ours_us": round(us, 2),
            "fraction_of_copy_bw": round(fraction, 3)}  # fmt: skip


def sweep_rows(fp4, copy_bw: float) -> list[dict]:
    rows = []
    for n, k in SWEEP_SHAPES:
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        for fmt in ("nvfp4", "w4a16-nvfp4"):
            weight = Weight(fp4, fmt, w)
            for m in (1, 16):
                rows += [sweep_row(fp4, fmt, weight, m, k, warps, stages, copy_bw) for warps, stages in SWEEP_KNOBS]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-gemm-skinny.json")
    parser.add_argument("--shapes", choices=("all", "qualification", "experts", "none"), default="all")
    parser.add_argument("--grouped", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--sweep-out", type=Path, default=RESULTS / "h200-gemm-skinny-knobs.json")
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth_gbps()
    print(f"device-to-device copy: {copy_bw:.0f} GB/s", flush=True)
    if args.sweep:
        write_results(args.sweep_out, sweep_rows(fp4, copy_bw), copy_bw_GBps=round(copy_bw, 1))
    shapes = {"all": QUALIFICATION_SHAPES + EXPERT_SHAPES, "qualification": QUALIFICATION_SHAPES,
              "experts": EXPERT_SHAPES, "none": ()}[args.shapes]  # fmt: skip
    rows = []
    for n, k in shapes:
        rows += dense_rows(fp4, n, k, copy_bw)
        torch.cuda.empty_cache()
    if args.grouped:
        rows += grouped_rows(fp4, copy_bw)
    write_results(args.out, rows, copy_bw_GBps=round(copy_bw, 1))


if __name__ == "__main__":
    main()
