"""The side-by-side measurements of `benchmarks/peers.py` other than the dense GEMM grid (gemm_peers.py): each section
makes its operands, times the peer first and ours last, and returns the JSON rows that peers.py writes.
What each row holds is in the help of its subcommand (`python benchmarks/peers.py <subcommand> --help`).

  grouped     MoE grouped GEMMs against torch._grouped_mm, torch._scaled_grouped_mm, bmm, serial dense calls
  skinny      M <= 16 decode GEMMs against cuBLAS bf16 and torch._grouped_mm, as fractions of copy bandwidth
  w4a16       W4A16 above the decode rows against cuBLAS bf16
  staged      NVFP4-output and GeGLU GEMMs against the same GEMM with a bf16 output and the reference
  e0m3-split  the E0M3 split backend against the Hopper engine
  quant       quantizers, dequantizer, SwiGLU+quant and MoE permute against the reference's PyTorch ops
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from benchmark import HALOPS_MODES, ours_fn, ours_for
from gemm_peers import (
    QUALIFICATION_SHAPES,
    Rotation,
    median_us,
    nbytes,
    on_reference,
    relative_error,
    rowwise_fp8_stacked,
)

Tensor = torch.Tensor


def check(out: Tensor, peer: Tensor) -> float:
    """max |out - peer| / max |peer|, rounded for a row's "check" column."""
    return round(relative_error(out, peer), 5)


# ---- grouped: MoE grouped GEMMs -----------------------------------------------------------------

GROUPED_NK = ((4096, 7168), (7168, 2048))
# (name, rows per expert); "skewed": one expert with 2048 rows and seven with 8
GROUPED_CASES = (("8x256", [256] * 8), ("8x2048", [2048] * 8), ("32x64", [64] * 32), ("64x4", [4] * 64),
                 ("256x8", [8] * 256), ("skewed", [2048] + [8] * 7))  # fmt: skip
GROUPED_QUICK_CASES = (GROUPED_CASES[0], GROUPED_CASES[3], GROUPED_CASES[5])
# the other two groupings run on these cases only (their cost is the masked one's plus the layout)
OTHER_GROUPINGS = {"contiguous": ("8x256", "skewed"), "batched": ("8x256",)}
GROUPING_OPS = {"masked": "group_masked_gemm", "contiguous": "group_contiguous_gemm", "batched": "batch_gemm"}


def balanced(rows: list[int]) -> bool:
    return len(set(rows)) == 1


class Problem:
    """One (case, N, K): bf16 activations and weights, the routing as row counts."""

    def __init__(self, rows: list[int], n: int, k: int, seed: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.rows, self.n, self.k, self.experts = rows, n, k, len(rows)
        self.total = sum(rows)
        self.x = torch.randn(self.total, k, generator=g, device="cuda").to(torch.bfloat16)
        self.w = (torch.randn(self.experts, n, k, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        self.counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
        self.offs = torch.cumsum(self.counts, 0, dtype=torch.int32)


def grouped_peer_fns(p: Problem) -> dict[str, Callable[[], object]]:
    out = torch.empty(p.total, p.n, dtype=torch.bfloat16, device="cuda")
    wt = p.w.transpose(-2, -1)
    xq, xs = rowwise_fp8_stacked(p.x)
    wq, ws = rowwise_fp8_stacked(p.w)
    fns = {
        "torch_grouped_mm_bf16": lambda: torch._grouped_mm(p.x, wt, offs=p.offs, out_dtype=torch.bfloat16),
        "torch_scaled_grouped_mm_fp8": lambda: torch._scaled_grouped_mm(
            xq, wq.transpose(-2, -1), xs, ws, offs=p.offs, out_dtype=torch.bfloat16
        ),
    }
    if balanced(p.rows):
        x3 = p.x.reshape(p.experts, p.rows[0], p.k)
        fns["cublas_bf16_bmm"] = lambda: torch.bmm(x3, wt, out=out.reshape(p.experts, p.rows[0], p.n))
    return fns


def time_grouped_peers(p: Problem, notes: dict[str, str]) -> dict[str, float | None]:
    times: dict[str, float | None] = {}
    for name, fn in grouped_peer_fns(p).items():
        try:
            times[name] = median_us(fn)
        except Exception as e:  # a peer that cannot run this shape is recorded, not fatal
            times[name] = None
            notes[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return times


class Quantized:
    """The problem in one format: packed activations and weights with their SfAtom scales."""

    def __init__(self, fp4, p: Problem, fmt: str) -> None:
        mode = HALOPS_MODES[fmt]
        self.mode = mode
        self.a, self.sfa = fp4.group_wise_quant(p.x, mode)
        # the weights expert by expert (N rows each, a multiple of 128): their scale tiles concatenate
        parts = [fp4.group_wise_quant(p.w[e], mode) for e in range(p.experts)]
        self.b = torch.stack([v for v, _ in parts])
        self.sfb = torch.cat([s for _, s in parts])
        self.alpha = torch.ones(p.experts, device="cuda")


def grouped_ours_fns(fp4, p: Problem, q: Quantized) -> dict[str, Callable[[], object]]:
    """The grouped functions on this problem: masked (max_m = the largest group), contiguous, batched."""
    max_m = max(p.rows)
    fns: dict[str, Callable[[], object]] = {}
    # the masked layout: expert e's rows at e * max_m, the rest of its max_m rows other random tokens
    padded = torch.randn(p.experts * max_m, p.k, device="cuda").to(torch.bfloat16)
    starts = torch.cumsum(torch.tensor([0] + p.rows[:-1]), 0).tolist()
    for e, (start, rows) in enumerate(zip(starts, p.rows, strict=True)):
        padded[e * max_m : e * max_m + rows] = p.x[start : start + rows]
    masked_in, masked_sfa = fp4.group_wise_quant(padded, q.mode)
    del padded
    masked_out = torch.empty(p.experts * max_m, p.n, dtype=torch.bfloat16, device="cuda")
    fns["masked"] = lambda: fp4.group_masked_gemm(
        masked_in, q.b, masked_sfa, q.sfb, p.counts, masked_out, alpha=q.alpha, max_m_per_expert=max_m, mode=q.mode
    )
    out = torch.empty(p.total, p.n, dtype=torch.bfloat16, device="cuda")
    ids = torch.repeat_interleave(torch.arange(p.experts, dtype=torch.int32, device="cuda"), p.counts)
    fns["contiguous"] = lambda: fp4.group_contiguous_gemm(q.a, q.b, q.sfa, q.sfb, ids, out, alpha=q.alpha, mode=q.mode)
    if balanced(p.rows):
        a3 = q.a.reshape(p.experts, p.rows[0], -1)
        out3 = out.reshape(p.experts, p.rows[0], p.n)
        fns["batched"] = lambda: fp4.batch_gemm(a3, q.b, q.sfa, q.sfb, out3, alpha=q.alpha, mode=q.mode)
    return fns


def dense_engine_us(fp4, p: Problem, q: Quantized) -> float:
    """E serial dense calls: one timing per distinct group shape, times the groups of that shape, on
    expert 0's weight (N % 128 == 0 here, so its scales are the buffer's first N rows)."""
    total = 0.0
    b, sfb, alpha = q.b[0], q.sfb[: p.n], q.alpha[:1]
    for rows in sorted(set(p.rows)):
        a, sfa = fp4.group_wise_quant(p.x[:rows], q.mode)
        out = torch.empty(rows, p.n, dtype=torch.bfloat16, device="cuda")
        t = median_us(lambda a=a, sfa=sfa, out=out: fp4.dense_gemm(a, b, sfa, sfb, out, alpha=alpha, mode=q.mode))
        total += t * p.rows.count(rows)
    return total


def speedup(peer: float | None, ours: float) -> float | None:
    return None if peer is None else round(peer / ours, 3)


def grouped_rows(fp4, cases: tuple, formats: list[str]) -> list[dict]:
    rows: list[dict] = []
    for name, counts in cases:
        for n, k in GROUPED_NK:
            p = Problem(counts, n, k, seed=len(rows))
            notes: dict[str, str] = {}
            peer_us = time_grouped_peers(p, notes)
            for fmt in formats:
                q = Quantized(fp4, p, fmt)
                fns = grouped_ours_fns(fp4, p, q)
                serial = dense_engine_us(fp4, p, q)
                for grouping, fn in fns.items():
                    if grouping != "masked" and name not in OTHER_GROUPINGS.get(grouping, ()):
                        continue
                    ours = median_us(fn)
                    rows.append({
                        "op": GROUPING_OPS[grouping], "grouping": grouping, "format": fmt, "case": name,
                        "E": p.experts, "rows_per_group": counts if not balanced(counts) else counts[0], "N": n,
                        "K": k, "ours_us": round(ours, 2), "dense_engine_us": round(serial, 2),
                        **{f"{peer}_us": None if t is None else round(t, 2) for peer, t in peer_us.items()},
                        "ratio_vs_dense_engine": speedup(serial, ours),
                        "ratio_vs_torch_grouped_mm_bf16": speedup(peer_us["torch_grouped_mm_bf16"], ours),
                        "ratio_vs_torch_scaled_grouped_mm_fp8": speedup(peer_us["torch_scaled_grouped_mm_fp8"], ours),
                        "notes": notes,
                    })  # fmt: skip
                    r = rows[-1]
                    print(r["op"], fmt, name, n, k, r["ours_us"], r["ratio_vs_dense_engine"],
                          r["ratio_vs_torch_grouped_mm_bf16"], flush=True)  # fmt: skip
                del q, fns
            del p
            torch.cuda.empty_cache()
    return rows


def moe_layer_row(fp4) -> dict:
    """The MoE layer of the tests at a prefill shape: 4096 tokens, top-8 of 64 experts, hidden 4096,
    intermediate 1536 (MXFP8), against the same routing in bf16 with torch._grouped_mm."""
    tokens, experts, topk, hidden, inter, max_tokens = 4096, 64, 8, 4096, 1536, 1024
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(torch.bfloat16)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, device="cuda")[:topk] for _ in range(tokens)])
    xq, xs = fp4.group_wise_quant(x, "w8a8-mxfp8", use_swizzle=False)
    q13 = [fp4.group_wise_quant(w13[e], "w8a8-mxfp8") for e in range(experts)]
    q2 = [fp4.group_wise_quant(w2[e], "w8a8-mxfp8") for e in range(experts)]
    b13, s13 = torch.stack([v for v, _ in q13]), torch.cat([s for _, s in q13])
    b2, s2 = torch.stack([v for v, _ in q2]), torch.cat([s for _, s in q2])
    gate_up = torch.empty(experts * max_tokens, 2 * inter, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(experts * max_tokens, hidden, dtype=torch.bfloat16, device="cuda")

    def ours() -> None:
        permuted, sfa, _, counts = fp4.prefill_permute_to_masked_gemm(xq, xs, ids, experts, max_tokens)
        masked_m = counts.reshape(experts)
        fp4.group_masked_gemm(permuted, b13, sfa, s13, masked_m, gate_up, max_m_per_expert=max_tokens,
                              mode="w8a8-mxfp8")  # fmt: skip
        act, act_scales = fp4.fused_swiglu_quant(gate_up, masked_m)
        fp4.group_masked_gemm(act, b2, act_scales, s2, masked_m, out, max_m_per_expert=max_tokens, mode="w8a8-mxfp8")

    order = torch.argsort(ids.reshape(-1), stable=True)
    offs = torch.cumsum(torch.bincount(ids.reshape(-1), minlength=experts), 0).to(torch.int32)

    def bf16() -> None:
        routed = x[order // topk]
        h = torch._grouped_mm(routed, w13.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)

    peer = median_us(bf16)
    mine = median_us(ours)
    return {"op": "moe_layer", "grouping": "masked", "format": "mxfp8", "case": "4096 tokens top-8 of 64",
            "E": experts, "N": 2 * inter, "K": hidden, "ours_us": round(mine, 2),
            "torch_grouped_mm_bf16_us": round(peer, 2), "ratio_vs_torch_grouped_mm_bf16": speedup(peer, mine),
            "notes": {"torch_grouped_mm_bf16": "gather by routing, grouped_mm, silu * up, grouped_mm"}}  # fmt: skip


# ---- skinny: M <= 16 decode GEMMs ---------------------------------------------------------------

TARGET_FACTOR = 1.25
SKINNY_L2_BYTES = 60 * 2**20
SKINNY_TIMING = {"warmup": 10, "rep": 40}
SKINNY_FORMATS = ("nvfp4", "mxfp4", "mxfp8", "w4a16-nvfp4", "w4a16-mxfp4")
SKINNY_MS = (1, 2, 4, 8, 16)
SKINNY_EXPERT_SHAPES = ((4096, 7168), (7168, 2048), (2048, 7168), (1536, 7168))
SKINNY_GROUPED_CASES = ((64, 4), (256, 8))  # experts x rows per expert
SKINNY_GROUPED_SHAPE = (4096, 7168)
SKINNY_SHAPES = {"all": QUALIFICATION_SHAPES + SKINNY_EXPERT_SHAPES, "qualification": QUALIFICATION_SHAPES,
                 "experts": SKINNY_EXPERT_SHAPES, "none": ()}  # fmt: skip
SWEEP_SHAPES = ((17408, 5120), (4096, 7168), (1536, 7168))
SWEEP_KNOBS = tuple(itertools.product((1, 2, 3, 4), (2, 3, 4)))


def skinny_us(fn: Callable[[], object]) -> float:
    return median_us(fn, **SKINNY_TIMING)


def copy_bandwidth_gbps() -> float:
    """A 1 GiB device-to-device copy, bytes read + written per second."""
    src = torch.randint(0, 256, (2**30,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / skinny_us(lambda: dst.copy_(src)) / 1e3


def copies(tensors: tuple[Tensor, ...]) -> list[tuple[Tensor, ...]]:
    """Enough copies of a weight that cycling through them overruns the L2 twice."""
    count = max(1, -(-2 * SKINNY_L2_BYTES // nbytes(*tensors)))
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(count - 1)]


def gemm_op(fp4, a, b, sfa, sfb, a_format: str, b_format: str, out: Tensor, grouping: str = "dense",
            group_index: Tensor | None = None, group_rows: int = 0, warps: int = 0,
            stages: int = 0) -> Tensor:  # fmt: skip
    fp4._gemm.GemmCall(
        a, b, None if a_format == "bf16" else sfa, sfb, a_format, b_format, grouping=grouping,
        group_index=group_index, group_rows=group_rows, out=out, variant=-1, warps=warps, stages=stages,
        splits=0, pdl=False,
    ).run()  # fmt: skip
    return out


def dequantized_bf16(fp4, b: Tensor, sfb: Tensor, fmt: str) -> Tensor:
    """The exact bf16 values of a quantized [rows, K] matrix (the package's dequantize kernel)."""
    out = torch.empty(b.shape[0], b.shape[1] * (2 if b.dtype == torch.uint8 else 1), dtype=torch.bfloat16,
                      device=b.device)  # fmt: skip
    fp4.ops.dequantize(b, sfb, fmt, True, out)
    return out


def bandwidth_row(op: str, fmt: str, m: int, n: int, k: int, traffic: int, ours_us: float, peer_us: float,
                  peer: str, copy_bw: float, err: float, **extra: object) -> dict:  # fmt: skip
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


class DecodeWeight:
    """One format's weight [N, K] quantized by the package, its copies and its bf16 dequantization."""

    def __init__(self, fp4, fmt: str, w: Tensor) -> None:
        self.b_format = fmt.removeprefix("w4a16-")
        self.a_format = "bf16" if fmt.startswith("w4a16") else self.b_format
        b, sfb = fp4.group_wise_quant(w, HALOPS_MODES[self.b_format])
        self.bf16 = dequantized_bf16(fp4, b, sfb, self.b_format)
        self.copies = copies((b, sfb))


def activation(fp4, fmt: str, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(a, sfa, exact bf16 values) for format fmt's activations; W4A16: x itself."""
    if fmt.startswith("w4a16"):
        return x, torch.empty(0, dtype=torch.uint8, device="cuda"), x
    a, sfa = fp4.group_wise_quant(x, HALOPS_MODES[fmt])
    return a, sfa, dequantized_bf16(fp4, a, sfa, fmt)


def decode_calls(fp4, fmt: str, weight: DecodeWeight, a: Tensor, sfa: Tensor, out: Tensor) -> dict:
    """op name -> (call(b, sfb) writing out, the weight copies it takes) for this format and M."""
    if fmt.startswith("w4a16"):
        return {"gemm": (lambda b, sfb: gemm_op(fp4, a, b, sfa, sfb, "bf16", weight.b_format, out), weight.copies)}
    if fmt != "nvfp4":
        mode = HALOPS_MODES[fmt]
        return {"dense_gemm": (lambda b, sfb: fp4.dense_gemm(a, b, sfa, sfb, out, mode=mode), weight.copies)}
    calls = {"nvfp4_gemm_bf16": (lambda b, sfb: fp4.nvfp4_gemm_bf16(a, b, sfa, sfb, out=out), weight.copies)}
    if a.shape[0] == 1:
        streamed = [(fp4.fp4_repack_b_interleaved_sm120(b), sfb) for b, sfb in weight.copies]
        calls["fp4_w4a4_gemv_warpsplit_interleaved_bf16"] = (
            lambda b, sfb: fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, b, sfa, sfb, out=out),
            streamed,
        )
    return calls


class DecodeCase(NamedTuple):
    """One (M, format) of a shape: the operands, the output buffer, the cuBLAS result and time."""

    m: int
    fmt: str
    weight: DecodeWeight
    a: Tensor
    sfa: Tensor
    out: Tensor
    peer: Tensor  # cuBLAS bf16 on the exact bf16 operands
    peer_us: float
    traffic: int  # bytes: the weight's values and scales, A's values and scales, the output


def cublas_us(x: Tensor, dense_copies: list[tuple[Tensor, ...]]) -> float:
    out = torch.empty(x.shape[0], dense_copies[0][0].shape[0], dtype=torch.bfloat16, device="cuda")
    return skinny_us(Rotation(lambda w: torch.mm(x, w.T, out=out), dense_copies))


def decode_cases(fp4, n: int, k: int, ms: tuple[int, ...] = SKINNY_MS, time_peer: bool = True) -> Iterator[DecodeCase]:
    """For each M (cuBLAS bf16 timed first, on the NVFP4 weight's exact values, unless not `time_peer`:
    peer_us NaN) and format: its case."""
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    weights = {fmt: DecodeWeight(fp4, fmt, w) for fmt in SKINNY_FORMATS}
    dense_copies = copies((weights["nvfp4"].bf16,)) if time_peer else []
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        peer_us = cublas_us(x, dense_copies) if time_peer else float("nan")  # the peer first
        for fmt, weight in weights.items():
            a, sfa, a_bf16 = activation(fp4, fmt, x)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            yield DecodeCase(m, fmt, weight, a, sfa, out, torch.mm(a_bf16, weight.bf16.T), peer_us,
                             nbytes(*weight.copies[0], a, sfa, out))  # fmt: skip


def decode_rows(fp4, n: int, k: int, copy_bw: float) -> list[dict]:
    rows = []
    for c in decode_cases(fp4, n, k):
        for op, (call, op_copies) in decode_calls(fp4, c.fmt, c.weight, c.a, c.sfa, c.out).items():
            ours_us = skinny_us(Rotation(call, op_copies))
            call(*op_copies[0])
            rows.append(bandwidth_row(op, c.fmt, c.m, n, k, c.traffic, ours_us, c.peer_us, "cublas_bf16", copy_bw,
                                      check(c.out, c.peer)))  # fmt: skip
    return rows


# ---- decode layers back to back in a CUDA graph (how a model's decode step runs) ----------------

STREAM_SHAPES = ((17408, 5120), (5120, 17408), (12288, 5120), (8192, 8192))  # the grid's weights of >= 30 MB
STREAM_MS = (1, 16)
STREAM_ROUNDS = 4  # passes over the weight copies in one graph
STREAM_REPEATS = 15


def graph_us_per_call(calls: list[Callable[[], object]]) -> float:
    """Per call: `calls` captured back to back STREAM_ROUNDS times in one CUDA graph, replayed; the
    median over STREAM_REPEATS replays. Each call's own launch options (PDL) are captured as they are."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(STREAM_ROUNDS):
            for call in calls:
                call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(STREAM_REPEATS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (STREAM_ROUNDS * len(calls)))
    return sorted(times)[len(times) // 2]


def mm_into(x: Tensor, out: Tensor, w: Tensor) -> Tensor:
    return torch.mm(x, w.T, out=out)


def stream_rows(fp4, n: int, k: int, copy_bw: float) -> list[dict]:
    """M in STREAM_MS, each format: our public function (dense_gemm, as a model's layers call it) and
    cuBLAS bf16, each on its weight's copies in turn (together more than twice the L2), in a graph."""
    rows, peer_us = [], {}  # cuBLAS per M: its time does not depend on the values
    for c in decode_cases(fp4, n, k, STREAM_MS, time_peer=False):
        if c.m not in peer_us:
            peer = functools.partial(mm_into, c.peer.new_empty(c.m, k).normal_(), torch.empty_like(c.out))
            peer_us[c.m] = graph_us_per_call([functools.partial(peer, *args) for args in copies((c.weight.bf16,))])
        ours = ours_fn(fp4, ours_for(c.fmt, "dense_gemm"), c.fmt, c.a, c.sfa, c.out)
        ours_us = graph_us_per_call([functools.partial(ours, *args) for args in c.weight.copies])
        rows.append(bandwidth_row("dense_gemm", c.fmt, c.m, n, k, c.traffic, ours_us, peer_us[c.m], "cublas_bf16",
                                  copy_bw, check(c.out, c.peer)))  # fmt: skip
    return rows


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
        a, b, sfa, sfb, counts, out, alpha=alpha, max_m_per_expert=rows, mode=HALOPS_MODES[fmt]
    )


def grouped_decode_row(fp4, fmt: str, w_bf16: Tensor, x: Tensor, experts: int, copy_bw: float) -> dict:
    """A masked grouped decode whose every group owns all its rows, against torch._grouped_mm bf16."""
    n, k = SKINNY_GROUPED_SHAPE
    per_expert = x.shape[0] // experts
    b_format = fmt.removeprefix("w4a16-")
    b, sfb = fp4.group_wise_quant(w_bf16, HALOPS_MODES[b_format])
    a, sfa, a_bf16 = activation(fp4, fmt, x)
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * per_expert
    peer_call = grouped_mm_bf16(a_bf16, dequantized_bf16(fp4, b, sfb, b_format).reshape(experts, n, k), offs)
    peer_us = skinny_us(peer_call)  # the peer first
    peer = peer_call()
    counts = torch.full((experts,), per_expert, dtype=torch.int32, device="cuda")
    out = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda")
    op, call = grouped_call(fp4, fmt, a, sfa, b.reshape(experts, n, -1), sfb, counts, out)
    ours_us = skinny_us(call)
    call()
    return bandwidth_row(op, fmt, per_expert, n, k, nbytes(b, sfb, a, sfa, out), ours_us, peer_us,
                         "torch_grouped_mm_bf16", copy_bw, check(out, peer), grouping="masked", E=experts,
                         rows_per_group=per_expert)  # fmt: skip


def grouped_decode_rows(fp4, copy_bw: float) -> list[dict]:
    n, k = SKINNY_GROUPED_SHAPE
    rows = []
    for experts, per_expert in SKINNY_GROUPED_CASES:
        w_bf16 = (torch.randn(experts * n, k, device="cuda") * 0.05).to(torch.bfloat16)
        x = torch.randn(experts * per_expert, k, device="cuda").to(torch.bfloat16)
        for fmt in ("nvfp4", "mxfp4", "w4a16-nvfp4"):
            rows.append(grouped_decode_row(fp4, fmt, w_bf16, x, experts, copy_bw))
            torch.cuda.empty_cache()
    return rows


def sweep_row(fp4, fmt: str, weight: DecodeWeight, m: int, k: int, warps: int, stages: int, copy_bw: float) -> dict:
    a, sfa, _ = activation(fp4, fmt, torch.randn(m, k, device="cuda").to(torch.bfloat16))
    n = weight.bf16.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

    def call(b: Tensor, sfb: Tensor) -> Tensor:
        return gemm_op(fp4, a, b, sfa, sfb, weight.a_format, weight.b_format, out, warps=warps, stages=stages)

    us = skinny_us(Rotation(call, weight.copies))
    fraction = nbytes(*weight.copies[0], a, sfa, out) / us / 1e3 / copy_bw
    print(f"sweep {fmt:12s} M={m:2d} {n:5d}x{k:5d} warps={warps} stages={stages} {us:8.1f} us {fraction:5.2f}",
          flush=True)  # fmt: skip
    return {"format": fmt, "M": m, "N": n, "K": k, "warps": warps, "stages": stages, "ours_us": round(us, 2),
            "fraction_of_copy_bw": round(fraction, 3)}  # fmt: skip


def sweep_rows(fp4, copy_bw: float) -> list[dict]:
    rows = []
    for n, k in SWEEP_SHAPES:
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        for fmt in ("nvfp4", "w4a16-nvfp4"):
            weight = DecodeWeight(fp4, fmt, w)
            for m in (1, 16):
                rows += [sweep_row(fp4, fmt, weight, m, k, warps, stages, copy_bw) for warps, stages in SWEEP_KNOBS]
    return rows


# ---- w4a16: W4A16 above the decode rows ---------------------------------------------------------

W4A16_FORMATS = ("w4a16-nvfp4", "w4a16-mxfp4")
W4A16_MS = (32, 64, 256, 1024, 4096)
W4A16_SHAPES = ((17408, 5120), (8192, 8192), (4096, 7168))


def w4a16_row(fp4, fmt: str, x: Tensor, packed: list, bf16: list) -> dict:
    """One format at one M: cuBLAS bf16 first, then ours, on the same activations and weight (packed:
    the weight's rotation copies, bf16: those of its exact bf16 values)."""
    w_bf16 = bf16[0][0]
    m, k, n = x.shape[0], x.shape[1], w_bf16.shape[0]
    b_format = fmt.removeprefix("w4a16-")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    cublas_us = skinny_us(Rotation(lambda wb: torch.mm(x, wb.T, out=out), bf16))
    peer = torch.mm(x, w_bf16.T)

    def ours(b: Tensor, sfb: Tensor) -> None:
        fp4.dense_gemm(x, b, None, sfb, out, mode=fmt)

    ours_us = skinny_us(Rotation(ours, packed))
    ours(*packed[0])  # the checked output: the first copy's
    major, minor = torch.cuda.get_device_capability()
    backend = fp4._gemm.described_call("bf16", b_format, m=m, n=n, k=k).backend(10 * major + minor) or "reference"
    r = {"op": "dense_gemm", "format": fmt, "M": m, "N": n, "K": k, "backend": backend,
         "ours_us": round(ours_us, 2), "cublas_bf16_us": round(cublas_us, 2),
         "ratio_vs_cublas_bf16": round(cublas_us / ours_us, 3), "check": check(out, peer)}  # fmt: skip
    print(f"{fmt:12s} M={m:5d} {n:5d}x{k:5d} {backend:12s} ours {ours_us:8.1f} us cuBLAS bf16"
          f" {cublas_us:8.1f} us x{r['ratio_vs_cublas_bf16']:5.2f} check {r['check']:.1e}", flush=True)  # fmt: skip
    return r


def w4a16_shape_rows(fp4, n: int, k: int) -> list[dict]:
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    weights = {}
    for fmt in W4A16_FORMATS:
        b_format = fmt.removeprefix("w4a16-")
        b, sfb = fp4.group_wise_quant(w, HALOPS_MODES[b_format])
        weights[fmt] = (copies((b, sfb)), copies((dequantized_bf16(fp4, b, sfb, b_format),)))
    rows = []
    for m in W4A16_MS:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        rows += [w4a16_row(fp4, fmt, x, packed, bf16) for fmt, (packed, bf16) in weights.items()]
    return rows


def w4a16_rows(fp4) -> list[dict]:
    rows = []
    for n, k in W4A16_SHAPES:
        rows += w4a16_shape_rows(fp4, n, k)
        torch.cuda.empty_cache()
    return rows


# ---- staged and e0m3-split: backends by name ----------------------------------------------------

STAGED_TIMING = {"warmup": 5, "rep": 50}  # short windows: the reference's float64 rows are slow
# (M, N_out, K): decode (the stage on the M <= 16 kernels), then the engine's
STAGED_SHAPES = ((1, 17408, 5120), (16, 17408, 5120), (256, 4096, 4096), (4096, 4096, 4096), (4096, 17408, 5120))
E0M3_SPLIT_SHAPES = ((256, 4096, 4096), (4096, 4096, 4096), (4096, 17408, 5120))  # (M, N, K)
E0M3_A_FORMATS = {"nvfp4": 1, "e0m3": 0}  # name -> e0m3_weight_gemm_fp16's a_format


def staged_shape_rows(fp4, m: int, n: int, k: int) -> list[dict]:
    def nvfp4(rows: int) -> tuple[Tensor, Tensor]:
        return fp4.quantize_fp4_sfa_bf16(torch.randn(rows, k, device="cuda", dtype=torch.bfloat16))

    (a, sfa), (b, sfb), (b2, sfb2) = nvfp4(m), nvfp4(n), nvfp4(2 * n)  # b2: GeGLU's interleaved gate/up weight
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    calls = {
        "nvfp4_gemm_bf16": (a, b, sfa, sfb),
        "nvfp4_gemm_nvfp4": (a, b, sfa, sfb),
        "nvfp4_gemm_bias_gelu_nvfp4_fp16": (a, b, sfa, sfb, bias),
        "nvfp4_gemm_geglu_nvfp4_fp16": (a, b2, sfa, sfb2),
    }
    bf16_us = median_us(lambda: fp4.nvfp4_gemm_bf16(a, b, sfa, sfb), **STAGED_TIMING)
    rows = []
    for name, args in calls.items():
        ours = getattr(fp4, name)
        theirs = on_reference(fp4, ours)
        reference_us = median_us(lambda fn=theirs, args=args: fn(*args), **STAGED_TIMING)
        ours_us = median_us(lambda fn=ours, args=args: fn(*args), **STAGED_TIMING)
        r = {"op": name, "shape": [m, n, k], "us": round(ours_us, 1), "reference_us": round(reference_us, 1),
             "speedup_vs_reference": round(reference_us / ours_us, 1),
             "time_vs_bf16_output": round(ours_us / bf16_us, 2)}  # fmt: skip
        rows.append(r)
        print(f"{name:34s} {str(r['shape']):20s} {r['us']:9.1f} us  ref {r['reference_us']:10.1f} us  "
              f"x{r['speedup_vs_reference']:7.1f}  {r['time_vs_bf16_output']:.2f} of bf16-output time")  # fmt: skip
    return rows


def staged_rows(fp4) -> list[dict]:
    return [row for shape in STAGED_SHAPES for row in staged_shape_rows(fp4, *shape)]


def e0m3_split_row(fp4, a_format: str, m: int, n: int, k: int) -> dict:
    def operand(fmt: str, rows: int, cols: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        return fp4.quantize_e0m3_sfa_fp16(x.half()) if fmt == "e0m3" else fp4.quantize_fp4_sfa_bf16(x)

    def on(backend: str, a, b, sfa, sfb, a_fmt: str, b_fmt: str) -> None:
        fp4._gemm.GemmCall(a, b, sfa, sfb, a_fmt, b_fmt, out=out, out_format="fp16", pdl=False).run_on(backend)

    a, sfa = operand(a_format, m, k)
    b, sfb = operand("e0m3", n, k)
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    split = 2 * (2 if a_format == "e0m3" else 1)
    # The inner GEMM alone: NVFP4 operands of the split's K' (their values do not change its time).
    a2, sfa2 = operand("nvfp4", m, split * k)
    b2, sfb2 = operand("nvfp4", n, split * k)
    engine_us = median_us(lambda: fp4.e0m3_weight_gemm_fp16(a, b, sfa, sfb, a_format=E0M3_A_FORMATS[a_format], out=out))
    split_us = median_us(lambda: on("e0m3_split", a, b, sfa, sfb, a_format, "e0m3"))
    inner_us = median_us(lambda: on("sm90_engine", a2, b2, sfa2, sfb2, "nvfp4", "nvfp4"))
    print(f"{a_format:6s} {str([m, n, k]):20s} engine {engine_us:8.1f} us  split {split_us:8.1f} us "
          f"(the GEMM over K' alone {inner_us:8.1f} us) x{split_us / engine_us:.2f}")  # fmt: skip
    return {"a_format": a_format, "shape": [m, n, k], "k_prime": split * k, "engine_us": round(engine_us, 1),
            "split_us": round(split_us, 1), "inner_gemm_us": round(inner_us, 1),
            "split_time_vs_engine": round(split_us / engine_us, 2)}  # fmt: skip


def e0m3_split_rows(fp4) -> list[dict]:
    return [e0m3_split_row(fp4, f, *shape) for f in E0M3_A_FORMATS for shape in E0M3_SPLIT_SHAPES]


# ---- quant: quantizers and MoE data movement ----------------------------------------------------

COPY_BW_GBPS = 4250.0  # the device-to-device copy bandwidth measured on the H200


@dataclass
class QuantCase:
    op: str
    mode: str
    shape: tuple[int, ...]
    bytes: int
    ours: Callable[[], object]
    torch_ref: Callable[[], object]


def same_op(fp4, op: str, mode: str, shape: tuple[int, ...], traffic: int, *args: object) -> QuantCase:
    """A case timing fp4.<op>(*args) against the same call with the reference's PyTorch ops."""
    ours = getattr(fp4, op)
    theirs = on_reference(fp4, ours)
    return QuantCase(op, mode, shape, traffic, lambda: ours(*args), lambda: theirs(*args))


def quantize_cases(fp4, m: int, k: int) -> list[QuantCase]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xh = x.half()
    cases = []
    for mode in ("w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4"):
        q, s = fp4.group_wise_quant(x, mode)
        cases.append(same_op(fp4, "group_wise_quant", mode, (m, k), nbytes(x, q, s), x, mode))
    q, s = fp4.quantize_fp4_sfa_bf16(x)
    flat = {
        "quantize_fp4_sfa_bf16": (x, "nvfp4"),
        "quantize_fp4_sfa_fp16": (xh, "nvfp4"),
        "quantize_fp4_sfa_mse_bf16": (x, "nvfp4_mse"),
        "quantize_fp4_sfa_mse_fp16": (xh, "nvfp4_mse"),
        "quantize_e0m3_sfa_fp16": (xh, "e0m3"),
    }
    for op, (inp, mode) in flat.items():
        cases.append(same_op(fp4, op, mode, (m, k), nbytes(inp, q, s), inp))
    ragged = x[:, : k - 16].contiguous()  # a logical width that needs padding
    for op in ("quantize_fp4_sfa_padded_bf16", "pack_nvfp4_weight_bf16"):
        cases.append(same_op(fp4, op, "nvfp4", tuple(ragged.shape), nbytes(ragged, q, s), ragged))
    out = torch.empty(m, k, device="cuda", dtype=torch.float16)
    cases.append(same_op(fp4, "dequantize_fp4_sfa_fp16", "nvfp4", (m, k), nbytes(q, s, out), q, s, out))
    return cases


def swiglu_cases(fp4, experts: int, m: int, hidden: int) -> list[QuantCase]:
    x = torch.randn(experts * m, 2 * hidden, device="cuda", dtype=torch.bfloat16)
    counts = torch.full((experts,), m, device="cuda", dtype=torch.int32)
    cases = []
    for is_fp4, mode in ((False, "mxfp8"), (True, "nvfp4")):
        v, s = fp4.fused_swiglu_quant(x, counts, is_fp4=is_fp4)
        cases.append(same_op(fp4, "fused_swiglu_quant", mode, tuple(x.shape), nbytes(x, v, s), x, counts, is_fp4))
    return cases


def permute_cases(fp4, tokens: int, hidden: int, topk: int, experts: int) -> list[QuantCase]:
    cases = []
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
        cases.append(
            same_op(fp4, "prefill_permute_to_masked_gemm", mode, shape, traffic, x, scale, ids, experts, max_tokens)
        )
    return cases


def quant_row(case: QuantCase, ours_us: float, torch_us: float) -> dict:
    """The JSON row: our time, the reference's, GB/s = bytes / our time and its fraction of copy bandwidth."""
    gbps = case.bytes / ours_us / 1e3
    return {
        "op": case.op,
        "mode": case.mode,
        "shape": list(case.shape),
        "bytes": case.bytes,
        "us": round(ours_us, 2),
        "torch_us": round(torch_us, 2),
        "GBps": round(gbps, 1),
        "fraction_of_copy_bw": round(gbps / COPY_BW_GBPS, 3),
        "speedup_vs_torch": round(torch_us / ours_us, 2),
    }


def quant_rows(fp4) -> list[dict]:
    cases = quantize_cases(fp4, 16384, 8192) + swiglu_cases(fp4, 8, 2048, 4096) + permute_cases(fp4, 16384, 4096, 8, 64)
    rows = []
    for case in cases:
        torch_us = median_us(case.torch_ref)  # the peer first, then ours
        rows.append(quant_row(case, median_us(case.ours), torch_us))
        r = rows[-1]
        print(
            f"{r['op']:34s} {r['mode']:10s} {str(r['shape']):24s} {r['us']:9.1f} us {r['GBps']:7.0f} GB/s "
            f"{r['fraction_of_copy_bw']:5.2f} x{r['speedup_vs_torch']:7.1f}"
        )
    return rows
