"""NVFP4 outputs encoded by the register-streaming skinny kernel itself (csrc/gemm/skinny/
register_stream.cuh's epilogue, csrc/gemm/nvfp4_output.cuh): one launch for the decode-sized
problems it serves, where the staged backend (test_gemm_staged.py) takes two and a float32 stage.

Host side: which backend dispatch picks. On the GPU: the fused output is bitwise the staged
backend's encoding of the same kernel's float32 sums (same knobs, so the same summation order),
NaN blocks included; the public functions' outputs meet the docs/FORMATS.md bound; every padding
byte of the scale grid (rows past M, columns past the last block) is zero; run-to-run and CUDA-graph
replay are bitwise equal."""

from __future__ import annotations

import pytest
import torch
from api_cases import nvfp4_operand
from cases import STAGED_KINDS, dispatched
from checks import assert_bitwise_equal, assert_nvfp4_output_within_bound, gelu64, poisoned_like
from conftest import requires_arch

# ---- which problems it serves (host-side: runs without a GPU) ------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("m", [1, 8, 9, 16])
@pytest.mark.parametrize("kind", STAGED_KINDS)
def test_register_stream_kernel_encodes_decode_sized_nvfp4_outputs(fp4, kind, m):
    assert dispatched(fp4, 90, m=m, **kind) == "skinny", f"{kind} {m=}"


@pytest.mark.kernels_ci
def test_nvfp4_outputs_take_the_kernel_the_float_output_would(fp4):
    """Above 8 rows on large weights the float output runs the staged kernel: so does the NVFP4 one,
    through the staged backend (the register-streaming kernel measured slower there)."""
    assert dispatched(fp4, 90, m=8, n=17408, k=5120, out_format="nvfp4") == "skinny"
    assert dispatched(fp4, 90, m=16, n=17408, k=5120, out_format="nvfp4") == "staged"
    assert dispatched(fp4, 90, m=16, n=17408, k=5120, out_format="bf16") == "skinny"  # the staged skinny kernel


@pytest.mark.kernels_ci
def test_register_stream_kernel_encodes_17_to_64_rows_where_it_serves_them(fp4):
    assert dispatched(fp4, 90, m=32, n=1536, k=7168, out_format="nvfp4") == "skinny"  # wide_stream_pays
    assert dispatched(fp4, 90, m=32, n=17408, k=5120, out_format="nvfp4") == "staged"  # the engine's float32 stage


@pytest.mark.kernels_ci
def test_staged_keeps_the_nvfp4_outputs_the_register_stream_kernel_does_not_take(fp4):
    # a persistent grid: the staged skinny kernel
    assert dispatched(fp4, 90, m=8, sm_count=66, out_format="nvfp4") == "staged"
    assert dispatched(fp4, 90, m=8, variant=3, out_format="nvfp4") == "staged"  # the staged skinny kernel by name
    assert dispatched(fp4, 90, m=256, out_format="nvfp4") == "staged"


# ---- results on the H200 ------------------------------------------------------------------------

# (M, N_out, K): a scale grid with padding columns (6 blocks of 4-column tiles) and without.
SHAPES = [(1, 96, 2048), (5, 96, 1024), (16, 256, 2048), (3, 2048, 4096)]
SPLITS = [1, 3, 8]


def operands(m: int, n: int, k: int, seed: int) -> list[torch.Tensor]:
    a, sfa = nvfp4_operand(m, k, seed)
    b, sfb = nvfp4_operand(n, k, seed + 1)
    return [t.cuda() for t in (a, b, sfa, sfb)]


def poisoned_nvfp4_out(fp4, m: int, n_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    packed = poisoned_like(torch.empty(m, n_out // 2, dtype=torch.uint8, device="cuda"))
    scales = poisoned_like(torch.empty(fp4.sfa_size_bytes(m, n_out), dtype=torch.uint8, device="cuda"))
    return packed, scales


def nvfp4_call(fp4, ops, m: int, n_out: int, kind: dict, **knobs):
    a, b, sfa, sfb = ops
    packed, scales = poisoned_nvfp4_out(fp4, m, n_out)
    bias = kind.get("bias")
    call = fp4._gemm.GemmCall(
        a, b, sfa, sfb, "nvfp4", "nvfp4", alpha_scale=0.5, bias=bias, activation=kind.get("activation", "none"),
        out=packed, out_scales=scales, out_format=kind["out_format"], pdl=False, **knobs,
    )  # fmt: skip
    return call, packed, scales


def assert_scale_padding_zero(fp4, scales: torch.Tensor, m: int, n_out: int, what: str) -> None:
    """Every byte of the swizzled grid that is not the scale of a real (row, block) is zero."""
    ref = fp4.reference
    nkb = n_out // 16
    rows, blocks = torch.meshgrid(torch.arange(m), torch.arange(nkb), indexing="ij")
    real = torch.zeros(scales.numel(), dtype=torch.bool)
    real[ref.sf_offset(rows.reshape(-1), blocks.reshape(-1), nkb)] = True
    assert (scales.cpu().reshape(-1)[~real] == 0).all(), f"{what}: a padding scale byte is not zero"


def kinds_with_bias(n: int) -> list[dict]:
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16).cuda()
    return [dict(kind) for kind in STAGED_KINDS] + [{"out_format": "nvfp4", "activation": "gelu", "bias": bias}]


@requires_arch(90)
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "m{}_n{}_k{}".format(*s))
def test_fused_nvfp4_output_is_bitwise_the_staged_encoding_of_the_same_sums(fp4, shape, splits):
    m, n_out, k = shape
    for kind in kinds_with_bias(2 * n_out):
        n = 2 * n_out if kind.get("activation") == "geglu" else n_out
        kind = kind | ({"bias": kind["bias"][:n]} if "bias" in kind else {})
        ops = operands(m, n, k, seed=m + n + splits)
        knobs = {"variant": 4, "splits": splits, "stages": 2}  # one plan for both: the same sums
        fused, packed, scales = nvfp4_call(fp4, ops, m, n_out, kind, **knobs)
        staged, staged_packed, staged_scales = nvfp4_call(fp4, ops, m, n_out, kind, **knobs)
        assert fused.backend(90) == "skinny"
        fused.run()
        staged.run_on("staged")
        what = f"{kind.get('activation', 'none')} {kind['out_format']}"
        assert_bitwise_equal(packed, staged_packed, f"{what} packed")
        assert_bitwise_equal(scales, staged_scales, f"{what} scales")
        assert_scale_padding_zero(fp4, scales, m, n_out, what)


@requires_arch(90)
def test_fused_nvfp4_output_of_a_nan_block_is_the_staged_nan_encoding(fp4):
    m, n_out, k = 4, 96, 2048
    ops = operands(m, n_out, k, seed=11)
    ops[3] = ops[3].clone()
    ops[3].view(-1)[fp4.reference.sf_offset(17, 5, k // 16)] = 0x7F  # a NaN scale of weight row 17
    kind = {"out_format": "nvfp4"}
    fused, packed, scales = nvfp4_call(fp4, ops, m, n_out, kind, variant=4, splits=2, stages=2)
    staged, staged_packed, staged_scales = nvfp4_call(fp4, ops, m, n_out, kind, variant=4, splits=2, stages=2)
    fused.run()
    staged.run_on("staged")
    got = fp4.reference.dequantize(packed.cpu(), scales.cpu(), fp4.reference.NVFP4).reshape(m, n_out)
    assert got[:, 16:32].isnan().all() and not got[:, :16].isnan().any()
    assert_bitwise_equal(packed, staged_packed, "packed")
    assert_bitwise_equal(scales, staged_scales, "scales")


def gemm64(fp4, a, b, sfa, sfb) -> torch.Tensor:
    ref = fp4.reference
    a_dq = ref.dequantize(a.cpu(), sfa.cpu(), ref.NVFP4).double()
    b_dq = ref.dequantize(b.cpu(), sfb.cpu(), ref.NVFP4).double()
    return a_dq @ b_dq.T


@requires_arch(90)
@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 16, 24, 32])
def test_public_nvfp4_outputs_on_the_register_stream_kernel_meet_the_bound(fp4, m):
    n, k = 96, 1024
    a, b, sfa, sfb = operands(m, n, k, seed=m)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    assert dispatched(fp4, 90, m=m, n=n, k=k, activation="gelu", out_format="nvfp4") == "skinny"
    packed, scales = poisoned_nvfp4_out(fp4, m, n)
    fp4.nvfp4_gemm_bias_gelu_nvfp4(a, b, sfa, sfb, bias.cuda(), out_packed=packed, out_sfa=scales)
    expected = gelu64(gemm64(fp4, a, b, sfa, sfb) + bias.double())
    assert_nvfp4_output_within_bound(fp4.reference, packed, scales, expected, "bias+gelu")
    assert_scale_padding_zero(fp4, scales, m, n, "bias+gelu")


@requires_arch(90)
def test_fused_nvfp4_output_is_bitwise_equal_run_to_run_and_under_graph_replay(fp4):
    m, n_out, k = 8, 256, 4096
    a, b, sfa, sfb = operands(m, 2 * n_out, k, seed=3)
    first = poisoned_nvfp4_out(fp4, m, n_out)
    fp4.nvfp4_gemm_geglu_nvfp4_fp16(a, b, sfa, sfb, out_packed=first[0], out_sfa=first[1])
    again = poisoned_nvfp4_out(fp4, m, n_out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.nvfp4_gemm_geglu_nvfp4_fp16(a, b, sfa, sfb, out_packed=again[0], out_sfa=again[1])
    for t in again:
        t.fill_(0xAB)
    graph.replay()
    torch.cuda.synchronize()
    for got, expected, what in zip(again, first, ("packed", "scales"), strict=True):
        assert_bitwise_equal(got, expected, f"geglu {what}")
