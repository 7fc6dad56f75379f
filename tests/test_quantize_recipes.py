"""The quantize op's nvfp4_mse and e0m3 recipes and the dequantize op: the CUDA kernels against the
CPU ops (the reference) on the same inputs, on poisoned outputs so any byte a kernel fails to write
shows. Quantized bytes are compared bit for bit. Dequantized outputs are compared bit for bit except
NaN payloads, which IEEE leaves open: the GPU writes its canonical NaN (0x7FFF...), torch's CPU
conversions write 0x7FC00000 / 0x7E00 / 0xFFFF (bf16); there both sides must be NaN."""

from __future__ import annotations

import pytest
import torch
from cases import HALF_DTYPES, make_adversarial, make_random
from checks import assert_bitwise_equal, poisoned_like
from conftest import requires_arch

QUANT_RECIPES = ("nvfp4_mse", "e0m3")
DEQUANT_RECIPES = ("mxfp8", "mxfp4", "nvfp4", "e0m3")
GROUP = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16, "nvfp4_mse": 16, "e0m3": 16}
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Rows around the 128-row scale tile; columns give odd and even numbers of 16-blocks (the
# dequantize kernel takes 32 elements per thread, so an odd count leaves a one-block tail).
SHAPES = ((1, 16), (7, 48), (127, 96), (129, 160), (257, 208), (300, 512), (1000, 2048))
# E0M3 at sf = 1 (amax 7): ties go to the even integer; -0.5 and -0.4 round to 0, which has no sign.
E0M3_TIES_BLOCK = [7.0, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, -0.5, -1.5, -2.5, -6.5, 0.4, -0.4, -7.0, 5.0]
# (in_rows, in_cols, out_rows, out_cols): the op's values tensor taller and wider than the input.
PADDED_SHAPES = ((1, 16, 129, 32), (100, 64, 137, 112), (128, 160, 200, 256), (300, 48, 301, 64))


def fit_cols(cols: int, recipe: str) -> int:
    """cols rounded up to a multiple of the recipe's block size."""
    g = GROUP[recipe]
    return -(-cols // g) * g


def scale_shape(rows: int, cols: int, recipe: str, swizzle: bool) -> tuple[int, int]:
    """Shape of the scale tensor group_wise_quant returns: the 2-D swizzled view or plain [rows, nkb]."""
    nkb = cols // GROUP[recipe]
    if not swizzle:
        return rows, nkb
    return -(-rows // 128) * 128, -(-nkb // 4) * 4


def value_tensor(rows: int, cols: int, recipe: str, device: str) -> torch.Tensor:
    if recipe == "mxfp8":
        return torch.zeros(rows, cols, dtype=torch.float8_e4m3fn, device=device)
    return torch.zeros(rows, cols // 2, dtype=torch.uint8, device=device)


def unpack_codes(values: torch.Tensor) -> torch.Tensor:
    v = values.cpu()
    return torch.stack([v & 0xF, v >> 4], dim=-1).flatten(-2)


# ---- quantize: nvfp4_mse and e0m3 ---------------------------------------------------------------


def quantize_both(fp4, x: torch.Tensor, recipe: str, swizzle: bool, out_rows: int, out_cols: int):
    """(CUDA values, CUDA scales, CPU values, CPU scales) of the quantize op into [out_rows, out_cols]."""
    expected_q = value_tensor(out_rows, out_cols, recipe, "cpu")
    expected_sf = torch.zeros(scale_shape(out_rows, out_cols, recipe, swizzle), dtype=torch.uint8)
    fp4.ops.quantize(x.cpu(), recipe, swizzle, True, expected_q, expected_sf)
    q = poisoned_like(expected_q.to(x.device))
    sf = poisoned_like(expected_sf.to(x.device))
    fp4.ops.quantize(x, recipe, swizzle, True, q, sf)
    return q, sf, expected_q, expected_sf


def assert_quantize_matches_cpu(fp4, x: torch.Tensor, recipe: str, swizzle: bool, what: str, out_shape=None) -> None:
    out_rows, out_cols = out_shape or x.shape
    q, sf, expected_q, expected_sf = quantize_both(fp4, x, recipe, swizzle, out_rows, out_cols)
    assert_bitwise_equal(q, expected_q, f"{what} values")
    assert_bitwise_equal(sf, expected_sf, f"{what} scales")


def recipe_hazard_blocks(dtype: torch.dtype) -> list[list[float]]:
    """16-element blocks aimed at the two recipes: E0M3 rounding ties, saturation and amax/7 edges;
    NVFP4-MSE scale codes at both ends of 1..126 (candidates skipped) and E2M1-grid blocks, whose
    candidates often tie at zero error."""
    blocks = [
        E0M3_TIES_BLOCK,
        [7.5] + [1.0] * 15,  # E0M3: sf = 1, 7.5 rounds to 8 and saturates at 7
        [6.0 * 2.0**-9] + [2.0**-10] * 15,  # NVFP4 RTN code 1: c-1 and c-2 are skipped
        [12.0 * 2.0**-9] + [-(2.0**-9)] * 15,  # RTN code 2: c-2 is skipped
        [2688.0] + [400.0] * 15,  # RTN code 126 (448): c+1 and c+2 are skipped
        [2496.0, -2300.0] + [100.0] * 14,  # RTN code 125 (416): c+2 is skipped
        [2.5] + [1.0] * 15,  # MSE picks c+2 (see the hand-computed test)
    ]
    for k in (-8, -1, 0, 3, 6):
        edge = 7.0 * 2.0**k
        above = float(torch.nextafter(torch.tensor(edge, dtype=dtype), torch.tensor(float("inf"), dtype=dtype)))
        blocks.append([edge, -edge / 3, edge / 5] * 5 + [0.0])
        blocks.append([above, 0.5 * edge, -0.25 * edge] * 5 + [-0.0])
    g = torch.Generator(device="cpu").manual_seed(7)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    for code in (1, 9, 40, 56, 57, 100, 125, 126):
        sf = float(torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        for _ in range(3):
            picks = grid[torch.randint(0, 8, (16,), generator=g)]
            signs = torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0)
            blocks.append((picks * signs * sf).tolist())
    return blocks


def make_recipe_adversarial(dtype: torch.dtype, device: str) -> torch.Tensor:
    """The NVFP4 adversarial blocks of cases.py (g = 16) followed by recipe_hazard_blocks, 4 to a row."""
    common = make_adversarial("w4a4-nvfp4", dtype, "cpu")
    extra = recipe_hazard_blocks(dtype)
    extra += [[0.0] * 16] * (-len(extra) % 4)
    extra = torch.tensor(extra, dtype=torch.float64).reshape(-1, 64).to(dtype)
    return torch.cat([common, extra]).to(device)


@requires_arch()
@pytest.mark.parametrize("swizzle", (True, False), ids=("swizzled", "plain"))
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("recipe", QUANT_RECIPES)
def test_quantize_recipe_bit_exact_on_random_inputs(fp4, device, recipe, dtype, swizzle):
    for seed, (rows, cols) in enumerate(SHAPES):
        x = make_random(rows, cols, dtype, device, seed=seed)
        assert_quantize_matches_cpu(fp4, x, recipe, swizzle, f"{recipe} {dtype} {swizzle=} m={rows} k={cols}")


@requires_arch()
@pytest.mark.parametrize("swizzle", (True, False), ids=("swizzled", "plain"))
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("recipe", QUANT_RECIPES)
def test_quantize_recipe_bit_exact_on_adversarial_blocks(fp4, device, recipe, dtype, swizzle):
    x = make_recipe_adversarial(dtype, device)
    rows, cols = x.shape
    assert_quantize_matches_cpu(fp4, x, recipe, swizzle, f"{recipe} {dtype} {swizzle=} adversarial m={rows} k={cols}")


@requires_arch()
@pytest.mark.parametrize("swizzle", (True, False), ids=("swizzled", "plain"))
@pytest.mark.parametrize("recipe", QUANT_RECIPES)
def test_quantize_recipe_bit_exact_on_padded_outputs(fp4, device, recipe, swizzle):
    for seed, (in_rows, in_cols, out_rows, out_cols) in enumerate(PADDED_SHAPES):
        x = make_random(in_rows, in_cols, torch.bfloat16, device, seed=20 + seed)
        what = f"{recipe} {swizzle=} input {in_rows}x{in_cols} output {out_rows}x{out_cols}"
        assert_quantize_matches_cpu(fp4, x, recipe, swizzle, what, out_shape=(out_rows, out_cols))


@requires_arch()
@pytest.mark.parametrize("recipe", QUANT_RECIPES)
def test_quantize_recipe_bit_exact_on_large_input(fp4, device, recipe):
    rows, cols = 2048, 7168
    x = make_random(rows, cols, torch.bfloat16, device, seed=11)
    assert_quantize_matches_cpu(fp4, x, recipe, True, f"{recipe} m={rows} k={cols}")


@requires_arch()
def test_quantize_e0m3_hand_computed_block(fp4, device):
    # sf = e4m3(7 / 7) = 1.0 (0x38), f = 1; 0.4 is 0.400390625 in bf16.
    x = torch.tensor([E0M3_TIES_BLOCK], dtype=torch.bfloat16, device=device)
    q, sf, _, _ = quantize_both(fp4, x, "e0m3", False, 1, 16)
    assert int(sf[0, 0]) == 0x38
    assert unpack_codes(q)[0].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 0, 10, 10, 14, 0, 0, 15, 5]


@requires_arch()
def test_quantize_nvfp4_mse_hand_computed_block(fp4, device):
    # RTN: sf = e4m3(2.5 / 6) = 0.40625 (0x2D): 2.5 -> 6 * sf, 1 -> 2 * sf, error 1/256 + 15 * 9/256.
    # Candidates 0x2C (0.375) 0.296875, 0x2E (0.4375) 0.25, 0x2B (0.34375) 0.206..., 0x2F (0.46875):
    # 2.5 -> 6 * sf, 1 -> 2 * sf, error 25/256 + 15/256 = 0.15625, the least.
    x = torch.tensor([[2.5] + [1.0] * 15], dtype=torch.float16, device=device)
    q, sf, _, _ = quantize_both(fp4, x, "nvfp4_mse", False, 1, 16)
    assert int(sf[0, 0]) == 0x2F
    assert unpack_codes(q)[0].tolist() == [7] + [4] * 15


@requires_arch()
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_quantize_nvfp4_mse_error_never_exceeds_rtn(fp4, device, dtype):
    rows, cols = 300, 512
    x = make_random(rows, cols, dtype, device, seed=31)
    errors = {}
    for recipe in ("nvfp4", "nvfp4_mse"):
        q, sf, _, _ = quantize_both(fp4, x, recipe, False, rows, cols)
        restored = torch.empty(rows, cols, dtype=torch.float32)
        fp4.ops.dequantize(q.cpu(), sf.cpu(), "nvfp4", False, restored)
        d = (x.cpu().float() - restored).reshape(rows, cols // 16, 16)
        error = torch.zeros(rows, cols // 16)
        for i in range(16):  # one float32 rounding per product and per add, in element order
            error = error + d[..., i] * d[..., i]
        errors[recipe] = error
    worse = (errors["nvfp4_mse"] > errors["nvfp4"]).nonzero()
    assert len(worse) == 0, f"{dtype} m={rows} k={cols}: {len(worse)} blocks worse than RTN, first {worse[0].tolist()}"
    assert (errors["nvfp4_mse"] < errors["nvfp4"]).any(), f"{dtype} m={rows} k={cols}: no block improved"


@requires_arch()
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_quantize_e0m3_never_writes_negative_zero(fp4, device, dtype):
    x = torch.cat([make_recipe_adversarial(dtype, device), make_random(64, 64, dtype, device, seed=32)])
    q, _, _, _ = quantize_both(fp4, x, "e0m3", True, *x.shape)
    codes = unpack_codes(q)
    assert (codes != 8).all(), f"{dtype} m={x.shape[0]} k={x.shape[1]}: code 8 at {(codes == 8).nonzero()[0].tolist()}"


# ---- dequantize ---------------------------------------------------------------------------------


def assert_equal_or_both_nan(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bitwise equality, except that where expected is NaN actual must be NaN (any payload)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.cpu(), expected.cpu()
    nan = e.isnan()
    nan_mismatch = (a.isnan() != nan).nonzero()
    assert len(nan_mismatch) == 0, (
        f"{what}: NaN where the CPU has none or vice versa, first at {nan_mismatch[0].tolist()}"
    )
    assert_bitwise_equal(torch.where(nan, 0, a), torch.where(nan, 0, e), what)


def random_stored(rows: int, cols: int, recipe: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random value bytes (every code, E4M3 NaN codes included) and plain scale bytes: UE8M0 mostly
    near 2^0 with some extremes and NaN (0xFF); UE4M3 anywhere in 0..0x7F (0x7F is NaN)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    values = value_tensor(rows, cols, recipe, "cpu")
    values.view(torch.uint8).copy_(torch.randint(0, 256, values.shape, generator=g, dtype=torch.uint8))
    nkb = cols // GROUP[recipe]
    if recipe.startswith("mx"):
        near = torch.randint(107, 148, (rows, nkb), generator=g)
        anywhere = torch.randint(0, 256, (rows, nkb), generator=g)
        scales = torch.where(torch.rand(rows, nkb, generator=g) < 0.8, near, anywhere)
    else:
        scales = torch.randint(0, 0x80, (rows, nkb), generator=g)
    return values, scales.to(torch.uint8)


def stored_scales(fp4, plain: torch.Tensor, swizzle: bool) -> torch.Tensor:
    """Plain [rows, nkb] scale bytes in the layout the op reads (swizzled: the 2-D halops view)."""
    if not swizzle:
        return plain.clone()
    rows, nkb = plain.shape
    out = torch.zeros(-(-rows // 128) * 128, -(-nkb // 4) * 4, dtype=torch.uint8)
    m = torch.arange(rows)[:, None]
    kb = torch.arange(nkb)[None, :]
    out.view(-1)[fp4.reference.sf_offset(m, kb, nkb)] = plain
    return out


def dequantize_both(
    fp4, values: torch.Tensor, scales: torch.Tensor, recipe: str, swizzle: bool, dtype, device, offset: int = 0
):
    """(CUDA output, CPU output) of the dequantize op, the CUDA output on a poisoned buffer. With
    `offset` > 0 the CUDA values and output start that many elements past an allocation (16-byte
    aligned), off the kernel's vector paths."""
    rows = values.shape[0]
    cols = values.shape[1] * (1 if recipe == "mxfp8" else 2)
    expected = torch.zeros(rows, cols, dtype=dtype)
    fp4.ops.dequantize(values, scales, recipe, swizzle, expected)
    values_storage = torch.zeros(values.numel() + offset, dtype=values.dtype, device=device)
    device_values = values_storage[offset:].view(values.shape)
    device_values.copy_(values.to(device))
    out_storage = poisoned_like(torch.empty(rows * cols + offset, dtype=dtype, device=device))
    out = out_storage[offset:].view(rows, cols)
    fp4.ops.dequantize(device_values, scales.to(device), recipe, swizzle, out)
    assert_bitwise_equal(out_storage[:offset], poisoned_like(out_storage[:offset]), "bytes before the output")
    return out, expected


@requires_arch()
@pytest.mark.parametrize("swizzle", (True, False), ids=("swizzled", "plain"))
@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("recipe", DEQUANT_RECIPES)
def test_dequantize_bit_exact_on_random_codes(fp4, device, recipe, dtype, swizzle):
    for seed, (rows, cols) in enumerate(SHAPES):
        cols = fit_cols(cols, recipe)
        values, plain = random_stored(rows, cols, recipe, seed)
        out, expected = dequantize_both(fp4, values, stored_scales(fp4, plain, swizzle), recipe, swizzle, dtype, device)
        assert_equal_or_both_nan(out, expected, f"{recipe} {dtype} {swizzle=} m={rows} k={cols}")


@requires_arch()
@pytest.mark.parametrize("swizzle", (True, False), ids=("swizzled", "plain"))
@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("recipe", DEQUANT_RECIPES)
def test_dequantize_bit_exact_on_quantized_data(fp4, device, recipe, dtype, swizzle):
    x = torch.cat(
        [make_recipe_adversarial(torch.bfloat16, "cpu"), make_random(300, 64, torch.bfloat16, "cpu", seed=41)]
    )
    rows, cols = x.shape
    values = value_tensor(rows, cols, recipe, "cpu")
    scales = torch.zeros(scale_shape(rows, cols, recipe, swizzle), dtype=torch.uint8)
    fp4.ops.quantize(x, recipe, swizzle, False, values, scales)
    out, expected = dequantize_both(fp4, values, scales, recipe, swizzle, dtype, device)
    assert_equal_or_both_nan(out, expected, f"{recipe} {dtype} {swizzle=} quantized m={rows} k={cols}")


@requires_arch()
@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("recipe", DEQUANT_RECIPES)
def test_dequantize_nan_scale_gives_nan_block(fp4, device, recipe, dtype):
    rows, cols = 130, fit_cols(80, recipe)
    g = GROUP[recipe]
    values, plain = random_stored(rows, cols, recipe, seed=51)
    if recipe == "mxfp8":  # no NaN element codes, so only the scale makes a block NaN
        codes = values.view(torch.uint8)
        codes.copy_(torch.where((codes & 0x7F) == 0x7F, codes & 0xF0, codes))
    nan_scale = 0xFF if recipe.startswith("mx") else 0x7F
    plain[plain == nan_scale] = 1
    nan_blocks = [(0, 0), (5, cols // g - 1), (129, 1)]
    for r, kb in nan_blocks:
        plain[r, kb] = nan_scale
    out, expected = dequantize_both(fp4, values, stored_scales(fp4, plain, True), recipe, True, dtype, device)
    what = f"{recipe} {dtype} m={rows} k={cols}"
    assert_equal_or_both_nan(out, expected, what)
    is_nan = out.isnan().cpu().reshape(rows, cols // g, g)
    for r, kb in nan_blocks:
        assert is_nan[r, kb].all(), f"{what}: block ({r}, {kb}) has a NaN scale but finite outputs"
    assert is_nan.sum() == len(nan_blocks) * g, f"{what}: NaN outside the NaN-scale blocks"


@requires_arch()
@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("recipe", DEQUANT_RECIPES)
def test_dequantize_bit_exact_on_unaligned_buffers(fp4, device, recipe, dtype):
    rows, cols = 67, fit_cols(208, recipe)
    values, plain = random_stored(rows, cols, recipe, seed=61)
    out, expected = dequantize_both(fp4, values, plain, recipe, False, dtype, device, offset=1)
    assert_equal_or_both_nan(out, expected, f"{recipe} {dtype} unaligned m={rows} k={cols}")


@requires_arch()
@pytest.mark.parametrize("recipe", DEQUANT_RECIPES)
def test_dequantize_empty_matrix_is_a_no_op(fp4, device, recipe):
    g = GROUP[recipe]
    values = value_tensor(0, g, recipe, device)
    out = torch.empty(0, g, dtype=torch.bfloat16, device=device)
    fp4.ops.dequantize(values, torch.empty(0, 1, dtype=torch.uint8, device=device), recipe, False, out)
    torch.cuda.synchronize()
