"""The grouped GEMMs (batch_gemm, group_masked_gemm, group_contiguous_gemm) on the GPU: every group's
owned rows within the docs/FORMATS.md bound of float64 math on its own exactly dequantized operands
(alpha and bias per group), every other row of the poisoned output bitwise untouched, for every
mode; group counts and sizes from one row to many tiles (rows per group not multiples of 128), N
and K from their smallest legal values up; masked counts above max_m (clamped), negative (none) and
all zero; contiguous ids with -1 padding before, between and after experts' rows; run-to-run and
CUDA-graph replay bitwise equal, and a replay with new counts or ids gives the new result.

The expectations are computed here group by group (not with reference.gemm_into), from the operands
that the native quantizer wrote and reference.dequantize decoded."""

from __future__ import annotations

import pytest
import torch
from cases import dispatched
from checks import POISON_BYTE, assert_bitwise_equal, assert_within_bound, poisoned_like
from conftest import requires_arch

MODES = {"w8a8-mxfp8": "mxfp8", "w4a4-mxfp4": "mxfp4", "w4a4-nvfp4": "nvfp4"}
GROUPINGS = ("batched", "masked", "contiguous")


# ---- which problems the engine serves (host-side: runs without a GPU) ---------------------------


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("fmt", list(MODES.values()))
def test_engine_serves_grouped_gemms_of_every_mode(fp4, grouping, fmt):
    assert dispatched(fp4, 90, fmt, m=256, n=4096, k=7168, grouping=grouping) == "sm90_engine"


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_engine_serves_groups_whose_rows_and_n_are_not_tile_multiples(fp4, grouping):
    assert dispatched(fp4, 90, m=200, n=2880, k=2880, grouping=grouping) == "sm90_engine"


def test_engine_leaves_grouped_rows_of_16_byte_misaligned_k_to_the_reference(fp4):
    assert dispatched(fp4, 90, m=256, n=256, k=48, grouping="masked") == ""


# ---- operands and expectations ------------------------------------------------------------------


def random_bf16(rows: int, cols: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(rows, cols, generator=g, device="cuda") * scale).to(torch.bfloat16)


def quantized(fp4, ref, mode: str, rows: int, k: int, seed: int, scale: float = 1.0):
    """(values, scales) of a random [rows, K] matrix from the native quantizer, and its float64 values."""
    values, scales = fp4.group_wise_quant(random_bf16(rows, k, seed, scale), mode)
    return values, scales, ref.dequantize(values, scales, ref.FORMATS[MODES[mode]]).double()


class Weights:
    """E weight matrices [E, N, K] with their scales over the E*N rows, alpha [E] and bias [E, N]."""

    def __init__(self, fp4, ref, mode: str, experts: int, n: int, k: int, seed: int = 100) -> None:
        values, self.scales, dq = quantized(fp4, ref, mode, experts * n, k, seed, scale=0.05)
        self.values = values.reshape(experts, n, -1)
        self.dq = dq.reshape(experts, n, k)
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        self.alpha = torch.rand(experts, generator=g, device="cuda") + 0.5
        self.bias = random_bf16(experts, n, seed + 2, scale=0.1)


def assert_group_rows(out, a_dq, w: Weights, group: int, rows: torch.Tensor, what: str) -> None:
    """Rows `rows` of out hold alpha[g] * A[rows] @ W[g]^T + bias[g] within the bound."""
    if rows.numel() == 0:
        return
    alpha = w.alpha[group].double()
    a = a_dq[rows]
    expected = alpha * (a @ w.dq[group].T) + w.bias[group].double()
    assert_within_bound(out[rows], expected, a * alpha, w.dq[group], f"{what} group {group}")


def assert_untouched(out: torch.Tensor, owned: torch.Tensor, what: str) -> None:
    """Every row outside `owned` (bool per row) still holds the poison bytes."""
    rest = out[~owned].view(torch.uint8)
    assert bool((rest == POISON_BYTE).all()), f"{what}: a row no group owns was written"


def masked_rows(counts: list[int], max_m: int) -> list[torch.Tensor]:
    return [torch.arange(e * max_m, e * max_m + min(max(c, 0), max_m), device="cuda") for e, c in enumerate(counts)]


def run_masked(fp4, mode, a, sfa, w: Weights, counts: torch.Tensor, max_m: int, out=None) -> torch.Tensor:
    if out is None:
        out = poisoned_like(torch.empty(a.shape[0], w.values.shape[1], dtype=torch.bfloat16, device="cuda"))
    fp4.group_masked_gemm(a, w.values, sfa, w.scales, counts, out, w.bias, w.alpha, max_m, mode=mode)
    return out


def check_masked(fp4, ref, mode, experts, max_m, counts, n, k, seed=0) -> None:
    a, sfa, a_dq = quantized(fp4, ref, mode, experts * max_m, k, seed)
    w = Weights(fp4, ref, mode, experts, n, k)
    out = run_masked(fp4, mode, a, sfa, w, torch.tensor(counts, dtype=torch.int32, device="cuda"), max_m)
    what = f"masked {mode} E={experts} max_m={max_m} {n=} {k=}"
    owned = torch.zeros(experts * max_m, dtype=torch.bool, device="cuda")
    for e, rows in enumerate(masked_rows(counts, max_m)):
        assert_group_rows(out, a_dq, w, e, rows, what)
        owned[rows] = True
    assert_untouched(out, owned, what)


# ---- masked -------------------------------------------------------------------------------------


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(
    "experts,max_m", [(1, 1), (3, 7), (8, 128), (3, 200), (1, 1000), (64, 16)], ids=lambda v: str(v)
)
def test_masked_gemm_owned_rows_are_within_the_bound(fp4, ref, mode, experts, max_m):
    g = torch.Generator().manual_seed(experts * 1000 + max_m)
    counts = torch.randint(0, max_m + 1, (experts,), generator=g).tolist()
    counts[0] = max_m  # one full group
    check_masked(fp4, ref, mode, experts, max_m, counts, 256, 512)


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("nk", [(1, 32), (8, 64), (2880, 2880), (4096, 7168)], ids=lambda s: f"n{s[0]}k{s[1]}")
def test_masked_gemm_smallest_and_large_n_and_k_are_within_the_bound(fp4, ref, mode, nk):
    n, k = nk
    check_masked(fp4, ref, mode, 3, 200, [200, 57, 129], n, k)


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
def test_masked_gemm_clamps_counts_above_max_m_and_below_zero(fp4, ref, mode):
    check_masked(fp4, ref, mode, 4, 200, [500, -3, 0, 200], 384, 256)


@requires_arch(90)
def test_masked_gemm_with_every_count_zero_writes_nothing(fp4, ref):
    check_masked(fp4, ref, "w4a4-nvfp4", 8, 64, [0] * 8, 256, 256)


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
def test_masked_gemm_one_hot_expert_and_the_rest_empty(fp4, ref, mode):
    check_masked(fp4, ref, mode, 8, 1000, [0, 0, 0, 1000, 0, 0, 0, 0], 512, 512)


# ---- batched ------------------------------------------------------------------------------------


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("batches,m", [(1, 1), (3, 7), (8, 128), (3, 200), (2, 1000)], ids=lambda v: str(v))
def test_batch_gemm_is_within_the_bound(fp4, ref, mode, batches, m):
    n, k = 264, 512
    a, sfa, a_dq = quantized(fp4, ref, mode, batches * m, k, 3)
    w = Weights(fp4, ref, mode, batches, n, k)
    out = poisoned_like(torch.empty(batches, m, n, dtype=torch.bfloat16, device="cuda"))
    fp4.batch_gemm(a.reshape(batches, m, -1), w.values, sfa, w.scales, out, w.bias, w.alpha, mode=mode)
    flat = out.reshape(batches * m, n)
    for b in range(batches):
        assert_group_rows(flat, a_dq, w, b, torch.arange(b * m, (b + 1) * m, device="cuda"), f"batched {mode}")


# ---- contiguous ---------------------------------------------------------------------------------


def contiguous_ids(runs: list[tuple[int, int]]) -> torch.Tensor:
    """Expert ids from (id, rows) runs, e.g. [(-1, 3), (0, 200), (-1, 5), (2, 7)]."""
    return torch.cat([torch.full((rows,), e, dtype=torch.int32) for e, rows in runs]).cuda()


def check_contiguous(fp4, ref, mode, experts, ids: torch.Tensor, n, k, what) -> torch.Tensor:
    a, sfa, a_dq = quantized(fp4, ref, mode, ids.numel(), k, 5)
    w = Weights(fp4, ref, mode, experts, n, k)
    out = poisoned_like(torch.empty(ids.numel(), n, dtype=torch.bfloat16, device="cuda"))
    fp4.group_contiguous_gemm(a, w.values, sfa, w.scales, ids, out, w.bias, w.alpha, mode=mode)
    for e in range(experts):
        assert_group_rows(out, a_dq, w, e, (ids == e).nonzero().flatten(), f"{what} {mode}")
    assert_untouched(out, (ids >= 0) & (ids < experts), f"{what} {mode}")
    return out


# Up to 1024 rows and experts every CTA finds the spans itself (grouping.cuh, spans_in_block); the
# 1320 rows of empty_experts take find_group_spans' kernel.
CONTIGUOUS_LAYOUTS = {
    "padding_before_between_after": (3, [(-1, 5), (0, 200), (-1, 61), (1, 7), (2, 129), (-1, 3)]),
    "one_row_experts": (8, [(e, 1) for e in range(8)]),
    "empty_experts": (8, [(1, 300), (-1, 20), (6, 1000)]),
    "one_hot_expert": (64, [(-1, 1), (17, 1000)]),
    "tile_aligned": (4, [(0, 128), (1, 256), (2, 128), (3, 128)]),
    "a_thousand_one_row_experts": (1000, [(e, 1) for e in range(1000)]),
}


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("layout", list(CONTIGUOUS_LAYOUTS))
def test_contiguous_gemm_owned_rows_are_within_the_bound(fp4, ref, mode, layout):
    experts, runs = CONTIGUOUS_LAYOUTS[layout]
    check_contiguous(fp4, ref, mode, experts, contiguous_ids(runs), 320, 256, layout)


@requires_arch(90)
@pytest.mark.parametrize("nk", [(1, 32), (2880, 2880)], ids=lambda s: f"n{s[0]}k{s[1]}")
def test_contiguous_gemm_smallest_and_large_n_and_k_are_within_the_bound(fp4, ref, nk):
    n, k = nk
    ids = contiguous_ids([(0, 70), (-1, 9), (2, 300)])
    check_contiguous(fp4, ref, "w4a4-nvfp4", 3, ids, n, k, f"n={n} k={k}")


@requires_arch(90)
def test_contiguous_gemm_skips_ids_out_of_range(fp4, ref):
    ids = contiguous_ids([(0, 40), (7, 20), (-5, 10), (1, 30)])  # 7 and -5 name no expert of 2
    check_contiguous(fp4, ref, "w4a4-nvfp4", 2, ids, 256, 256, "out-of-range ids")


@requires_arch(90)
def test_contiguous_gemm_unsorted_ids_write_no_row_wrong(fp4, ref, monkeypatch):
    # docs/API.md: unsorted ids break the contract; without FP4_GEMM_DEBUG they are not checked on
    # CUDA, and every row is then either left as it was or holds its own expert's result
    monkeypatch.delenv("FP4_GEMM_DEBUG", raising=False)
    mode, n, k = "w4a4-nvfp4", 256, 256
    ids = contiguous_ids([(1, 50), (0, 30), (1, 20)])
    a, sfa, a_dq = quantized(fp4, ref, mode, ids.numel(), k, 7)
    w = Weights(fp4, ref, mode, 2, n, k)
    out = poisoned_like(torch.empty(ids.numel(), n, dtype=torch.bfloat16, device="cuda"))
    fp4.group_contiguous_gemm(a, w.values, sfa, w.scales, ids, out, w.bias, w.alpha, mode=mode)
    written = ~(out.view(torch.int16) == int.from_bytes(bytes([POISON_BYTE] * 2), "little", signed=True)).all(dim=1)
    for e in range(2):
        assert_group_rows(out, a_dq, w, e, ((ids == e) & written).nonzero().flatten(), "unsorted ids")


@requires_arch(90)
def test_contiguous_gemm_unsorted_ids_raise_under_debug(fp4, ref, monkeypatch):
    monkeypatch.setenv("FP4_GEMM_DEBUG", "1")
    mode = "w4a4-nvfp4"
    ids = contiguous_ids([(1, 50), (0, 30)])
    a, sfa, _ = quantized(fp4, ref, mode, ids.numel(), 256, 7)
    w = Weights(fp4, ref, mode, 2, 256, 256)
    out = torch.empty(ids.numel(), 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="sorted"):
        fp4.group_contiguous_gemm(a, w.values, sfa, w.scales, ids, out, w.bias, w.alpha, mode=mode)


# ---- determinism and CUDA graphs ----------------------------------------------------------------


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
def test_masked_gemm_replays_in_a_graph_with_new_counts(fp4, ref, mode):
    experts, max_m, n, k = 8, 200, 512, 1024
    a, sfa, a_dq = quantized(fp4, ref, mode, experts * max_m, k, 11)
    w = Weights(fp4, ref, mode, experts, n, k)
    counts = torch.tensor([200, 3, 0, 129, 64, 1, 200, 77], dtype=torch.int32, device="cuda")
    first = run_masked(fp4, mode, a, sfa, w, counts, max_m)
    assert_bitwise_equal(run_masked(fp4, mode, a, sfa, w, counts, max_m), first, "second run")
    out = poisoned_like(first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_masked(fp4, mode, a, sfa, w, counts, max_m, out)
    out.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, first, "graph replay")
    new_counts = [0, 200, 17, 0, 130, 200, 5, 0]
    counts.copy_(torch.tensor(new_counts, dtype=torch.int32))
    out.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    owned = torch.zeros(experts * max_m, dtype=torch.bool, device="cuda")
    for e, rows in enumerate(masked_rows(new_counts, max_m)):
        assert_group_rows(out, a_dq, w, e, rows, "replay with new counts")
        owned[rows] = True
    assert_untouched(out, owned, "replay with new counts")


@requires_arch(90)
def test_contiguous_gemm_replays_in_a_graph_with_new_ids(fp4, ref):
    mode, experts, n, k = "w8a8-mxfp8", 4, 384, 512
    ids = contiguous_ids([(0, 100), (-1, 28), (1, 200), (3, 56)])
    a, sfa, a_dq = quantized(fp4, ref, mode, ids.numel(), k, 13)
    w = Weights(fp4, ref, mode, experts, n, k)
    out = poisoned_like(torch.empty(ids.numel(), n, dtype=torch.bfloat16, device="cuda"))
    fp4.group_contiguous_gemm(a, w.values, sfa, w.scales, ids, out, w.bias, w.alpha, mode=mode)  # eager first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.group_contiguous_gemm(a, w.values, sfa, w.scales, ids, out, w.bias, w.alpha, mode=mode)
    ids.copy_(contiguous_ids([(-1, 10), (1, 130), (2, 200), (-1, 44)]))
    out.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    for e in range(experts):
        assert_group_rows(out, a_dq, w, e, (ids == e).nonzero().flatten(), "replay with new ids")
    assert_untouched(out, ids >= 0, "replay with new ids")


# ---- the MoE layer end to end -------------------------------------------------------------------


class MoeLayer:
    """prefill_permute_to_masked_gemm -> group_masked_gemm (gate/up) -> fused_swiglu_quant ->
    group_masked_gemm (down), MXFP8 (as DeepEP's low-latency layout feeds it)."""

    def __init__(self, fp4, ref, experts: int, hidden: int, inter: int, max_tokens: int) -> None:
        self.fp4, self.experts, self.hidden, self.inter, self.max_tokens = fp4, experts, hidden, inter, max_tokens
        self.gate_up = Weights(fp4, ref, "w8a8-mxfp8", experts, 2 * inter, hidden, seed=200)
        self.down = Weights(fp4, ref, "w8a8-mxfp8", experts, hidden, inter, seed=300)

    def __call__(self, x: torch.Tensor, x_scales: torch.Tensor, topk_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        fp4, e, m = self.fp4, self.experts, self.max_tokens
        permuted, sfa, _, counts = fp4.prefill_permute_to_masked_gemm(x, x_scales, topk_ids, e, m)
        masked_m = counts.reshape(e)
        gate_up = torch.empty(e * m, 2 * self.inter, dtype=torch.bfloat16, device="cuda")
        w = self.gate_up
        fp4.group_masked_gemm(
            permuted, w.values, sfa, w.scales, masked_m, gate_up, w.bias, w.alpha, m, mode="w8a8-mxfp8"
        )
        act, act_scales = fp4.fused_swiglu_quant(gate_up, masked_m)
        out = torch.empty(e * m, self.hidden, dtype=torch.bfloat16, device="cuda")
        w = self.down
        fp4.group_masked_gemm(act, w.values, act_scales, w.scales, masked_m, out, w.bias, w.alpha, m, mode="w8a8-mxfp8")
        return {"permuted": permuted, "sfa": sfa, "counts": masked_m, "gate_up": gate_up, "act": act,
                "act_scales": act_scales, "out": out}  # fmt: skip


def routing(tokens: int, experts: int, topk: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)]).cuda()


def assert_moe_layer_within_the_bound(ref, layer: MoeLayer, r: dict[str, torch.Tensor], what: str) -> None:
    """Each GEMM of the layer on its own inputs: gate/up on the permuted tokens, down on the SwiGLU."""
    e, m = layer.experts, layer.max_tokens
    rows = masked_rows(r["counts"].tolist(), m)
    permuted = ref.dequantize(r["permuted"], r["sfa"], ref.MXFP8).double()
    act = ref.dequantize(r["act"], r["act_scales"], ref.MXFP8).double()
    for g in range(e):
        assert_group_rows(r["gate_up"], permuted, layer.gate_up, g, rows[g], f"{what} gate/up")
        assert_group_rows(r["out"], act, layer.down, g, rows[g], f"{what} down")


@requires_arch(90)
def test_moe_layer_replays_in_a_graph_with_changing_routing(fp4, ref):
    tokens, experts, topk, hidden, inter, max_tokens = 192, 8, 2, 512, 256, 128
    layer = MoeLayer(fp4, ref, experts, hidden, inter, max_tokens)
    x, x_scales = fp4.group_wise_quant(random_bf16(tokens, hidden, 17), "w8a8-mxfp8", use_swizzle=False)
    topk_ids = routing(tokens, experts, topk, 1)
    eager = layer(x, x_scales, topk_ids)
    assert_moe_layer_within_the_bound(ref, layer, eager, "eager")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(x, x_scales, topk_ids)
    for seed in (2, 3):  # new routings, one with an expert past max_tokens (clamped)
        new_ids = routing(tokens, experts, topk, seed)
        if seed == 3:
            new_ids[:160, 0] = 5
        topk_ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        fresh = layer(x, x_scales, topk_ids)
        owned = torch.zeros(experts * max_tokens, dtype=torch.bool, device="cuda")
        for rows in masked_rows(fresh["counts"].tolist(), max_tokens):
            owned[rows] = True
        assert_bitwise_equal(captured["out"][owned], fresh["out"][owned], f"replay, routing {seed}")
        assert_moe_layer_within_the_bound(ref, layer, fresh, f"routing {seed}")


# ---- W4A16: bf16 activations, grouped 4-bit weights -------------------------------------------------


@requires_arch(90)
@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4"])
def test_masked_gemm_of_bf16_activations_is_within_the_bound(fp4, ref, b_format):
    experts, max_m, n, k = 3, 200, 320, 512
    mode = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4"}[b_format]
    a = random_bf16(experts * max_m, k, 31)
    w = Weights(fp4, ref, mode, experts, n, k)
    counts = [200, 0, 77]
    out = poisoned_like(torch.empty(experts * max_m, n, dtype=torch.bfloat16, device="cuda"))
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    fp4._gemm.GemmCall(
        a,
        w.values,
        None,
        w.scales,
        "bf16",
        b_format,
        grouping="masked",
        group_index=masked_m,
        group_rows=max_m,
        alpha=w.alpha,
        bias=w.bias,
        out=out,
    ).run()
    owned = torch.zeros(experts * max_m, dtype=torch.bool, device="cuda")
    for e, rows in enumerate(masked_rows(counts, max_m)):
        assert_group_rows(out, a.double(), w, e, rows, f"w4a16 masked {b_format}")
        owned[rows] = True
    assert_untouched(out, owned, f"w4a16 masked {b_format}")
