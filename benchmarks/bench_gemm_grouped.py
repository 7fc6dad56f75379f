"""MoE grouped GEMMs: ours (batch_gemm, group_masked_gemm, group_contiguous_gemm) against what a Hopper
user runs instead, in one process, on the same shapes.

For each case (E experts x rows per expert, or a skewed routing) and (N, K), random bf16 activations
[E * rows, K] and weights [E, N, K] are made once; ours quantizes them with group_wise_quant (mode of
the row's format), the peers use them as they are:

  torch_grouped_mm_bf16         torch._grouped_mm on the bf16 activations and weights, offs = row ends
  torch_scaled_grouped_mm_fp8   torch._scaled_grouped_mm, e4m3 with row-wise float32 scales (re-quantized
                                outside the timing): another recipe, the FP8 ceiling
  cublas_bf16_bmm               torch.bmm on [E, rows, K] x [E, K, N] (balanced cases)
  dense_engine                  our dense_gemm on one group's shape (M = rows), times E (skewed: the sum
                                over the groups' shapes): E serial dense calls
  ours                          the grouped function of the row's "op"

Timing: medians of triton.testing.do_bench (L2 cleared before every run); every weight set is larger
than L2. ratio_vs_X = X's time / our time: above 1, ours is faster. A peer that raises is recorded in
"notes" and gets no ratio. The last row times the MoE layer of tests/test_gemm_grouped.py
(prefill_permute_to_masked_gemm -> group_masked_gemm -> fused_swiglu_quant -> group_masked_gemm, MXFP8)
against the same layer in bf16 with torch._grouped_mm.

    python benchmarks/bench_gemm_grouped.py                      # writes results/h200-gemm-grouped.json
    python benchmarks/bench_gemm_grouped.py --quick --out /tmp/g.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, load, median_us, write_results  # noqa: E402

Tensor = torch.Tensor
MODES = {"nvfp4": "w4a4-nvfp4", "mxfp8": "w8a8-mxfp8", "mxfp4": "w4a4-mxfp4"}
NK = ((4096, 7168), (7168, 2048))
# (name, rows per expert); "skewed": one expert with 2048 rows and seven with 8
CASES = (("8x256", [256] * 8), ("8x2048", [2048] * 8), ("32x64", [64] * 32), ("64x4", [4] * 64),
         ("256x8", [8] * 256), ("skewed", [2048] + [8] * 7))  # fmt: skip
QUICK_CASES = (CASES[0], CASES[3], CASES[5])
# the other two groupings run on these cases only (their cost is the masked one's plus the layout)
OTHER_GROUPINGS = {"contiguous": ("8x256", "skewed"), "batched": ("8x256",)}


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


def rowwise_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    """e4m3 values and float32 scales per row (a 3-D x matrix by matrix, to bound the float32 copies)."""
    if x.dim() == 3:
        parts = [rowwise_fp8(m) for m in x]
        return torch.stack([v for v, _ in parts]), torch.stack([s for _, s in parts])
    scale = x.float().abs().amax(dim=-1).clamp(min=1e-12) / 448.0
    return (x.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def peer_fns(p: Problem) -> dict[str, Callable[[], object]]:
    out = torch.empty(p.total, p.n, dtype=torch.bfloat16, device="cuda")
    wt = p.w.transpose(-2, -1)
    xq, xs = rowwise_fp8(p.x)
    wq, ws = rowwise_fp8(p.w)
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


def time_peers(p: Problem, notes: dict[str, str]) -> dict[str, float | None]:
    times: dict[str, float | None] = {}
    for name, fn in peer_fns(p).items():
        try:
            times[name] = median_us(fn)
        except Exception as e:  # a peer that cannot run this shape is recorded, not fatal
            times[name] = None
            notes[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return times


class Quantized:
    """The problem in one format: packed activations and weights with their SfAtom scales."""

    def __init__(self, fp4, p: Problem, fmt: str) -> None:
        mode = MODES[fmt]
        self.mode = mode
        self.a, self.sfa = fp4.group_wise_quant(p.x, mode)
        # the weights expert by expert (N rows each, a multiple of 128): their scale tiles concatenate
        parts = [fp4.group_wise_quant(p.w[e], mode) for e in range(p.experts)]
        self.b = torch.stack([v for v, _ in parts])
        self.sfb = torch.cat([s for _, s in parts])
        self.alpha = torch.ones(p.experts, device="cuda")


def ours_fns(fp4, p: Problem, q: Quantized) -> dict[str, Callable[[], object]]:
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


def dense_us(fp4, p: Problem, q: Quantized) -> float:
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


def ratio(peer: float | None, ours: float) -> float | None:
    return None if peer is None else round(peer / ours, 3)


def collect(fp4, cases, formats) -> list[dict]:
    rows: list[dict] = []
    for name, counts in cases:
        for n, k in NK:
            p = Problem(counts, n, k, seed=len(rows))
            notes: dict[str, str] = {}
            peers = time_peers(p, notes)
            for fmt in formats:
                q = Quantized(fp4, p, fmt)
                fns = ours_fns(fp4, p, q)
                serial = dense_us(fp4, p, q)
                for grouping, fn in fns.items():
                    if grouping != "masked" and name not in OTHER_GROUPINGS.get(grouping, ()):
                        continue
                    ours = median_us(fn)
                    rows.append({
                        "op": {"masked": "group_masked_gemm", "contiguous": "group_contiguous_gemm",
                               "batched": "batch_gemm"}[grouping],
                        "grouping": grouping, "format": fmt, "case": name, "E": p.experts,
                        "rows_per_group": counts if not balanced(counts) else counts[0], "N": n, "K": k,
                        "ours_us": round(ours, 2), "dense_engine_us": round(serial, 2),
                        **{f"{peer}_us": None if t is None else round(t, 2) for peer, t in peers.items()},
                        "ratio_vs_dense_engine": ratio(serial, ours),
                        "ratio_vs_torch_grouped_mm_bf16": ratio(peers["torch_grouped_mm_bf16"], ours),
                        "ratio_vs_torch_scaled_grouped_mm_fp8": ratio(peers["torch_scaled_grouped_mm_fp8"], ours),
                        "notes": notes,
                    })  # fmt: skip
                    print(rows[-1]["op"], fmt, name, n, k, rows[-1]["ours_us"], rows[-1]["ratio_vs_dense_engine"],
                          rows[-1]["ratio_vs_torch_grouped_mm_bf16"], flush=True)  # fmt: skip
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
            "torch_grouped_mm_bf16_us": round(peer, 2), "ratio_vs_torch_grouped_mm_bf16": ratio(peer, mine),
            "notes": {"torch_grouped_mm_bf16": "gather by routing, grouped_mm, silu * up, grouped_mm"}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-gemm-grouped.json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--formats", default="nvfp4,mxfp8,mxfp4")
    args = parser.parse_args()
    fp4 = load()
    rows = collect(fp4, QUICK_CASES if args.quick else CASES, args.formats.split(","))
    rows.append(moe_layer_row(fp4))
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
