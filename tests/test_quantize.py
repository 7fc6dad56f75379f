"""group_wise_quant: hand-computed bytes on the CPU, and the CUDA kernel bit for bit against the CPU."""

from __future__ import annotations

import pytest
import torch
from cases import (
    GROUP,
    LARGE_QUANT_SHAPE,
    MODES,
    QUANT_SHAPES,
    enumerate_quant_cases,
    make_adversarial,
    make_random,
)
from checks import assert_bitwise_equal, poisoned_like
from conftest import requires_arch


def quantize_one_block(fp4, values: list[float], mode: str, dtype=torch.bfloat16):
    """Quantize one block (row 0) with plain scales; return (element codes, scale byte)."""
    x = torch.tensor([values], dtype=dtype)
    q, sf = fp4.group_wise_quant(x, mode, use_swizzle=False)
    raw = q.view(torch.uint8)[0]
    codes = raw if mode == "w8a8-mxfp8" else torch.stack([raw & 0xF, raw >> 4], -1).flatten()
    return codes.tolist(), int(sf[0, 0])


# ---- CPU: hand-computed vectors -----------------------------------------------------------------


@pytest.mark.kernels_ci
def test_quantize_mxfp8_scale_at_qmax_power(fp4):
    codes, scale = quantize_one_block(fp4, [448.0] + [1.0] * 31, "w8a8-mxfp8")
    assert scale == 127  # 448 <= 448 * 2^0
    assert codes[0] == 0x7E and codes[1] == 0x38


@pytest.mark.kernels_ci
def test_quantize_mxfp8_scale_one_ulp_above_qmax(fp4):
    codes, scale = quantize_one_block(fp4, [450.0] + [1.0] * 31, "w8a8-mxfp8")  # next bf16 after 448
    assert scale == 128  # s = 1
    assert codes[0] == 0x76 and codes[1] == 0x30  # 225 -> 224, 0.5


@pytest.mark.kernels_ci
def test_quantize_mxfp4_scale_and_e2m1_ties(fp4):
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    codes, scale = quantize_one_block(fp4, [6.0] + ties + [0.0] * 24, "w4a4-mxfp4")
    assert scale == 127
    assert codes[:8] == [7, 0, 2, 2, 4, 4, 6, 6]


@pytest.mark.kernels_ci
def test_quantize_mxfp4_one_ulp_above_qmax_doubles_scale(fp4):
    codes, scale = quantize_one_block(fp4, [6.03125, -1.0] + [0.0] * 30, "w4a4-mxfp4")
    assert scale == 128
    assert codes[:2] == [5, 9]  # 3.015625 -> 3, -0.5


@pytest.mark.kernels_ci
def test_quantize_nvfp4_scale_rounds_and_elements_saturate(fp4):
    # sf = e4m3(7/6) = 1.125 (0x39); 7 / 1.125 = 6.22 saturates to 6; 1 / 1.125 = 0.89 -> 1.0
    codes, scale = quantize_one_block(fp4, [7.0, 1.0] + [0.0] * 14, "w4a4-nvfp4")
    assert scale == 0x39
    assert codes[:3] == [7, 2, 0]


@pytest.mark.kernels_ci
def test_quantize_nvfp4_scale_one_at_amax_six(fp4):
    codes, scale = quantize_one_block(fp4, [6.0, -3.0, 0.25, 0.75] + [0.0] * 12, "w4a4-nvfp4")
    assert scale == 0x38
    assert codes[:4] == [7, 13, 0, 2]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", MODES)
def test_quantize_zero_block_has_zero_scale_and_codes(fp4, mode):
    codes, scale = quantize_one_block(fp4, [0.0] * GROUP[mode], mode)
    assert scale == 0 and set(codes) == {0}


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_quantize_nonfinite_block_has_nan_scale_and_zero_codes(fp4, mode, bad):
    codes, scale = quantize_one_block(fp4, [1.0, bad] + [2.0] * (GROUP[mode] - 2), mode)
    assert scale == (0x7F if mode == "w4a4-nvfp4" else 0xFF)
    assert set(codes) == {0}


@pytest.mark.kernels_ci
def test_quantize_mx_tiny_block_clamps_scale_at_minus_127(fp4):
    codes, scale = quantize_one_block(fp4, [2.0**-130] + [0.0] * 31, "w8a8-mxfp8")
    assert scale == 0
    assert codes[0] == 0x20  # 2^-130 * 2^127 = 0.125


@pytest.mark.kernels_ci
def test_quantize_nvfp4_tiny_block_has_zero_scale_and_codes(fp4):
    codes, scale = quantize_one_block(fp4, [1e-6, -1e-6] + [0.0] * 14, "w4a4-nvfp4")
    assert scale == 0 and set(codes) == {0}


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", MODES)
def test_quantize_swizzled_padding_bytes_are_zero(fp4, ref, mode):
    rows, cols = 130, GROUP[mode] * 5  # 2 row tiles (126 padding rows), 2 K tiles (3 padding columns)
    x = make_random(rows, cols, torch.bfloat16, "cpu", seed=1, spread=0)
    _, sf = fp4.group_wise_quant(x, mode)
    assert tuple(sf.shape) == (256, 8)
    nkb = cols // GROUP[mode]
    used = torch.zeros(sf.numel(), dtype=torch.bool)
    used[ref.sf_offset(torch.arange(rows)[:, None], torch.arange(nkb)[None, :], nkb).flatten()] = True
    assert (sf.flatten()[~used] == 0).all()
    assert (sf.flatten()[used] != 0).all()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", MODES)
def test_quantize_swizzled_and_plain_hold_the_same_scales(fp4, ref, mode):
    x = make_random(300, GROUP[mode] * 9, torch.float16, "cpu", seed=2)
    q_swizzled, swizzled = fp4.group_wise_quant(x, mode, use_swizzle=True)
    q_plain, plain = fp4.group_wise_quant(x, mode, use_swizzle=False)
    assert_bitwise_equal(q_swizzled, q_plain, "values")
    assert_bitwise_equal(ref.unswizzle_scales(swizzled, *plain.shape), plain, "scales")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", MODES)
def test_quantize_round_trip_relative_error_is_bounded(fp4, ref, mode):
    x = make_random(64, 256, torch.bfloat16, "cpu", seed=3, spread=0)
    q, sf = fp4.group_wise_quant(x, mode, use_swizzle=False)
    fmt = ref.MODES[mode]
    y = ref.dequantize_blocks(ref.load_codes(q, fmt), sf, fmt)
    rel = ((y - x.float()).norm() / x.float().norm()).item()
    assert rel < (0.03 if mode == "w8a8-mxfp8" else 0.12), f"{mode=} {rel=}"


# ---- CUDA: bit-exact against the CPU ------------------------------------------------------------


def run_quantize_op(fp4, x: torch.Tensor, mode: str, swizzle: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered op on poisoned outputs, so any byte it fails to write shows."""
    expected_q, expected_sf = fp4.group_wise_quant(x.cpu(), mode, use_swizzle=swizzle)
    q = poisoned_like(expected_q.to(x.device))
    sf = poisoned_like(expected_sf.to(x.device))
    fp4.ops.quantize(x, fp4.reference.MODES[mode].name, swizzle, True, q, sf)
    return q, sf


def assert_quantize_matches_cpu(fp4, x: torch.Tensor, mode: str, swizzle: bool, what: str) -> None:
    expected_q, expected_sf = fp4.group_wise_quant(x.cpu(), mode, use_swizzle=swizzle)
    q, sf = run_quantize_op(fp4, x, mode, swizzle)
    assert_bitwise_equal(q, expected_q, f"{what} values")
    assert_bitwise_equal(sf, expected_sf, f"{what} scales")


@requires_arch()
@pytest.mark.parametrize("mode,dtype,swizzle", list(enumerate_quant_cases()))
def test_quantize_cuda_bit_exact_on_random_inputs(fp4, device, mode, dtype, swizzle):
    for seed, (rows, cols) in enumerate(QUANT_SHAPES):
        cols = max(cols, GROUP[mode])
        x = make_random(rows, cols, dtype, device, seed=seed)
        assert_quantize_matches_cpu(fp4, x, mode, swizzle, f"{mode} {dtype} {swizzle=} m={rows} k={cols}")


@requires_arch()
@pytest.mark.parametrize("mode,dtype,swizzle", list(enumerate_quant_cases()))
def test_quantize_cuda_bit_exact_on_adversarial_blocks(fp4, device, mode, dtype, swizzle):
    x = make_adversarial(mode, dtype, device)
    assert_quantize_matches_cpu(fp4, x, mode, swizzle, f"{mode} {dtype} {swizzle=} adversarial")


@requires_arch()
@pytest.mark.parametrize("mode", MODES)
def test_quantize_cuda_bit_exact_on_large_input(fp4, device, mode):
    rows, cols = LARGE_QUANT_SHAPE
    x = make_random(rows, cols, torch.bfloat16, device, seed=11)
    assert_quantize_matches_cpu(fp4, x, mode, True, f"{mode} m={rows} k={cols}")


@requires_arch()
@pytest.mark.parametrize("mode", MODES)
def test_quantize_cuda_public_function_matches_cpu(fp4, device, mode):
    x = make_random(257, 384, torch.float16, device, seed=5)
    q, sf = fp4.group_wise_quant(x, mode)
    expected_q, expected_sf = fp4.group_wise_quant(x.cpu(), mode)
    assert_bitwise_equal(q, expected_q, f"{mode} values")
    assert_bitwise_equal(sf, expected_sf, f"{mode} scales")


@requires_arch()
@pytest.mark.parametrize("mode", MODES)
def test_quantize_cuda_is_deterministic_and_graph_replayable(fp4, device, mode):
    x = make_random(515, 1024, torch.bfloat16, device, seed=6)
    first = fp4.group_wise_quant(x, mode)
    second = fp4.group_wise_quant(x, mode)
    for a, b in zip(first, second, strict=True):
        assert_bitwise_equal(a, b, f"{mode} run to run")

    static_x = x.clone()
    fp4.group_wise_quant(static_x, mode)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fp4.group_wise_quant(static_x, mode)
    for c in captured:
        c.view(torch.uint8).fill_(0xA5)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, first, strict=True):
        assert_bitwise_equal(a, b, f"{mode} graph replay")
