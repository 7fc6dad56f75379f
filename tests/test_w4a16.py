"""The W4A16 tier (bf16 activations, 4-bit weights): flashrt HEAD's adopt_nvfp4_w4a16_marlin /
allocate_w4a16_marlin_workspace / nvfp4_w4a16_marlin_bf16, the halops GEMMs' w4a16 modes, and the PDL
twins and standard-layout GEMV that came with it.

The adopted operands are checked against an independent dequantization of the ModelOpt tensors
(E2M1 codes by table, e4m3 scales through torch.float8_e4m3fn, times weight_scale_2). GEMM results are
held to the docs/FORMATS.md bound of float64 math (the bf16 activations are exact operands), on the
CPU reference and, on the H200, at every M from 1 to 17 and 64, 256, 1024, 4096 (the M <= 16 kernels,
the swapped engine, the Hopper engine's bf16 A and the composition backend), with poisoned outputs and
graph replay; the swapped engine by name at each of its activation tile widths."""

from __future__ import annotations

import pytest
import torch
from cases import dispatched
from checks import POISON_BYTE, assert_bitwise_equal, assert_within_bound, poisoned_like
from conftest import DEVICES, requires_arch
from decode_cases import EXPERT_SHAPES

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def modelopt_layer(n: int, k: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ModelOpt NVFP4 tensors: packed codes [N, K/2], e4m3 scales [N, K/16] (finite, positive,
    spread over many binades), weight_scale_2 [1]."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scale_bytes = torch.randint(0x08, 0x70, (n, k // 16), generator=g, dtype=torch.uint8)  # no NaN (0x7F)
    scale_2 = torch.tensor([0.0078125 * (1 + seed % 3)], dtype=torch.float32)
    return packed.to(device), scale_bytes.view(torch.float8_e4m3fn).to(device), scale_2.to(device)


def independent_dequant(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """weight = code * weight_scale * weight_scale_2, float64 [N, K], without the package's code."""
    packed = packed.cpu()
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    values = E2M1.double()[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).double()
    block = scale.cpu().float().double().repeat_interleave(16, dim=1)
    return values * block * scale_2.cpu().double()


def bf16(m: int, k: int, seed: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)


# ---- adoption ---------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_adopted_operands_dequantize_to_the_modelopt_weight(fp4, ref):
    n, k = 200, 256
    packed, scale, scale_2 = modelopt_layer(n, k, 1)
    weight, sf, global_scale, workspace = fp4.adopt_nvfp4_w4a16_marlin(packed, scale, scale_2)
    assert weight.dtype == torch.uint8 and tuple(weight.shape) == (n, k // 2)
    assert sf.dtype == torch.uint8 and sf.numel() == fp4.sfa_size_bytes(n, k)
    assert global_scale.dtype == torch.float32 and tuple(global_scale.shape) == (1,)
    assert workspace.dtype == torch.int32 and workspace.dim() == 1 and bool((workspace == 0).all())
    ours = ref.dequantize(weight, sf, ref.NVFP4).double() * global_scale.double()
    assert torch.equal(ours, independent_dequant(packed, scale, scale_2))


def test_adoption_accepts_the_scale_bytes_as_uint8(fp4):
    packed, scale, scale_2 = modelopt_layer(64, 128, 2)
    from_fp8 = fp4.adopt_nvfp4_w4a16_marlin(packed, scale, scale_2)[1]
    from_bytes = fp4.adopt_nvfp4_w4a16_marlin(packed, scale.view(torch.uint8), scale_2)[1]
    assert_bitwise_equal(from_bytes, from_fp8, "scales from uint8 bytes")


# ---- the GEMM on the CPU reference ------------------------------------------------------------


def assert_marlin_within_bound(out, x, packed, scale, scale_2, what: str) -> None:
    w = independent_dequant(packed, scale, scale_2)
    x64 = x.cpu().double()
    assert_within_bound(out.cpu(), x64 @ w.T, x64, w, what)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("m", [1, 5, 40])
def test_marlin_gemm_is_x_times_the_dequantized_weight_on_the_cpu(fp4, m):
    packed, scale, scale_2 = modelopt_layer(96, 256, 3)
    operands = fp4.adopt_nvfp4_w4a16_marlin(packed, scale, scale_2)
    x = bf16(m, 256, 4, "cpu")
    out = fp4.nvfp4_w4a16_marlin_bf16(x, *operands[:3], workspace=operands[3])
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (m, 96)
    assert_marlin_within_bound(out, x, packed, scale, scale_2, f"cpu {m=}")


@pytest.mark.parametrize("mode", ["w4a16-nvfp4", "w4a16-mxfp4"])
def test_halops_w4a16_modes_multiply_bf16_activations_on_the_cpu(fp4, ref, mode):
    fmt = ref.W4A16_MODES[mode]
    m, n, k = 40, 64, 128
    x = bf16(m, k, 5, "cpu")
    w, sfb = ref.quantize(bf16(n, k, 6, "cpu") * 0.05, fmt, swizzle=True)
    out = torch.full((m, n), 7.0, dtype=torch.bfloat16)
    bias = bf16(1, n, 7, "cpu").reshape(n)
    fp4.dense_gemm(x, w, None, sfb, out, bias=bias, alpha=torch.tensor([0.5]), mode=mode)
    w64 = ref.dequantize(w, sfb, fmt).double()
    assert_within_bound(out, 0.5 * (x.double() @ w64.T) + bias.double(), 0.5 * x.double(), w64, mode)


def test_halops_w4a16_modes_take_no_sfa(fp4, ref):
    x = bf16(8, 128, 5, "cpu")
    w, sfb = ref.quantize(bf16(64, 128, 6, "cpu"), ref.NVFP4, swizzle=True)
    out = torch.empty(8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="sfa must be None in mode 'w4a16-nvfp4'"):
        fp4.dense_gemm(x, w, sfb, sfb, out, mode="w4a16-nvfp4")


# ---- the PDL twins and the standard-layout GEMV -----------------------------------------------


def test_pdl_twins_give_their_twins_bytes(fp4, ref):
    x = bf16(40, 128, 8, "cpu")
    assert_bitwise_equal(fp4.quantize_fp4_sfa_bf16_pdl(x)[0], fp4.quantize_fp4_sfa_bf16(x)[0], "quantize pdl")
    a, sfa = fp4.quantize_fp4_sfa_bf16(bf16(16, 256, 9, "cpu"))
    b, sfb = fp4.quantize_fp4_sfa_bf16(bf16(64, 256, 10, "cpu"))
    twin = fp4.fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16(a, b, sfa, sfb, alpha=0.5)
    assert_bitwise_equal(twin, fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(a, b, sfa, sfb, alpha=0.5), "mrows pdl")


def test_standard_layout_gemv_is_the_nvfp4_gemm_at_one_row(fp4):
    a, sfa = fp4.quantize_fp4_sfa_bf16(bf16(1, 256, 11, "cpu"))
    b, sfb = fp4.quantize_fp4_sfa_bf16(bf16(72, 256, 12, "cpu"))
    gemv = fp4.fp4_w4a4_gemv_warpsplit_bf16(a, b, sfa, sfb, alpha=2.0)
    assert_bitwise_equal(gemv, fp4.nvfp4_gemm_bf16(a, b, sfa, sfb, alpha=2.0), "gemv")


# ---- which W4A16 problems the swapped engine takes on sm_90 (host-side: runs without a GPU) ------


@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4"])
def test_dispatch_gives_w4a16_of_9_to_256_rows_to_the_swapped_engine_where_it_measured_faster(fp4, b_format):
    """Every weight from 9 to 256 rows (docs/PERFORMANCE.md); the skinny tier keeps 8 rows and fewer."""
    for m, n in [(9, 4096), (16, 17408), (17, 4096), (64, 8192), (64, 17408), (128, 12288), (256, 17408)]:
        assert dispatched(fp4, 90, "bf16", b_format, m=m, n=n) == "sm90_swap_ab", f"{m=} {n=}"
    for m, n in [(1, 4096), (8, 17408), (257, 4096)]:
        assert dispatched(fp4, 90, "bf16", b_format, m=m, n=n) != "sm90_swap_ab", f"{m=} {n=}"


@pytest.mark.parametrize("variant", [3, 4])
def test_a_named_skinny_kernel_keeps_w4a16_of_9_to_16_rows(fp4, variant):
    assert dispatched(fp4, 90, "bf16", "nvfp4", m=12, variant=variant) == "skinny"


@pytest.mark.parametrize("kind", [{"bias": torch.bfloat16}, {"activation": "gelu"}, {"variant": 2}])
def test_swapped_engine_leaves_epilogues_and_named_tiles_to_the_engine(fp4, kind):
    assert dispatched(fp4, 90, "bf16", "nvfp4", m=64, **kind) == "sm90_engine"


# ---- on the GPU -------------------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("m", [*range(1, 18), 64, 256, 1024, 4096])
def test_marlin_gemm_every_m_is_within_the_bound_on_the_gpu(fp4, m):
    n, k = 520, 1024
    packed, scale, scale_2 = modelopt_layer(n, k, 13, "cuda")
    operands = fp4.adopt_nvfp4_w4a16_marlin(packed, scale, scale_2)
    x = bf16(m, k, 14, "cuda")
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    got = fp4.nvfp4_w4a16_marlin_bf16(x, *operands[:3], workspace=operands[3], out=out)
    assert got.data_ptr() == out.data_ptr()
    assert_marlin_within_bound(out, x, packed, scale, scale_2, f"gpu {m=}")


@requires_arch()
@pytest.mark.parametrize("m", [4, 100, 300])
def test_marlin_gemm_replays_in_a_cuda_graph(fp4, m):
    packed, scale, scale_2 = modelopt_layer(384, 512, 15, "cuda")
    weight, sf, gs, workspace = fp4.adopt_nvfp4_w4a16_marlin(packed, scale, scale_2)
    x = bf16(m, 512, 16, "cuda")
    first = fp4.nvfp4_w4a16_marlin_bf16(x, weight, sf, gs, workspace=workspace)
    out = poisoned_like(first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.nvfp4_w4a16_marlin_bf16(x, weight, sf, gs, workspace=workspace, out=out)
    out.view(torch.uint8).fill_(0xA5)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, first, f"graph replay {m=}")


@requires_arch()
@pytest.mark.parametrize("mode", ["w4a16-nvfp4", "w4a16-mxfp4"])
@pytest.mark.parametrize("m", [3, 200])
def test_halops_w4a16_dense_and_masked_are_within_the_bound_on_the_gpu(fp4, ref, mode, m):
    fmt = ref.W4A16_MODES[mode]
    experts, n, k = 3, 256, 512
    x = bf16(experts * m, k, 17, "cuda")
    w, sfb = ref.quantize(bf16(experts * n, k, 18, "cuda") * 0.05, fmt, swizzle=True)
    w64 = ref.dequantize(w, sfb, fmt).double()
    dense_out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    dense_sfb = sfb.reshape(-1)[: ref.sf_bytes(n, k // fmt.group)]
    fp4.dense_gemm(x[:m], w[:n], None, dense_sfb, dense_out, mode=mode)
    assert_within_bound(dense_out, x[:m].double() @ w64[:n].T, x[:m].double(), w64[:n], f"dense {mode} {m=}")
    counts = torch.tensor([m, m // 2, 0], dtype=torch.int32, device="cuda")
    out = poisoned_like(torch.empty(experts * m, n, dtype=torch.bfloat16, device="cuda"))
    fp4.group_masked_gemm(x, w.reshape(experts, n, -1), None, sfb, counts, out, max_m_per_expert=m, mode=mode)
    for e, count in enumerate(counts.tolist()):
        rows = slice(e * m, e * m + count)
        a = x[rows].double()
        assert_within_bound(out[rows], a @ w64[e * n : (e + 1) * n].T, a, w64[e * n : (e + 1) * n], f"masked {e=}")


# ---- the swapped engine (sm90_swap_ab) by name: every activation tile width ----------------------

# Activation rows of a swapped tile: 32, 64, 128 and 256 columns, each full and with a partial tile, and
# several 256-wide tiles (by name it serves up to 1024 rows).
SWAP_ROWS = [17, 32, 33, 64, 65, 128, 129, 256, 300, 1000]


@requires_arch(90)
@pytest.mark.parametrize("mode", ["w4a16-nvfp4", "w4a16-mxfp4"])
@pytest.mark.parametrize("m", SWAP_ROWS)
def test_swapped_engine_is_within_the_bound_at_every_activation_tile(fp4, ref, mode, m):
    """The weight's 520 rows end inside a 128-row tile and K = 1056 inside a 64-wide K tile; alpha and
    alpha_scale scale the result; odd M writes fp16, even M bf16 (the tile is stored transposed)."""
    fmt = ref.W4A16_MODES[mode]
    n, k, scale = 520, 1056, 0.75 * 0.5
    x = bf16(m, k, 28, "cuda")
    w, sfb = ref.quantize(bf16(n, k, 29, "cuda") * 0.05, fmt, swizzle=True)
    w64 = ref.dequantize(w, sfb, fmt).double() * scale
    dtype = torch.float16 if m % 2 else torch.bfloat16
    out = poisoned_like(torch.empty(m, n, dtype=dtype, device="cuda"))
    alpha = torch.tensor([0.75], dtype=torch.float32, device="cuda")
    out_format = "fp16" if dtype == torch.float16 else "bf16"
    call = fp4._gemm.GemmCall(x, w, None, sfb, "bf16", mode.split("-")[1], alpha=alpha, alpha_scale=0.5, out=out,
                              out_format=out_format)  # fmt: skip
    call.run_on("sm90_swap_ab")
    assert_within_bound(out, x.double() @ w64.T, x.double(), w64, f"swapped {mode} {m=}")


# ---- NaN scales, run-to-run equality, W4A16 MXFP4 at large M, the PDL twins on the GPU ----------

# (weight row, block) of the NaN scale codes: rows in the first, second and last (partial) 128-row
# scale tile of N = 520, blocks at the start, the middle and the end of K = 1024 (64 blocks).
NAN_SCALE_BLOCKS = [(7, 0), (130, 33), (517, 63)]


def with_nan_scales(scale: torch.Tensor, blocks: list[tuple[int, int]]) -> torch.Tensor:
    """A copy of a ModelOpt weight_scale (float8_e4m3fn [N, K/16]) with the NaN code 0x7F at each
    (row, block)."""
    codes = scale.view(torch.uint8).clone()
    for row, block in blocks:
        codes[row, block] = 0x7F
    return codes.view(torch.float8_e4m3fn)


def assert_marlin_nan_exactly_in_columns(out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor,
                                         scale: torch.Tensor, scale_2: torch.Tensor, columns: list[int],
                                         what: str) -> None:  # fmt: skip
    """NaN in every row of `columns` (the weight rows holding a NaN scale) and nowhere else; the other
    columns within the bound of their dequantized weight rows."""
    expected = torch.zeros(out.shape, dtype=torch.bool)
    expected[:, columns] = True
    nan_mask = out.isnan().cpu()
    assert torch.equal(nan_mask, expected), f"{what}: NaN differs at {(nan_mask ^ expected).nonzero().tolist()[:8]}"
    keep = (~expected[0]).nonzero().flatten()
    finite_scale = scale.view(torch.uint8).cpu()[keep].view(torch.float8_e4m3fn)
    assert_marlin_within_bound(out.cpu()[:, keep], x, packed.cpu()[keep], finite_scale, scale_2, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 4, 16, 17, 300])
def test_marlin_nan_scale_propagates_to_its_columns(fp4, m, device):
    """docs/FORMATS.md: a NaN scale gives NaN. The M <= 16 kernels and the engine above."""
    n, k = 520, 1024
    packed, scale, scale_2 = modelopt_layer(n, k, 19, device)
    scale = with_nan_scales(scale, NAN_SCALE_BLOCKS)
    operands = fp4.adopt_nvfp4_w4a16_marlin(packed, scale, scale_2)
    x = bf16(m, k, 20, device)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    fp4.nvfp4_w4a16_marlin_bf16(x, *operands[:3], workspace=operands[3], out=out)
    columns = [row for row, _ in NAN_SCALE_BLOCKS]
    assert_marlin_nan_exactly_in_columns(out, x, packed, scale, scale_2, columns, f"{device} {m=}")


@requires_arch()
@pytest.mark.parametrize("m", [1, 16, 64, 300, 4096])
def test_marlin_gemm_is_bitwise_equal_run_to_run(fp4, m):
    """Two calls into outputs poisoned with different bytes (an element left unwritten differs)."""
    n, k = EXPERT_SHAPES[2]  # (2048, 7168)
    packed, scale, scale_2 = modelopt_layer(n, k, 21, "cuda")
    weight, sf, gs, workspace = fp4.adopt_nvfp4_w4a16_marlin(packed, scale, scale_2)
    x = bf16(m, k, 22, "cuda")
    first = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    again = torch.empty_like(first)
    again.view(torch.uint8).fill_(POISON_BYTE ^ 0xFF)
    fp4.nvfp4_w4a16_marlin_bf16(x, weight, sf, gs, workspace=workspace, out=first)
    fp4.nvfp4_w4a16_marlin_bf16(x, weight, sf, gs, workspace=workspace, out=again)
    assert_bitwise_equal(again, first, f"run to run {m=}")


@requires_arch()
@pytest.mark.parametrize("m", [256, 4096])
def test_halops_w4a16_mxfp4_dense_gemm_is_within_the_bound_at_large_m(fp4, ref, m):
    mode = "w4a16-mxfp4"
    fmt = ref.W4A16_MODES[mode]
    n, k = 512, 1024
    x = bf16(m, k, 23, "cuda")
    w, sfb = ref.quantize(bf16(n, k, 24, "cuda") * 0.05, fmt, swizzle=True)
    w64 = ref.dequantize(w, sfb, fmt).double()
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    fp4.dense_gemm(x, w, None, sfb, out, mode=mode)
    assert_within_bound(out, x.double() @ w64.T, x.double(), w64, f"{mode} {m=}")


@requires_arch()
def test_pdl_quantizer_gives_its_twins_bytes_on_the_gpu(fp4):
    x = bf16(300, 512, 25, "cuda")
    twin = fp4.quantize_fp4_sfa_bf16(x)
    pdl = fp4.quantize_fp4_sfa_bf16_pdl(x, poisoned_like(twin[0]), poisoned_like(twin[1]))
    assert_bitwise_equal(pdl[0], twin[0], "quantize pdl values")
    assert_bitwise_equal(pdl[1], twin[1], "quantize pdl scales")


@requires_arch()
@pytest.mark.parametrize("m", [1, 7, 16])
def test_pdl_mrows_gemm_gives_its_twins_bytes_on_the_gpu(fp4, m):
    a, sfa = fp4.quantize_fp4_sfa_bf16(bf16(m, 1024, 26, "cuda"))
    b, sfb = fp4.quantize_fp4_sfa_bf16(bf16(512, 1024, 27, "cuda"))
    twin = fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(a, b, sfa, sfb, alpha=0.5)
    out = poisoned_like(twin)
    fp4.fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16(a, b, sfa, sfb, alpha=0.5, out=out)
    assert_bitwise_equal(out, twin, f"mrows pdl {m=}")
