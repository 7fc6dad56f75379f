"""The native CUDA kernels of swiglu_quant and permute_to_masked against the CPU op (the reference),
bit for bit.

swiglu_quant writes only the owned rows of its outputs; permute_to_masked writes every byte. Every
call here writes into poisoned buffers, on the GPU and on the CPU alike, and the whole buffers are
compared: the bytes the op defines must be equal, and every byte it must leave alone must still hold
the poison. Each op also runs twice and under CUDA graph replay, which must reproduce the same bytes
(positions never depend on atomics).
"""

from __future__ import annotations

import pytest
import torch
from checks import POISON_BYTE, assert_bitwise_equal, poisoned_like
from conftest import requires_arch

pytestmark = requires_arch()

BF16_MAX = torch.finfo(torch.bfloat16).max
BF16_TINY = torch.finfo(torch.bfloat16).tiny

# ---- swiglu_quant -----------------------------------------------------------------------------

RECIPES = ("mxfp8", "nvfp4")

# Gate values around every hazard of the specified exp and of the quantizers: the clamp edges
# (-87, 88), saturation of exp(-gate) to Inf-like values, non-finite inputs, extremes of bf16.
SPECIAL_GATES = (
    float("nan"), float("inf"), -float("inf"), BF16_MAX, -BF16_MAX, BF16_TINY, -BF16_TINY, BF16_TINY / 8,
    0.0, -0.0, 87.0, -87.0, 88.0, -88.0, 89.0, -89.0, 100.0, -100.0, 1e30, -1e30, 1e-30, 0.5, -0.5,
)  # fmt: skip
SPECIAL_UPS = (float("nan"), float("inf"), -float("inf"), BF16_MAX, -BF16_MAX, 0.0, -0.0, BF16_TINY, 1e-30)


def count_pattern(experts: int, m: int) -> list[int]:
    """Counts covering every ownership case: the whole group, nothing, part, above M, negative."""
    pattern = [m, 0, m // 2, m + 5, -3, 1, max(m - 1, 0), 2**31 - 1, -(2**31)]
    return [pattern[e % len(pattern)] for e in range(experts)]


def swiglu_input(rows: int, hidden: int, seed: int, specials: bool = True) -> torch.Tensor:
    """[gate | up] in bf16: per-row magnitudes spread over many binades, plus the special values
    scattered over the rows (some land in owned rows, some in skipped ones)."""
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(rows, hidden, generator=g) * torch.exp2(torch.randint(-8, 7, (rows, 1), generator=g).float())
    up = torch.randn(rows, hidden, generator=g) * torch.exp2(torch.randint(-20, 20, (rows, 1), generator=g).float())
    if specials and rows:
        for values, half in ((SPECIAL_GATES, gate), (SPECIAL_UPS, up)):
            for v in values:
                at = torch.randint(0, rows * hidden, (max(1, rows * hidden // 4096),), generator=g)
                half.view(-1)[at] = v
            half[0, : len(values)] = torch.tensor(values)  # row 0: group 0, which always owns it
    return torch.cat([gate, up], dim=1).to(torch.bfloat16)


def owned_rows(counts: list[int], m: int) -> torch.Tensor:
    return torch.cat([torch.arange(m) < min(max(c, 0), m) for c in counts]) if m else torch.zeros(0, dtype=torch.bool)


def run_swiglu(fp4, x: torch.Tensor, counts: torch.Tensor, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered op on poisoned outputs of the shapes fused_swiglu_quant allocates."""
    values, scales = fp4._halops.swiglu_quant_outputs(x.shape[0], x.shape[1] // 2, recipe == "nvfp4", x.device)
    values, scales = poisoned_like(values), poisoned_like(scales)
    fp4.ops.swiglu_quant(x, counts, recipe, values, scales)
    return values, scales


def assert_swiglu_matches_cpu(fp4, x: torch.Tensor, counts: list[int], recipe: str, what: str) -> None:
    experts = len(counts)
    m = x.shape[0] // experts
    counts_t = torch.tensor(counts, dtype=torch.int32)
    expected = run_swiglu(fp4, x.cpu(), counts_t, recipe)
    got = run_swiglu(fp4, x, counts_t.to(x.device), recipe)
    assert_bitwise_equal(got[0], expected[0], f"{what} values")
    assert_bitwise_equal(got[1], expected[1], f"{what} scales")
    # what the comparison implies, stated on its own: rows not owned keep the poison
    skipped = ~owned_rows(counts, m)
    assert (got[0].view(torch.uint8).cpu()[skipped] == POISON_BYTE).all(), f"{what}: a skipped row was written"
    nkb = x.shape[1] // 2 // fp4.reference.FORMATS[recipe].group
    plain = fp4.reference.unswizzle_scales(got[1].cpu(), x.shape[0], nkb)
    assert (plain[skipped] == POISON_BYTE).all(), f"{what}: a skipped row's scales were written"


SWIGLU_SHAPES = (  # (experts, M, hidden): M around the 128-row scale tile, hidden around 4-block columns
    (1, 1, 32),
    (3, 40, 96),
    (4, 128, 256),
    (9, 100, 160),
    (2, 129, 512),
    (5, 300, 1024),
    (16, 37, 64),
)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", SWIGLU_SHAPES, ids=lambda s: "e{}_m{}_h{}".format(*s))
def test_swiglu_quant_cuda_equals_cpu_on_poisoned_outputs(fp4, device, recipe, shape):
    experts, m, hidden = shape
    x = swiglu_input(experts * m, hidden, seed=experts * 1000 + m + hidden).to(device)
    assert_swiglu_matches_cpu(fp4, x, count_pattern(experts, m), recipe, f"{recipe} E={experts} M={m} H={hidden}")


@pytest.mark.parametrize("recipe", RECIPES)
def test_swiglu_quant_cuda_equals_cpu_for_every_count_of_one_group(fp4, device, recipe):
    m, hidden = 70, 64
    counts = [-(2**31), -1, 0, 1, 31, 32, 33, 69, 70, 71, 2**31 - 1]
    x = swiglu_input(len(counts) * m, hidden, seed=3).to(device)
    assert_swiglu_matches_cpu(fp4, x, counts, recipe, f"{recipe} counts={counts}")


@pytest.mark.parametrize("recipe", RECIPES)
def test_swiglu_quant_cuda_equals_cpu_on_unaligned_input(fp4, device, recipe):
    """An input that starts 2 bytes into its storage: the kernel's element-wise loads."""
    experts, m, hidden = 3, 50, 128
    flat = swiglu_input(experts * m + 1, hidden, seed=4).reshape(-1).to(device)
    x = flat[1 : 1 + experts * m * 2 * hidden].view(experts * m, 2 * hidden)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    assert_swiglu_matches_cpu(fp4, x, count_pattern(experts, m), recipe, f"{recipe} unaligned input")


@pytest.mark.parametrize("recipe", RECIPES)
def test_swiglu_quant_cuda_equals_cpu_on_a_large_input(fp4, device, recipe):
    experts, m, hidden = 8, 1600, 2048  # input 8 * 1600 x 4096 bf16 = 105 MB; M not a multiple of 128
    x = swiglu_input(experts * m, hidden, seed=5).to(device)
    assert x.numel() * x.element_size() >= 100e6
    counts = [m, 1000, 0, m + 1, 1599, 1, -7, 800]
    assert_swiglu_matches_cpu(fp4, x, counts, recipe, f"{recipe} large")


@pytest.mark.parametrize("recipe", RECIPES)
def test_swiglu_quant_cuda_is_deterministic_and_graph_replayable(fp4, device, recipe):
    experts, m, hidden = 6, 200, 512
    x = swiglu_input(experts * m, hidden, seed=6).to(device)
    counts = torch.tensor(count_pattern(experts, m), dtype=torch.int32, device=device)
    first = run_swiglu(fp4, x, counts, recipe)
    second = run_swiglu(fp4, x, counts, recipe)
    for a, b, what in zip(first, second, ("values", "scales"), strict=True):
        assert_bitwise_equal(a, b, f"{recipe} {what} run to run")

    values, scales = poisoned_like(first[0]), poisoned_like(first[1])
    fp4.ops.swiglu_quant(x, counts, recipe, values, scales)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.ops.swiglu_quant(x, counts, recipe, values, scales)
    for t in (values, scales):
        t.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(values, first[0], f"{recipe} values graph replay")
    assert_bitwise_equal(scales, first[1], f"{recipe} scales graph replay")


@pytest.mark.parametrize("is_fp4", [False, True])
def test_fused_swiglu_quant_cuda_equals_cpu(fp4, device, is_fp4):
    experts, m, hidden = 4, 96, 256
    x = swiglu_input(experts * m, hidden, seed=7)
    counts = torch.tensor([m, 0, 50, 1], dtype=torch.int32)
    got = fp4.fused_swiglu_quant(x.to(device), counts.to(device), is_fp4=is_fp4)
    expected = fp4.fused_swiglu_quant(x, counts, is_fp4=is_fp4)
    for a, b, what in zip(got, expected, ("values", "scales"), strict=True):
        assert_bitwise_equal(a, b, f"fused_swiglu_quant {is_fp4=} {what}")


# ---- permute_to_masked ------------------------------------------------------------------------


def routing(kind: str, tokens: int, topk: int, experts: int, g: torch.Generator) -> torch.Tensor:
    if kind == "random":
        return torch.randint(0, experts, (tokens, topk), generator=g)
    if kind == "empty_experts":  # only every third expert receives tokens
        return torch.randint(0, (experts + 2) // 3, (tokens, topk), generator=g) * 3
    if kind == "hot_expert":  # every token's first slot goes to one expert, which overflows
        ids = torch.randint(0, experts, (tokens, topk), generator=g)
        ids[:, 0] = experts // 2
        return ids
    if kind == "invalid_ids":  # -1 (unassigned) and ids outside [0, E), small and huge
        ids = torch.randint(-2, experts + 2, (tokens, topk), generator=g)
        bad = torch.tensor([-1, experts, experts + 7, 2**40, -(2**40), 2**63 - 1, -(2**63)])
        at = torch.randint(0, ids.numel(), (min(ids.numel(), 64),), generator=g)
        ids.view(-1)[at] = bad[torch.arange(at.numel()) % bad.numel()]
        return ids
    raise ValueError(kind)


def permute_inputs(
    tokens: int, hidden: int, dtype: torch.dtype, broadcast: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, hidden, generator=g) * 8).to(dtype)
    if broadcast:
        scale = torch.randint(-(2**31), 2**31 - 1, (tokens, hidden // 512), generator=g, dtype=torch.int64)
        return x, scale.to(torch.int32)
    return x, torch.randint(0, 256, (tokens, hidden // 32), generator=g, dtype=torch.int64).to(torch.uint8)


def run_permute(fp4, x, scale, ids, experts, max_token_num) -> tuple[torch.Tensor, ...]:
    """The registered op on poisoned outputs of the shapes prefill_permute_to_masked_gemm allocates."""
    outputs = tuple(poisoned_like(t) for t in fp4._halops.permute_outputs(x, ids, experts, max_token_num))
    fp4.ops.permute_to_masked(x, scale, ids, experts, max_token_num, *outputs)
    return outputs


PERMUTE_OUTPUTS = ("permute_x", "out_scale", "index_map", "counts")


def assert_permute_matches_cpu(fp4, device, x, scale, ids, experts, max_token_num, what) -> tuple[torch.Tensor, ...]:
    expected = run_permute(fp4, x.cpu(), scale.cpu(), ids.cpu(), experts, max_token_num)
    got = run_permute(fp4, x.to(device), scale.to(device), ids.to(device), experts, max_token_num)
    for a, b, name in zip(got, expected, PERMUTE_OUTPUTS, strict=True):
        assert_bitwise_equal(a, b, f"{what} {name}")
    return got


# (tokens, topk, experts, max_token_num, hidden, kind): slots = tokens * topk spans 0, 1 and many
# 1024-slot chunks; max_token_num below an expert's load makes it overflow.
PERMUTE_CASES = (
    (300, 8, 16, 256, 512, "random"),
    (300, 8, 16, 128, 512, "random"),  # mean load 150 > 128: most experts overflow
    (500, 8, 257, 128, 1024, "random"),
    (200, 8, 30, 128, 512, "empty_experts"),
    (1000, 2, 8, 384, 512, "hot_expert"),
    (400, 8, 12, 256, 512, "invalid_ids"),
    (2500, 1, 1, 1024, 512, "random"),  # E = 1, topk = 1, overflow, 3 chunks
    (3, 1, 1, 128, 512, "random"),
    (4096, 8, 64, 640, 512, "random"),  # 32 chunks
    (0, 8, 4, 128, 512, "random"),  # no slots: counts all zero, every row zeroed
    (5, 8, 512, 128, 512, "invalid_ids"),  # E = 512, most experts empty
)


@pytest.mark.parametrize("dtype,broadcast", [(torch.bfloat16, True), (torch.float8_e4m3fn, False),
                                             (torch.bfloat16, False), (torch.float8_e4m3fn, True)])  # fmt: skip
@pytest.mark.parametrize("case", PERMUTE_CASES, ids=lambda c: "t{}_k{}_e{}_mt{}_h{}_{}".format(*c))
def test_permute_to_masked_cuda_equals_cpu_on_poisoned_outputs(fp4, device, case, dtype, broadcast):
    tokens, topk, experts, max_token_num, hidden, kind = case
    g = torch.Generator().manual_seed(tokens + topk + experts)
    ids = routing(kind, tokens, topk, experts, g)
    x, scale = permute_inputs(tokens, hidden, dtype, broadcast, seed=tokens + hidden)
    assert_permute_matches_cpu(fp4, device, x, scale, ids, experts, max_token_num, f"{case} {dtype} {broadcast=}")


def test_permute_to_masked_cuda_zeroes_every_row_nobody_lands_on(fp4, device):
    g = torch.Generator().manual_seed(12)
    ids = routing("empty_experts", 60, 4, 10, g)  # experts 0, 3, 6, 9 fill about half their rows
    x, scale = permute_inputs(60, 512, torch.bfloat16, True, seed=12)
    permuted, out_scale, _, counts = assert_permute_matches_cpu(fp4, device, x, scale, ids, 10, 128, "zero rows")
    filled = torch.arange(128)[None, :] < counts.cpu().clamp(max=128)
    assert (permuted.view(torch.uint8).cpu().view(10, 128, -1)[~filled] == 0).all()
    plain = fp4.reference.unswizzle_scales(out_scale.cpu().reshape(-1), 10 * 128, 512 // 32)
    assert (plain.view(10, 128, -1)[~filled] == 0).all()


def test_permute_to_masked_cuda_direct_scales_with_hidden_not_a_multiple_of_512(fp4, device):
    g = torch.Generator().manual_seed(8)
    ids = routing("random", 100, 4, 6, g)
    x, scale = permute_inputs(100, 384, torch.float8_e4m3fn, False, seed=8)
    assert_permute_matches_cpu(fp4, device, x, scale, ids, 6, 128, "hidden=384")


def test_permute_to_masked_cuda_unaligned_rows_copy_bytewise(fp4, device):
    """x starting one byte into its storage: the copy kernel's byte path."""
    tokens, hidden = 64, 256
    g = torch.Generator().manual_seed(9)
    ids = routing("invalid_ids", tokens, 3, 5, g)
    x, scale = permute_inputs(tokens, hidden, torch.float8_e4m3fn, False, seed=9)
    flat = torch.empty(tokens * hidden + 1, dtype=torch.uint8, device=device)
    flat[1:] = x.view(torch.uint8).reshape(-1).to(device)
    x_unaligned = flat[1:].view(torch.float8_e4m3fn).view(tokens, hidden)
    assert x_unaligned.data_ptr() % 16 != 0
    assert_permute_matches_cpu(fp4, device, x_unaligned, scale, ids, 5, 128, "unaligned x")


@pytest.mark.parametrize("dtype,broadcast", [(torch.bfloat16, True), (torch.float8_e4m3fn, False)])
def test_permute_to_masked_cuda_is_deterministic_and_graph_replayable(fp4, device, dtype, broadcast):
    tokens, topk, experts, max_token_num = 3000, 8, 32, 640  # 24 chunks; mean load 750: overflow
    g = torch.Generator().manual_seed(10)
    ids = routing("hot_expert", tokens, topk, experts, g).to(device)
    x, scale = permute_inputs(tokens, 1024, dtype, broadcast, seed=10)
    x, scale = x.to(device), scale.to(device)
    first = run_permute(fp4, x, scale, ids, experts, max_token_num)
    second = run_permute(fp4, x, scale, ids, experts, max_token_num)
    for a, b, name in zip(first, second, PERMUTE_OUTPUTS, strict=True):
        assert_bitwise_equal(a, b, f"{name} run to run")

    outputs = tuple(poisoned_like(t) for t in first)
    fp4.ops.permute_to_masked(x, scale, ids, experts, max_token_num, *outputs)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.ops.permute_to_masked(x, scale, ids, experts, max_token_num, *outputs)
    for t in outputs:
        t.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    for a, b, name in zip(outputs, first, PERMUTE_OUTPUTS, strict=True):
        assert_bitwise_equal(a, b, f"{name} graph replay")
    expected = run_permute(fp4, x.cpu(), scale.cpu(), ids.cpu(), experts, max_token_num)
    for a, b, name in zip(outputs, expected, PERMUTE_OUTPUTS, strict=True):
        assert_bitwise_equal(a, b, f"{name} graph replay vs CPU")


@pytest.mark.parametrize("dtype,broadcast", [(torch.bfloat16, True), (torch.float8_e4m3fn, False)])
def test_prefill_permute_to_masked_gemm_cuda_equals_cpu(fp4, device, dtype, broadcast):
    g = torch.Generator().manual_seed(11)
    ids = routing("invalid_ids", 700, 8, 24, g)
    x, scale = permute_inputs(700, 1024, dtype, broadcast, seed=11)
    got = fp4.prefill_permute_to_masked_gemm(x.to(device), scale.to(device), ids.to(device), 24, 256)
    expected = fp4.prefill_permute_to_masked_gemm(x, scale, ids, 24, 256)
    for a, b, name in zip(got, expected, PERMUTE_OUTPUTS, strict=True):
        assert_bitwise_equal(a, b, f"prefill_permute_to_masked_gemm {dtype} {name}")
