"""fused_swiglu_quant and prefill_permute_to_masked_gemm: semantics on hand-made routings."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.kernels_ci


def test_swiglu_float32_is_within_a_few_ulp_of_float64(ref):
    gate, up = torch.randn(4096) * 8, torch.randn(4096)
    exact = up.double() * torch.nn.functional.silu(gate.double())
    got = ref.swiglu_float32(gate, up).double()
    assert ((got - exact).abs() <= 4e-7 * exact.abs() + 1e-38).all()


def test_exp_float32_keeps_nan_and_saturates_at_the_clamp(ref):
    got = ref.exp_float32(torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0]))
    assert got[0].isnan() and got[1] > 1e38 and 0 < got[2] < 1e-37 and got[3] == 1.0


@pytest.mark.parametrize("is_fp4", [False, True])
def test_fused_swiglu_quant_quantizes_owned_rows_and_zeroes_the_rest(fp4, ref, is_fp4):
    e, m, hidden = 3, 40, 128
    x = torch.randn(e * m, 2 * hidden).to(torch.bfloat16)
    counts = torch.tensor([40, 13, 0], dtype=torch.int32)
    values, scales = fp4.fused_swiglu_quant(x, counts, is_fp4=is_fp4)
    fmt = ref.NVFP4 if is_fp4 else ref.MXFP8
    assert values.dtype == (torch.uint8 if is_fp4 else torch.float8_e4m3fn)
    assert tuple(scales.shape) == ref.swizzled_scale_shape(e * m, hidden // fmt.group)
    y = ref.swiglu_float32(x[:, :hidden], x[:, hidden:])
    expected_values, expected_scales = ref.quantize(y, fmt, swizzle=True)
    plain = ref.unswizzle_scales(scales, e * m, hidden // fmt.group)
    expected_plain = ref.unswizzle_scales(expected_scales, e * m, hidden // fmt.group)
    for g, count in enumerate(counts.tolist()):
        owned = slice(g * m, g * m + count)
        rest = slice(g * m + count, (g + 1) * m)
        assert torch.equal(values.view(torch.uint8)[owned], expected_values.view(torch.uint8)[owned]), f"expert {g}"
        assert torch.equal(plain[owned], expected_plain[owned]), f"expert {g} scales"
        assert (values.view(torch.uint8)[rest] == 0).all() and (plain[rest] == 0).all(), f"expert {g} rest"


def routing_case():
    ids = torch.tensor([[0, 1], [1, -1], [0, 0], [5, 1]], dtype=torch.int64)
    x = torch.arange(4 * 512, dtype=torch.float32).reshape(4, 512).to(torch.bfloat16)
    scale_bytes = torch.tensor(
        [[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33], [40, 41, 42, 43]], dtype=torch.uint8
    )
    scale = scale_bytes.view(torch.int32)  # [4, 1]: byte j scales 128-element group j
    return x, scale, ids, scale_bytes


def test_permute_keeps_token_then_slot_order_per_expert(fp4):
    x, scale, ids, _ = routing_case()
    permuted, _, index_map, counts = fp4.prefill_permute_to_masked_gemm(x, scale, ids, 2, 128)
    assert index_map.tolist() == [[0, 0], [1, -1], [1, 2], [-1, 2]]
    assert counts.tolist() == [[3], [3]]
    expected_rows = {0: 0, 1: 2, 2: 2, 128: 0, 129: 1, 130: 3}
    for row, token in expected_rows.items():
        assert torch.equal(permuted[row], x[token]), f"{row=}"
    untouched = torch.ones(256, dtype=torch.bool)
    untouched[list(expected_rows)] = False
    assert (permuted[untouched] == 0).all()


def test_permute_broadcasts_int32_scales_to_each_32_element_block(fp4, ref):
    x, scale, ids, scale_bytes = routing_case()
    _, out_scale, _, _ = fp4.prefill_permute_to_masked_gemm(x, scale, ids, 2, 128)
    assert tuple(out_scale.shape) == (2, 128, 16)
    plain = ref.unswizzle_scales(out_scale, 256, 16)
    assert plain[129].tolist() == scale_bytes[1].repeat_interleave(4).tolist()  # token 1 -> expert 1, row 1
    assert plain[2].tolist() == scale_bytes[2].repeat_interleave(4).tolist()  # token 2 -> expert 0, row 2
    assert (plain[3:128] == 0).all()


def test_permute_copies_uint8_scales_directly(fp4, ref):
    x, _, ids, _ = routing_case()
    direct = torch.arange(4 * 16, dtype=torch.uint8).reshape(4, 16) + 100
    _, out_scale, _, _ = fp4.prefill_permute_to_masked_gemm(x.to(torch.float8_e4m3fn), direct, ids, 2, 128)
    plain = ref.unswizzle_scales(out_scale, 256, 16)
    assert torch.equal(plain[130], direct[3])


def test_permute_overflow_is_counted_and_never_written(fp4):
    tokens = 130
    x = torch.randn(tokens, 512).to(torch.bfloat16)
    ids = torch.zeros(tokens, 1, dtype=torch.int64)
    scale = torch.zeros(tokens, 1, dtype=torch.int32)
    permuted, _, index_map, counts = fp4.prefill_permute_to_masked_gemm(x, scale, ids, 1, 128)
    assert counts.tolist() == [[130]]
    assert index_map[:128, 0].tolist() == list(range(128)) and index_map[128:, 0].tolist() == [-1, -1]
    assert permuted.shape == (128, 512) and torch.equal(permuted, x[:128])


def test_permute_position_helper_orders_by_token_then_slot(ref):
    ids = torch.tensor([[1, 0], [0, 1], [1, 1]])
    position, counts = ref.routing_positions(ids, 2)
    assert position.tolist() == [[0, 0], [1, 1], [2, 3]]
    assert counts.tolist() == [2, 4]
