"""Every GEMM of both families against float64 math written out here, row by row, on the exactly
dequantized operands: grouping, alpha, bias, residual, activations, GeGLU, NVFP4 outputs, rows that
must stay untouched, NaN propagation. Bound (docs/FORMATS.md): |out - ref| <= ulp_out(ref) +
K * 2^-24 * (|A| @ |B|^T), plus one code step for quantized outputs."""

from __future__ import annotations

import pytest
import torch
from api_cases import make_call, mode_operand, nvfp4_operand
from checks import OpRecorder, assert_nvfp4_output_within_bound, assert_within_bound, gelu64

pytestmark = pytest.mark.kernels_ci

POISON = 7.0


def rows_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ B^T in float64, one output row at a time (independent of the reference's grouped code)."""
    rows = [(a[m].double()[None, :] * b.double()).sum(-1) for m in range(a.shape[0])]
    return torch.stack(rows) if rows else torch.zeros(0, b.shape[0], dtype=torch.float64)


def dq(ref, values, scales, fmt="nvfp4"):
    return ref.dequantize(values, scales, ref.FORMATS[fmt])


# ---- halops-style ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4"])
def test_dense_gemm_is_alpha_times_product_plus_bias(fp4, ref, mode):
    a, sfa = mode_operand(70, 256, mode, seed=1)
    w, sfb = mode_operand(48, 256, mode, seed=2)
    bias = torch.randn(48).to(torch.bfloat16)
    alpha = torch.tensor([0.375])
    out = torch.full((70, 48), POISON, dtype=torch.bfloat16)
    fp4.dense_gemm(a, w, sfa, sfb, out, bias=bias, alpha=alpha, mode=mode)
    fmt = ref.MODES[mode].name
    a_dq, w_dq = dq(ref, a, sfa, fmt), dq(ref, w, sfb, fmt)
    expected = 0.375 * rows_matmul(a_dq, w_dq) + bias.double()
    assert_within_bound(out, expected, a_dq, w_dq, f"dense {mode}")


def test_batch_gemm_uses_one_weight_alpha_and_bias_per_batch_item(fp4, ref):
    b, m, n, k = 3, 20, 32, 128
    a, sfa = mode_operand(b * m, k, "w4a4-nvfp4", seed=3)
    w, sfb = mode_operand(b * n, k, "w4a4-nvfp4", seed=4)
    alpha, bias = torch.tensor([1.0, -2.0, 0.5]), torch.randn(b, n).to(torch.bfloat16)
    out = torch.full((b, m, n), POISON, dtype=torch.bfloat16)
    fp4.batch_gemm(a.reshape(b, m, -1), w.reshape(b, n, -1), sfa, sfb, out, bias=bias, alpha=alpha, mode="w4a4-nvfp4")
    a_dq, w_dq = dq(ref, a, sfa).reshape(b, m, k), dq(ref, w, sfb).reshape(b, n, k)
    for i in range(b):
        expected = alpha[i].item() * rows_matmul(a_dq[i], w_dq[i]) + bias[i].double()
        assert_within_bound(out[i], expected, a_dq[i], w_dq[i], f"batch item {i}")


def test_group_contiguous_gemm_routes_rows_and_skips_padding(fp4, ref):
    e, n, k = 3, 32, 64
    ids = torch.tensor([0, 0, -1, 1, 1, 1, -1, 2, 2, 2], dtype=torch.int32)
    a, sfa = mode_operand(len(ids), k, "w8a8-mxfp8", seed=5)
    w, sfb = mode_operand(e * n, k, "w8a8-mxfp8", seed=6)
    out = torch.full((len(ids), n), POISON, dtype=torch.bfloat16)
    fp4.group_contiguous_gemm(a, w.reshape(e, n, -1), sfa, sfb, ids, out)
    a_dq, w_dq = dq(ref, a, sfa, "mxfp8"), dq(ref, w, sfb, "mxfp8").reshape(e, n, k)
    for row, expert in enumerate(ids.tolist()):
        if expert < 0:
            assert (out[row] == POISON).all(), f"padding row {row} was written"
        else:
            expected = rows_matmul(a_dq[row : row + 1], w_dq[expert])
            assert_within_bound(out[row : row + 1], expected, a_dq[row : row + 1], w_dq[expert], f"row {row}")


def test_group_masked_gemm_writes_only_the_valid_rows(fp4, ref):
    e, max_m, n, k = 4, 8, 16, 64
    masked_m = torch.tensor([8, 3, 0, 5], dtype=torch.int32)
    a, sfa = mode_operand(e * max_m, k, "w4a4-mxfp4", seed=7)
    w, sfb = mode_operand(e * n, k, "w4a4-mxfp4", seed=8)
    out = torch.full((e * max_m, n), POISON, dtype=torch.bfloat16)
    fp4.group_masked_gemm(a, w.reshape(e, n, -1), sfa, sfb, masked_m, out, max_m_per_expert=max_m, mode="w4a4-mxfp4")
    a_dq, w_dq = dq(ref, a, sfa, "mxfp4"), dq(ref, w, sfb, "mxfp4").reshape(e, n, k)
    for g in range(e):
        rows = slice(g * max_m, g * max_m + int(masked_m[g]))
        expected = rows_matmul(a_dq[rows], w_dq[g])
        assert_within_bound(out[rows], expected, a_dq[rows], w_dq[g], f"expert {g}")
        assert (out[g * max_m + int(masked_m[g]) : (g + 1) * max_m] == POISON).all(), f"expert {g} padding written"


def test_group_masked_gemm_clamps_counts_on_device_data(ref):
    # The op-level reference (what CUDA runs too) clamps counts outside [0, max_m] instead of
    # reading past the expert's rows; the public function rejects them on CPU tensors earlier.
    group, owned = ref.row_groups("masked", 12, 3, torch.tensor([9, -2, 4]), 4, torch.device("cpu"))
    assert owned.tolist() == [True] * 4 + [False] * 4 + [True] * 4
    assert group.tolist() == [0] * 4 + [1] * 4 + [2] * 4


def test_contiguous_grouping_skips_out_of_range_expert_ids(ref):
    group, owned = ref.row_groups("contiguous", 4, 2, torch.tensor([0, 5, -3, 1]), 0, torch.device("cpu"))
    assert owned.tolist() == [True, False, False, True]
    assert group.tolist()[0] == 0 and group.tolist()[3] == 1


# ---- flashrt-style -----------------------------------------------------------------------------


def nvfp4_pair(m: int, n: int, k: int, seed: int):
    a, sfa = nvfp4_operand(m, k, seed)
    b, sfb = nvfp4_operand(n, k, seed + 1)
    return a, b, sfa, sfb


def test_nvfp4_gemm_bias_residual_fp16_rounds_to_fp16(fp4, ref):
    a, b, sfa, sfb = nvfp4_pair(33, 48, 128, seed=9)
    bias, residual = torch.randn(48).half(), torch.randn(33, 48).half()
    out = fp4.nvfp4_gemm_bias_residual_fp16(a, b, sfa, sfb, bias, residual, alpha=0.5)
    assert out.dtype == torch.float16 and out.shape == (33, 48)
    a_dq, b_dq = dq(ref, a, sfa), dq(ref, b, sfb)
    expected = 0.5 * rows_matmul(a_dq, b_dq) + bias.double() + residual.double()
    assert_within_bound(out, expected, a_dq, b_dq, "bias+residual fp16")


def test_nvfp4_gemm_bias_gelu_bf16_is_exact_erf_gelu(fp4, ref):
    a, b, sfa, sfb = nvfp4_pair(17, 32, 64, seed=10)
    bias = torch.randn(32).to(torch.bfloat16)
    out = fp4.nvfp4_gemm_bias_gelu_bf16(a, b, sfa, sfb, bias, alpha=2.0)
    a_dq, b_dq = dq(ref, a, sfa), dq(ref, b, sfb)
    expected = gelu64(2.0 * rows_matmul(a_dq, b_dq) + bias.double())
    # GELU's slope is at most ~1.13: the input bound carries over with that factor
    assert_within_bound(out, expected, a_dq * 1.13, b_dq, "bias+gelu")


def test_nvfp4_gemm_nvfp4_quantizes_the_float32_result(fp4, ref):
    a, b, sfa, sfb = nvfp4_pair(20, 64, 128, seed=11)
    packed, scales = fp4.nvfp4_gemm_nvfp4(a, b, sfa, sfb, alpha=0.25)
    assert packed.shape == (20, 32) and scales.numel() == fp4.sfa_size_bytes(20, 64)
    expected = 0.25 * rows_matmul(dq(ref, a, sfa), dq(ref, b, sfb))
    assert_nvfp4_output_within_bound(ref, packed, scales, expected, "nvfp4 output")
    again = ref.quantize_blocks(expected.float(), ref.NVFP4)
    assert torch.equal(ref.unpack_nibbles(packed), again[0]), "NVFP4 output is the NVFP4 quantizer of the result"


def test_nvfp4_gemm_relu2_nvfp4_squares_the_positive_part(fp4, ref):
    a, b, sfa, sfb = nvfp4_pair(16, 32, 64, seed=12)
    packed, scales = fp4.nvfp4_gemm_relu2_nvfp4(a, b, sfa, sfb)
    expected = torch.relu(rows_matmul(dq(ref, a, sfa), dq(ref, b, sfb))) ** 2
    assert_nvfp4_output_within_bound(ref, packed, scales, expected, "relu2")


def test_nvfp4_gemm_geglu_pairs_gate_and_up_rows(fp4, ref):
    a, b, sfa, sfb = nvfp4_pair(9, 64, 64, seed=13)
    packed, scales = fp4.nvfp4_gemm_geglu_nvfp4_fp16(a, b, sfa, sfb)
    assert packed.shape == (9, 16) and scales.numel() == fp4.sfa_size_bytes(9, 32)
    y = rows_matmul(dq(ref, a, sfa), dq(ref, b, sfb))
    expected = (gelu64(y[:, 0::2]) * y[:, 1::2]).half().double()
    assert_nvfp4_output_within_bound(ref, packed, scales, expected, "geglu")


def test_geglu_skinny_alias_computes_the_same(fp4):
    a, b, sfa, sfb = nvfp4_pair(5, 32, 64, seed=14)
    first = fp4.nvfp4_gemm_geglu_nvfp4_fp16(a, b, sfa, sfb)
    second = fp4.cutlass_fp4_gemm_geglu_il_hw_v10(a, b, sfa, sfb)
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True))


@pytest.mark.parametrize("a_format", [0, 1])
def test_e0m3_weight_gemm_decodes_integer_weights(fp4, ref, a_format):
    x = torch.randn(12, 64).half()
    w = torch.randn(16, 64).half()
    b, sfb = fp4.quantize_e0m3_sfa_fp16(w)
    a, sfa = fp4.quantize_e0m3_sfa_fp16(x) if a_format == 0 else fp4.quantize_fp4_sfa_fp16(x)
    out = fp4.e0m3_weight_gemm_fp16(a, b, sfa, sfb, a_format=a_format)
    a_dq, b_dq = dq(ref, a, sfa, "e0m3" if a_format == 0 else "nvfp4"), dq(ref, b, sfb, "e0m3")
    assert_within_bound(out, rows_matmul(a_dq, b_dq), a_dq, b_dq, f"e0m3 a_format={a_format}")


# function, its schedule arguments -> what the GemmCall it issues says: (schedule, variant, warps, stages)
SCHEDULE_CALLS = [
    ("nvfp4_gemm_bf16", {"variant": 1}, ("auto", 1, 0, 0)),
    ("nvfp4_gemm_fp16", {"variant": 0}, ("auto", 0, 0, 0)),
    ("nvfp4_gemm_variant_bf16", {"variant": 2}, ("auto", 2, 0, 0)),
    ("nvfp4_gemm_streamk_bf16", {}, ("streamk", -1, 0, 0)),
    ("nvfp4_gemm_streamk_bias_bf16", {}, ("streamk", -1, 0, 0)),
    ("fp4_w4a4_gemm_warpsplit_mrows_bf16", {"warps": 2, "stages": 3}, ("auto", -1, 2, 3)),
    ("fp4_w4a4_gemv_warpsplit_interleaved_bf16", {"warps": 2, "stages": 5}, ("auto", -1, 2, 5)),
    ("nvfp4_gemm_m256_bf16", {}, ("m256", -1, 0, 0)),
]


@pytest.mark.parametrize("name, knobs, issued", SCHEDULE_CALLS, ids=[c[0] for c in SCHEDULE_CALLS])
def test_schedule_arguments_reach_the_gemm_call(fp4, name, knobs, issued):
    args, kwargs = make_call(name, "cpu")
    with OpRecorder(fp4.ops.name) as recorder:
        getattr(fp4, name)(*args, **kwargs | knobs)
    recorded = zip(recorder.called, recorder.arguments, strict=True)
    (call,) = [fp4._gemm.GemmCall.from_op_arguments(*a) for n, a in recorded if n == "gemm"]
    assert (call.schedule, call.variant, call.warps, call.stages) == issued, name


def schedule_case(fp4, ref, name: str, knobs: dict, device: str) -> tuple:
    """(the function's output on `device`, its float64 expectation, A and B dequantized): M = 300 (the
    engines, stream-K), the tiers at their own M."""
    m = {"fp4_w4a4_gemm_warpsplit_mrows_bf16": 16, "fp4_w4a4_gemv_warpsplit_interleaved_bf16": 1}.get(name, 300)
    m = 512 if name == "nvfp4_gemm_m256_bf16" else m
    a, b, sfa, sfb = nvfp4_pair(m, 136, 512, seed=15)
    expected = 1.5 * rows_matmul(dq(ref, a, sfa), dq(ref, b, sfb))
    weight = ref.interleave_rows(b) if "interleaved" in name else b
    extra = []
    if "bias" in name:
        bias = torch.randn(136).to(torch.bfloat16)
        expected, extra = expected + bias.double(), [bias]
    if name == "nvfp4_gemm_m256_bf16":
        knobs = knobs | {
            "workspace": torch.zeros(fp4.nvfp4_gemm_m256_workspace_size(a, b, sfa, sfb), dtype=torch.uint8)
        }
    moved = [t.to(device) for t in (a, weight, sfa, sfb, *extra)]
    out = getattr(fp4, name)(
        *moved, alpha=1.5, **{k: v.to(device) if torch.is_tensor(v) else v for k, v in knobs.items()}
    )
    return out.cpu(), expected, dq(ref, a, sfa) * 1.5, dq(ref, b, sfb)


@pytest.mark.parametrize("name, knobs, issued", SCHEDULE_CALLS, ids=[c[0] for c in SCHEDULE_CALLS])
def test_every_schedule_is_within_the_bound_on_the_gpu(fp4, ref, device, name, knobs, issued):
    """The real dispatch: each schedule on the backend that serves it there (stream-K, the tiers)."""
    out, expected, a_dq, b_dq = schedule_case(fp4, ref, name, knobs, device)
    assert_within_bound(out, expected, a_dq, b_dq, name)


def test_interleaved_gemv_equals_the_standard_layout(fp4):
    a, b, sfa, sfb = nvfp4_pair(1, 64, 128, seed=16)
    streamed = fp4.fp4_repack_b_interleaved_sm120(b)
    assert streamed.shape == b.shape and not torch.equal(streamed, b)
    out = fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, streamed, sfa, sfb, warps=2, stages=2)
    assert torch.equal(out, fp4.nvfp4_gemm_bf16(a, b, sfa, sfb))


def test_streaming_layout_places_tiles_as_documented(ref):
    n, k = 16, 128
    b = torch.arange(n * k // 2, dtype=torch.int64).reshape(n, k // 2) % 251
    streamed = ref.interleave_rows(b.to(torch.uint8))
    for row, col_byte in [(0, 0), (3, 5), (9, 40), (15, 63)]:
        tile = (row // 8) * (k // 64) + col_byte // 32
        offset = tile * 256 + (row % 8) * 32 + col_byte % 32
        assert streamed.flatten()[offset] == b[row, col_byte], f"{row=} {col_byte=}"
    assert torch.equal(ref.deinterleave_rows(streamed), b.to(torch.uint8))


def test_m256_workspace_is_one_int32_per_output_tile_in_256_byte_units(fp4):
    for m, n, size in [(512, 32, 256), (512, 129, 256), (8192, 8192, 16384), (640, 4096, 768)]:
        a, b, sfa, sfb = nvfp4_pair(m, n, 64, seed=17)
        assert fp4.nvfp4_gemm_m256_workspace_size(a, b, sfa, sfb) == size, f"{m=} {n=}"


def test_caller_output_buffers_are_written_and_returned(fp4):
    a, b, sfa, sfb = nvfp4_pair(8, 32, 64, seed=18)
    out = torch.full((8, 32), POISON, dtype=torch.bfloat16)
    assert fp4.nvfp4_gemm_bf16(a, b, sfa, sfb, out=out) is out and not (out == POISON).any()
    packed, scales = torch.empty(8, 16, dtype=torch.uint8), torch.empty(512, dtype=torch.uint8)
    got = fp4.nvfp4_gemm_nvfp4(a, b, sfa, sfb, out_packed=packed, out_sfa=scales)
    assert got[0] is packed and got[1] is scales


def test_nan_scale_poisons_exactly_its_row(fp4, ref):
    a, b, sfa, sfb = nvfp4_pair(6, 16, 64, seed=19)
    sfa = sfa.clone()
    sfa[ref.sf_offset(2, 1, 4)] = 0x7F  # NaN scale for row 2, block 1
    out = fp4.nvfp4_gemm_bf16(a, b, sfa, sfb)
    assert out[2].isnan().all()
    assert not out[[0, 1, 3, 4, 5]].isnan().any()
