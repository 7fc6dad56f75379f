"""The flashrt-style quantizers on the CPU: NVFP4 (RTN and least-squares), E0M3, padding, weight
packing, caller buffers and the dequantizer."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.kernels_ci


def test_quantize_fp4_sfa_is_group_wise_nvfp4_with_a_flat_scale_buffer(fp4):
    x = torch.randn(300, 256).to(torch.bfloat16)
    packed, sfa = fp4.quantize_fp4_sfa_bf16(x)
    values, scales = fp4.group_wise_quant(x, "w4a4-nvfp4")
    assert torch.equal(packed, values) and torch.equal(sfa, scales.flatten())
    assert sfa.numel() == fp4.sfa_size_bytes(300, 256)


def test_quantize_fp4_sfa_fp16_and_bf16_agree_on_shared_values(fp4):
    x = torch.randn(64, 128).to(torch.bfloat16)  # bf16 values here are exact in fp16 too
    first, second = fp4.quantize_fp4_sfa_bf16(x), fp4.quantize_fp4_sfa_fp16(x.half())
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_quantize_is_sfb_does_not_change_the_layout(fp4):
    x = torch.randn(130, 64).half()
    a = fp4.quantize_fp4_sfa_fp16(x, is_sfb=False)
    b = fp4.quantize_fp4_sfa_fp16(x, is_sfb=True)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_quantize_writes_and_returns_caller_buffers(fp4):
    x = torch.randn(40, 64).half()
    packed = torch.full((40, 32), 0xA5, dtype=torch.uint8)
    sfa = torch.full((fp4.sfa_size_bytes(40, 64),), 0xA5, dtype=torch.uint8)
    got = fp4.quantize_fp4_sfa_fp16(x, packed, sfa)
    assert got[0] is packed and got[1] is sfa
    assert all(torch.equal(a, b) for a, b in zip(got, fp4.quantize_fp4_sfa_fp16(x), strict=True))


def block_errors(ref, x: torch.Tensor, packed: torch.Tensor, sfa: torch.Tensor) -> torch.Tensor:
    restored = ref.dequantize(packed, sfa, ref.NVFP4)
    return ((restored.double() - x.double()) ** 2).reshape(x.shape[0], -1, 16).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantize_mse_block_error_never_exceeds_rtn(fp4, ref, dtype):
    x = (torch.randn(256, 512) * torch.rand(256, 1) * 4).to(dtype)
    mse = getattr(fp4, f"quantize_fp4_sfa_mse_{'fp16' if dtype == torch.float16 else 'bf16'}")(x)
    rtn = getattr(fp4, f"quantize_fp4_sfa_{'fp16' if dtype == torch.float16 else 'bf16'}")(x)
    e_mse, e_rtn = block_errors(ref, x, *mse), block_errors(ref, x, *rtn)
    assert (e_mse <= e_rtn * (1 + 1e-6) + 1e-30).all()
    assert (e_mse < e_rtn).float().mean() > 0.05, "the search should improve a fair share of blocks"


def test_quantize_mse_picks_scales_within_two_codes_of_rtn(fp4, ref):
    x = torch.randn(128, 256).half()
    mse_scales = ref.unswizzle_scales(fp4.quantize_fp4_sfa_mse_fp16(x)[1], 128, 16).int()
    rtn_scales = ref.unswizzle_scales(fp4.quantize_fp4_sfa_fp16(x)[1], 128, 16).int()
    assert ((mse_scales - rtn_scales).abs() <= 2).all()


def test_quantize_e0m3_hand_computed_block(fp4):
    block = [7.0, 3.5, -2.5, 0.4, -0.2, -7.0, 1.5, 0.5] + [0.0] * 8
    packed, sfa = fp4.quantize_e0m3_sfa_fp16(torch.tensor([block]).half())
    assert int(sfa[0]) == 0x38  # e4m3(7 / 7) = 1.0
    codes = torch.stack([packed[0] & 0xF, packed[0] >> 4], -1).flatten().tolist()
    assert codes[:8] == [7, 4, 10, 0, 0, 15, 2, 0]  # ties to even; -0.2 -> 0, never -0


def test_quantize_padded_equals_quantizing_a_zero_padded_copy(fp4):
    x = torch.randn(40, 100).to(torch.bfloat16)
    packed, sfa, logical = fp4.quantize_fp4_sfa_padded_bf16(x)
    padded = torch.zeros(40, 128, dtype=torch.bfloat16)
    padded[:, :100] = x
    assert logical == 100
    assert all(torch.equal(a, b) for a, b in zip((packed, sfa), fp4.quantize_fp4_sfa_bf16(padded), strict=True))


@pytest.mark.parametrize("mse", [False, True])
def test_pack_nvfp4_weight_pads_rows_columns_and_bias(fp4, mse):
    w, bias = torch.randn(50, 100).to(torch.bfloat16), torch.randn(50).to(torch.bfloat16)
    packed, sfb, padded_bias, logical = fp4.pack_nvfp4_weight_bf16(w, bias, alignment=32, mse=mse)
    assert logical == (50, 100) and packed.shape == (64, 64) and sfb.numel() == fp4.sfa_size_bytes(64, 128)
    assert torch.equal(padded_bias[:50], bias) and (padded_bias[50:] == 0).all()
    padded = torch.zeros(64, 128, dtype=torch.bfloat16)
    padded[:50, :100] = w
    quantize = fp4.quantize_fp4_sfa_mse_bf16 if mse else fp4.quantize_fp4_sfa_bf16
    assert all(torch.equal(a, b) for a, b in zip((packed, sfb), quantize(padded), strict=True))


def test_pack_nvfp4_weight_without_bias_returns_none(fp4):
    assert fp4.pack_nvfp4_weight_bf16(torch.randn(32, 32).to(torch.bfloat16))[2] is None


def test_dequantize_fp4_sfa_is_exact(fp4, ref):
    x = torch.randn(70, 96).half()
    packed, sfa = fp4.quantize_fp4_sfa_fp16(x)
    out = fp4.dequantize_fp4_sfa_fp16(packed, sfa)
    assert out.dtype == torch.float16 and out.shape == (70, 96)
    assert torch.equal(out.float(), ref.dequantize(packed, sfa, ref.NVFP4))
    assert ((out.float() - x.float()).norm() / x.float().norm()) < 0.12


@pytest.mark.parametrize(
    "rows,dim,expected", [(1, 16, 512), (128, 64, 512), (129, 64, 1024), (300, 5120, 3 * 80 * 512)]
)
def test_sfa_size_bytes_counts_whole_tiles(fp4, rows, dim, expected):
    assert fp4.sfa_size_bytes(rows, dim) == expected
