"""Grouped decode (the MoE decode step) on the skinny kernels: batched, masked and contiguous problems
with at most 16 rows per group (on average, for contiguous ones), through the halops functions and the
gemm op (W4A16: bf16 activations). Each owned row is within the docs/FORMATS.md bound of float64 math
on its group's exactly dequantized weight, per-group alpha and bias included; every row a group does
not own (beyond masked_m, expert id -1 or out of range) still holds the poison, byte for byte. Empty
experts, experts with more than 16 rows, changing counts under CUDA-graph replay, run-to-run
bitwise equality.

Which backend serves a problem is asked from the build (GemmCall.backends): those tests run without a
GPU."""

from __future__ import annotations

import pytest
import torch
from cases import dispatched
from checks import POISON_BYTE, assert_bitwise_equal
from conftest import requires_arch
from decode_cases import (
    EXPERT_SHAPES,
    MODES,
    assert_close_to,
    epilogue_bound,
    gemm,
    gpu_activation,
    gpu_weight,
    poisoned_out,
    random_bf16,
)

GROUPINGS = ("batched", "masked", "contiguous")


# ---- which grouped problems the skinny kernels serve (host-side: runs without a GPU) ------------


@pytest.mark.parametrize("cc", (90, 100, 110, 120))
@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("pair", [(f, f) for f in MODES] + [("bf16", "nvfp4"), ("bf16", "mxfp4")], ids="-".join)
def test_skinny_serves_groups_of_up_to_16_rows(fp4, pair, grouping, cc):
    for m in (1, 4, 8, 16):
        got = dispatched(fp4, cc, *pair, m=m, n=4096, k=7168, grouping=grouping, unbuilt=True)
        assert got == "skinny", f"{m=} n=4096 k=7168"


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_skinny_leaves_larger_groups_and_unaligned_n_to_the_engines(fp4, grouping):
    assert dispatched(fp4, 90, m=17, grouping=grouping) != "skinny"
    assert dispatched(fp4, 90, m=4, n=4104, grouping=grouping) != "skinny"  # groups off the 128-row scale tiles


# ---- operands ------------------------------------------------------------------------------------


class GroupedOperands:
    """E weights [E, N, K] (their scales over the E * N flattened rows, as halops takes them), `rows`
    activation rows, per-group alpha and bias, on the GPU; float64 values of both."""

    def __init__(self, fp4, ref, a_format: str, b_format: str, experts: int, rows: int, n: int, k: int,
                 seed: int) -> None:  # fmt: skip
        b, self.sfb = gpu_weight(fp4, ref, b_format, experts * n, k, seed)
        self.b_dq = ref.dequantize(b, self.sfb, ref.FORMATS[b_format]).double().reshape(experts, n, k)
        self.b = b.reshape(experts, n, -1)
        self.a, self.sfa, self.a_dq = gpu_activation(fp4, ref, a_format, rows, k, seed + 1)
        g = torch.Generator(device="cuda").manual_seed(seed + 2)
        self.alpha = torch.rand(experts, generator=g, device="cuda") + 0.5
        self.bias = random_bf16(experts, n, seed + 3, device="cuda")
        self.formats = (a_format, b_format)

    def expected(self, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expected, bound) of every row for its group (rows of no group: anything)."""
        experts, n, k = self.b_dq.shape
        g = group.clamp(0, experts - 1)
        product = torch.zeros(g.numel(), n, dtype=torch.float64, device="cuda")
        abs_product = torch.zeros_like(product)
        for e in range(experts):
            rows = g == e
            product[rows] = self.a_dq[rows] @ self.b_dq[e].T
            abs_product[rows] = self.a_dq[rows].abs() @ self.b_dq[e].abs().T
        alpha = self.alpha.double()[g][:, None]
        bias = self.bias.double()[g]
        return epilogue_bound(alpha * product, abs_product, k, alpha, [bias], "none", torch.bfloat16)


def assert_grouped_output(out: torch.Tensor, ops: GroupedOperands, group: torch.Tensor, owned: torch.Tensor,
                          what: str) -> None:  # fmt: skip
    """Owned rows within the bound of their group's result; the other rows untouched (poison)."""
    flat = out.reshape(-1, out.shape[-1])
    expected, bound = ops.expected(group)
    if owned.any():
        assert_close_to(flat[owned], expected[owned], bound[owned], what)
    untouched = flat[~owned].view(torch.uint8)
    assert bool((untouched == POISON_BYTE).all()), f"{what}: a row no group owns was written"


def masked_rows(counts: list[int], max_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    experts = len(counts)
    group = torch.arange(experts * max_m, device="cuda") // max_m
    clamped = torch.tensor([min(max(c, 0), max_m) for c in counts], device="cuda")
    owned = torch.arange(experts * max_m, device="cuda") % max_m < clamped[group]
    return group, owned


# ---- masked ----------------------------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("max_m", [4, 16])
@pytest.mark.parametrize("fmt", list(MODES))
def test_masked_decode_matches_reference_with_empty_and_overflowing_experts(fp4, ref, fmt, max_m):
    """Counts: full, empty, part, above max_m (clamped), negative (empty), one row."""
    counts = [max_m, 0, max_m // 2, max_m + 5, -3, 1, max_m - 1, 0]
    experts, n, k = len(counts), 384, 1024
    ops = GroupedOperands(fp4, ref, fmt, fmt, experts, experts * max_m, n, k, seed=30 + max_m)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = poisoned_out(experts * max_m, n)
    fp4.group_masked_gemm(ops.a, ops.b, ops.sfa, ops.sfb, masked_m, out, bias=ops.bias, alpha=ops.alpha,
                          max_m_per_expert=max_m, mode=MODES[fmt])  # fmt: skip
    group, owned = masked_rows(counts, max_m)
    assert_grouped_output(out, ops, group, owned, f"{fmt} max_m={max_m}")


@requires_arch()
def test_masked_decode_replays_with_new_counts_and_is_bitwise_deterministic(fp4, ref):
    experts, max_m, n, k = 8, 8, 256, 512
    ops = GroupedOperands(fp4, ref, "nvfp4", "nvfp4", experts, experts * max_m, n, k, seed=40)
    masked_m = torch.tensor([8, 1, 0, 3, 8, 0, 5, 2], dtype=torch.int32, device="cuda")

    def call(out: torch.Tensor) -> None:
        fp4.group_masked_gemm(ops.a, ops.b, ops.sfa, ops.sfb, masked_m, out, bias=ops.bias, alpha=ops.alpha,
                              max_m_per_expert=max_m, mode="w4a4-nvfp4")  # fmt: skip

    first, again = poisoned_out(experts * max_m, n), poisoned_out(experts * max_m, n)
    call(first)
    call(again)
    assert_bitwise_equal(again, first, "run to run")
    out = poisoned_out(experts * max_m, n)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out)
    for counts in ([8, 1, 0, 3, 8, 0, 5, 2], [0, 8, 8, 0, 1, 2, 0, 9], [0] * 8):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.view(torch.uint8).fill_(POISON_BYTE)
        graph.replay()
        torch.cuda.synchronize()
        group, owned = masked_rows(counts, max_m)
        assert_grouped_output(out, ops, group, owned, f"replay counts {counts}")
    masked_m.copy_(torch.tensor([8, 1, 0, 3, 8, 0, 5, 2], dtype=torch.int32))
    out.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    assert_bitwise_equal(out, first, "graph replay")


@requires_arch()
@pytest.mark.parametrize("nk", EXPERT_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_masked_decode_expert_shapes_within_the_bound(fp4, ref, nk):
    n, k = nk
    counts = [4, 0, 3, 4, 1, 0, 2, 4]
    experts, max_m = len(counts), 4
    ops = GroupedOperands(fp4, ref, "nvfp4", "nvfp4", experts, experts * max_m, n, k, seed=41)
    out = poisoned_out(experts * max_m, n)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    fp4.group_masked_gemm(ops.a, ops.b, ops.sfa, ops.sfb, masked_m, out, bias=ops.bias, alpha=ops.alpha,
                          max_m_per_expert=max_m, mode="w4a4-nvfp4")  # fmt: skip
    group, owned = masked_rows(counts, max_m)
    assert_grouped_output(out, ops, group, owned, f"{n}x{k}")


# ---- batched ---------------------------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("fmt", list(MODES))
def test_batched_decode_matches_reference(fp4, ref, fmt):
    batches, m, n, k = 3, 5, 384, 512
    ops = GroupedOperands(fp4, ref, fmt, fmt, batches, batches * m, n, k, seed=50)
    out = poisoned_out(batches * m, n).reshape(batches, m, n)
    a = ops.a.reshape(batches, m, -1)
    fp4.batch_gemm(a, ops.b, ops.sfa, ops.sfb, out, bias=ops.bias, alpha=ops.alpha, mode=MODES[fmt])
    group = torch.arange(batches * m, device="cuda") // m
    assert_grouped_output(out, ops, group, torch.ones_like(group, dtype=torch.bool), fmt)


# ---- contiguous ------------------------------------------------------------------------------------


def contiguous_ids(layout: list[tuple[int, int]]) -> torch.Tensor:
    return torch.tensor([e for e, count in layout for _ in range(count)], dtype=torch.int32, device="cuda")


# -1 padding before, between and after experts; expert 3 with 40 rows (three 16-row chunks); experts
# 1, 4 and 6 empty.
CONTIGUOUS_LAYOUT = [(-1, 2), (0, 3), (2, 2), (-1, 1), (3, 40), (5, 1), (7, 16), (-1, 3)]


@requires_arch()
@pytest.mark.parametrize("fmt", list(MODES))
def test_contiguous_decode_skips_padding_rows_and_streams_large_experts_in_chunks(fp4, ref, fmt):
    experts, n, k = 8, 256, 768
    ids = contiguous_ids(CONTIGUOUS_LAYOUT)
    ops = GroupedOperands(fp4, ref, fmt, fmt, experts, ids.numel(), n, k, seed=60)
    out = poisoned_out(ids.numel(), n)
    fp4.group_contiguous_gemm(ops.a, ops.b, ops.sfa, ops.sfb, ids, out, bias=ops.bias, alpha=ops.alpha,
                              mode=MODES[fmt])  # fmt: skip
    assert_grouped_output(out, ops, ids.long(), ids >= 0, fmt)


@requires_arch()
def test_contiguous_decode_skips_out_of_range_ids(fp4, ref):
    """Ids outside [0, E) belong to no expert (the gemm op directly: the halops function would reject
    them in debug mode)."""
    experts, n, k = 4, 128, 256
    ids = contiguous_ids([(0, 2), (7, 3), (1, 1), (-5, 1), (3, 4), (4, 2)])
    ops = GroupedOperands(fp4, ref, "nvfp4", "nvfp4", experts, ids.numel(), n, k, seed=61)
    out = gemm(fp4, ops.a, ops.b, ops.sfa, ops.sfb, "nvfp4", "nvfp4", poisoned_out(ids.numel(), n), alpha=ops.alpha,
               bias=ops.bias, grouping="contiguous", group_index=ids)  # fmt: skip
    assert_grouped_output(out, ops, ids.long(), (ids >= 0) & (ids < experts), "out-of-range ids")


def routed_ids(experts: int, rows: int, padding: int, seed: int) -> torch.Tensor:
    """`rows` ids: random experts sorted, then `padding` of them turned into -1 padding rows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, experts, (rows,), generator=g, device="cuda").sort().values.to(torch.int32)
    ids[torch.randperm(rows, generator=g, device="cuda")[:padding]] = -1
    return ids


@requires_arch()
@pytest.mark.parametrize(
    "experts, rows",
    [(1000, 600), (64, 1024), (96, 1100)],
    ids=["1000-experts-spans-in-block", "1024-rows-spans-in-block", "1100-rows-spans-kernel"],
)
def test_contiguous_decode_of_many_experts_or_rows_is_within_the_bound(fp4, ref, experts, rows):
    """Up to 1024 rows and experts every CTA finds the spans itself (skinny/backend.cu,
    kBlockSpanLimit; 8 bytes of shared memory per expert); above, find_group_spans' kernel does."""
    n, k = 128, 256
    ids = routed_ids(experts, rows, padding=rows // 10, seed=experts + rows)
    ops = GroupedOperands(fp4, ref, "nvfp4", "nvfp4", experts, rows, n, k, seed=62)
    out = poisoned_out(rows, n)
    fp4.group_contiguous_gemm(ops.a, ops.b, ops.sfa, ops.sfb, ids, out, bias=ops.bias, alpha=ops.alpha,
                              mode="w4a4-nvfp4")  # fmt: skip
    assert_grouped_output(out, ops, ids.long(), ids >= 0, f"{experts} experts, {rows} rows")


@requires_arch()
def test_contiguous_decode_replays_with_new_ids_and_is_bitwise_deterministic(fp4, ref):
    ids = contiguous_ids(CONTIGUOUS_LAYOUT)
    experts, rows, n, k = 8, ids.numel(), 256, 512
    ops = GroupedOperands(fp4, ref, "nvfp4", "nvfp4", experts, rows, n, k, seed=63)

    def call(out: torch.Tensor) -> None:
        fp4.group_contiguous_gemm(ops.a, ops.b, ops.sfa, ops.sfb, ids, out, bias=ops.bias, alpha=ops.alpha,
                                  mode="w4a4-nvfp4")  # fmt: skip

    first, again = poisoned_out(rows, n), poisoned_out(rows, n)
    call(first)
    call(again)
    assert_bitwise_equal(again, first, "run to run")
    start = ids.clone()
    out = poisoned_out(rows, n)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out)
    for layout in ([(0, 20), (6, 48)], [(-1, 67), (7, 1)], [(-1, 68)], [(e, 8) for e in range(8)] + [(-1, 4)]):
        ids.copy_(contiguous_ids(layout))
        out.view(torch.uint8).fill_(POISON_BYTE)
        graph.replay()
        torch.cuda.synchronize()
        assert_grouped_output(out, ops, ids.long(), ids >= 0, f"replay {layout}")
    ids.copy_(start)
    out.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    assert_bitwise_equal(out, first, "graph replay")


# ---- W4A16 ---------------------------------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4"])
def test_w4a16_masked_and_contiguous_decode(fp4, ref, b_format):
    experts, max_m, n, k = 8, 4, 256, 512
    counts = [4, 0, 2, 4, 1, 9, 0, 3]
    ops = GroupedOperands(fp4, ref, "bf16", b_format, experts, experts * max_m, n, k, seed=70)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = gemm(fp4, ops.a, ops.b, ops.sfa, ops.sfb, "bf16", b_format, poisoned_out(experts * max_m, n),
               alpha=ops.alpha, bias=ops.bias, grouping="masked", group_index=masked_m, group_rows=max_m)  # fmt: skip
    group, owned = masked_rows(counts, max_m)
    assert_grouped_output(out, ops, group, owned, f"bf16 x {b_format} masked")

    ids = contiguous_ids(CONTIGUOUS_LAYOUT)
    ops = GroupedOperands(fp4, ref, "bf16", b_format, experts, ids.numel(), n, k, seed=71)
    out = gemm(fp4, ops.a, ops.b, ops.sfa, ops.sfb, "bf16", b_format, poisoned_out(ids.numel(), n), alpha=ops.alpha,
               bias=ops.bias, grouping="contiguous", group_index=ids)  # fmt: skip
    assert_grouped_output(out, ops, ids.long(), ids >= 0, f"bf16 x {b_format} contiguous")


# ---- NaN scales --------------------------------------------------------------------------------------

PAIRS = [(f, f) for f in MODES] + [("bf16", "nvfp4"), ("bf16", "mxfp4")]


def set_nan_weight_scales(ref, ops: GroupedOperands, blocks: list[tuple[int, int, int]]) -> None:
    """The NaN scale code of ops' weight format at each (expert, weight row, block), in ops.sfb
    (ops.b_dq keeps the finite values: the expectation of every output the NaN does not reach)."""
    experts, n, k = ops.b_dq.shape
    fmt = ref.FORMATS[ops.formats[1]]
    for expert, row, block in blocks:
        ops.sfb.reshape(-1)[ref.sf_offset(expert * n + row, block, k // fmt.group)] = fmt.scale_nan


def assert_nan_exactly_at(out: torch.Tensor, ops: GroupedOperands, group: torch.Tensor, owned: torch.Tensor,
                          nan_at: torch.Tensor, what: str) -> None:  # fmt: skip
    """NaN exactly at nan_at ([rows, N] bool); the other elements of owned rows within the bound of
    their group's result; the rows no group owns untouched (poison)."""
    flat = out.reshape(-1, out.shape[-1])
    nan_mask = flat.isnan()
    assert torch.equal(nan_mask, nan_at), f"{what}: NaN differs at {(nan_mask ^ nan_at).nonzero().tolist()[:8]}"
    expected, bound = ops.expected(group)
    finite = owned[:, None] & ~nan_at
    assert_close_to(flat[finite], expected[finite], bound[finite], what)
    untouched = flat[~owned].view(torch.uint8)
    assert bool((untouched == POISON_BYTE).all()), f"{what}: a row no group owns was written"


def nan_in_columns_of_expert(group: torch.Tensor, owned: torch.Tensor, n: int, expert: int,
                             columns: list[int]) -> torch.Tensor:  # fmt: skip
    """[rows, N] bool: True in `columns` of the rows `expert` owns."""
    nan_at = torch.zeros(group.numel(), n, dtype=torch.bool, device=group.device)
    nan_at[:, columns] = (owned & (group == expert))[:, None]
    return nan_at


def nan_weight_scales(ref, b_format: str, k: int) -> list[tuple[int, int, int]]:
    """(expert, weight row, block): expert 2 (rows in both groupings' layouts) at weight rows 5 (first
    block) and 130 (last block, the second 128-row scale tile); expert 1 (empty in both) at row 7,
    which must reach no output."""
    return [(2, 5, 0), (2, 130, k // ref.FORMATS[b_format].group - 1), (1, 7, 3)]


@requires_arch()
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_masked_decode_nan_weight_scale_propagates_to_its_experts_columns(fp4, ref, pair):
    counts = [4, 0, 3, 4, 1, 9, 0, 2]
    experts, max_m, n, k = len(counts), 4, 256, 512
    ops = GroupedOperands(fp4, ref, *pair, experts, experts * max_m, n, k, seed=80)
    set_nan_weight_scales(ref, ops, nan_weight_scales(ref, pair[1], k))
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = gemm(fp4, ops.a, ops.b, ops.sfa, ops.sfb, *pair, poisoned_out(experts * max_m, n), alpha=ops.alpha,
               bias=ops.bias, grouping="masked", group_index=masked_m, group_rows=max_m)  # fmt: skip
    group, owned = masked_rows(counts, max_m)
    nan_at = nan_in_columns_of_expert(group, owned, n, 2, [5, 130])
    assert_nan_exactly_at(out, ops, group, owned, nan_at, f"{pair} masked")


@requires_arch()
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_contiguous_decode_nan_weight_scale_propagates_to_its_experts_columns(fp4, ref, pair):
    ids = contiguous_ids(CONTIGUOUS_LAYOUT)
    experts, n, k = 8, 256, 512
    ops = GroupedOperands(fp4, ref, *pair, experts, ids.numel(), n, k, seed=81)
    set_nan_weight_scales(ref, ops, nan_weight_scales(ref, pair[1], k))
    out = gemm(fp4, ops.a, ops.b, ops.sfa, ops.sfb, *pair, poisoned_out(ids.numel(), n), alpha=ops.alpha,
               bias=ops.bias, grouping="contiguous", group_index=ids)  # fmt: skip
    group, owned = ids.long(), ids >= 0
    nan_at = nan_in_columns_of_expert(group, owned, n, 2, [5, 130])
    assert_nan_exactly_at(out, ops, group, owned, nan_at, f"{pair} contiguous")
