"""Quantizers, dequantizer, fused SwiGLU+quant and MoE permute: ours against the same op done with
PyTorch ops on the GPU (the reference), in one process, on the same data.

Each row: median of CUDA-event timings (triton.testing.do_bench) after warm-up, bytes = bytes read +
bytes written by the op, GB/s = bytes / time, fraction_of_copy_bw = GB/s / 4250 (the device-to-device
copy bandwidth measured on the H200), speedup_vs_torch = reference time / our time. Inputs are
100 MB or more, so the 60 MB L2 holds no useful part of them between runs.

    python benchmarks/bench_quant.py --out benchmarks/results/h200-quant.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_common import RESULTS, load, median_us, on_reference, write_results

COPY_BW_GBPS = 4250.0


@dataclass
class Row:
    op: str
    mode: str
    shape: tuple[int, ...]
    bytes: int
    ours: Callable[[], object]
    torch_ref: Callable[[], object]


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def same_op(fp4, op: str, mode: str, shape: tuple[int, ...], traffic: int, *args: object) -> Row:
    """A row timing fp4.<op>(*args) against the same call with the reference's PyTorch ops."""
    ours = getattr(fp4, op)
    theirs = on_reference(fp4, ours)
    return Row(op, mode, shape, traffic, lambda: ours(*args), lambda: theirs(*args))


def quantize_rows(fp4, m: int, k: int) -> list[Row]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xh = x.half()
    rows = []
    for mode in ("w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4"):
        q, s = fp4.group_wise_quant(x, mode)
        rows.append(same_op(fp4, "group_wise_quant", mode, (m, k), nbytes(x, q, s), x, mode))
    q, s = fp4.quantize_fp4_sfa_bf16(x)
    flat = {
        "quantize_fp4_sfa_bf16": (x, "nvfp4"),
        "quantize_fp4_sfa_fp16": (xh, "nvfp4"),
        "quantize_fp4_sfa_mse_bf16": (x, "nvfp4_mse"),
        "quantize_fp4_sfa_mse_fp16": (xh, "nvfp4_mse"),
        "quantize_e0m3_sfa_fp16": (xh, "e0m3"),
    }
    for op, (inp, mode) in flat.items():
        rows.append(same_op(fp4, op, mode, (m, k), nbytes(inp, q, s), inp))
    ragged = x[:, : k - 16].contiguous()  # a logical width that needs padding
    for op in ("quantize_fp4_sfa_padded_bf16", "pack_nvfp4_weight_bf16"):
        rows.append(same_op(fp4, op, "nvfp4", tuple(ragged.shape), nbytes(ragged, q, s), ragged))
    out = torch.empty(m, k, device="cuda", dtype=torch.float16)
    rows.append(same_op(fp4, "dequantize_fp4_sfa_fp16", "nvfp4", (m, k), nbytes(q, s, out), q, s, out))
    return rows


def swiglu_rows(fp4, experts: int, m: int, hidden: int) -> list[Row]:
    x = torch.randn(experts * m, 2 * hidden, device="cuda", dtype=torch.bfloat16)
    counts = torch.full((experts,), m, device="cuda", dtype=torch.int32)
    rows = []
    for is_fp4, mode in ((False, "mxfp8"), (True, "nvfp4")):
        v, s = fp4.fused_swiglu_quant(x, counts, is_fp4=is_fp4)
        rows.append(same_op(fp4, "fused_swiglu_quant", mode, tuple(x.shape), nbytes(x, v, s), x, counts, is_fp4))
    return rows


def permute_rows(fp4, tokens: int, hidden: int, topk: int, experts: int) -> list[Row]:
    rows = []
    max_tokens = -(-tokens * topk * 2 // experts // 128) * 128  # 2x headroom over the mean
    ids = torch.randint(0, experts, (tokens, topk), device="cuda", dtype=torch.int64)
    for dtype, mode in ((torch.bfloat16, "bf16+int32"), (torch.float8_e4m3fn, "fp8+uint8")):
        x = torch.randn(tokens, hidden, device="cuda").to(dtype)
        if dtype == torch.bfloat16:
            scale = torch.randint(0, 2**31 - 1, (tokens, hidden // 512), device="cuda", dtype=torch.int32)
        else:
            scale = torch.randint(0, 255, (tokens, hidden // 32), device="cuda", dtype=torch.uint8)
        # what the op must move: every token (and its scales) read once, and every output row written
        # once, a routed copy or, for the rows nobody lands on, zeros (the op defines every byte)
        row_bytes = hidden * x.element_size() + hidden // 32
        traffic = tokens * row_bytes + experts * max_tokens * row_bytes + nbytes(ids) + tokens * topk * 4
        shape = (tokens, hidden, topk, experts)
        rows.append(
            same_op(fp4, "prefill_permute_to_masked_gemm", mode, shape, traffic, x, scale, ids, experts, max_tokens)
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-quant.json")
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    rows = quantize_rows(fp4, 16384, 8192) + swiglu_rows(fp4, 8, 2048, 4096) + permute_rows(fp4, 16384, 4096, 8, 64)
    results = []
    for row in rows:
        torch_us = median_us(row.torch_ref)  # the peer first, then ours
        ours_us = median_us(row.ours)
        gbps = row.bytes / ours_us / 1e3
        results.append(
            {
                "op": row.op,
                "mode": row.mode,
                "shape": list(row.shape),
                "bytes": row.bytes,
                "us": round(ours_us, 2),
                "torch_us": round(torch_us, 2),
                "GBps": round(gbps, 1),
                "fraction_of_copy_bw": round(gbps / COPY_BW_GBPS, 3),
                "speedup_vs_torch": round(torch_us / ours_us, 2),
            }
        )
        r = results[-1]
        print(
            f"{r['op']:34s} {r['mode']:10s} {str(r['shape']):24s} {r['us']:9.1f} us {r['GBps']:7.0f} GB/s "
            f"{r['fraction_of_copy_bw']:5.2f} x{r['speedup_vs_torch']:7.1f}"
        )
    write_results(args.out, results, copy_bw_GBps=COPY_BW_GBPS)


if __name__ == "__main__":
    main()
