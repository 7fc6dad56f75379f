"""Element codecs, scale rules and the scale layout of reference.py against hand-computed values."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.kernels_ci


def test_e2m1_rounds_ties_to_even_code(ref):
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert ref.decode_e2m1(ref.encode_e2m1(x)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_e2m1_rounds_to_nearest_off_ties(ref):
    x = torch.tensor([0.26, 0.74, 1.3, 2.6, 3.4, 4.9, 5.1])
    assert ref.decode_e2m1(ref.encode_e2m1(x)).tolist() == [0.5, 0.5, 1.5, 3.0, 3.0, 4.0, 6.0]


def test_e2m1_saturates_and_keeps_sign(ref):
    x = torch.tensor([6.5, 1e30, -7.0, -0.1, -0.0, 0.0])
    assert ref.encode_e2m1(x).tolist() == [7, 7, 15, 8, 8, 0]


def test_e2m1_decode_covers_every_code(ref):
    codes = torch.arange(16, dtype=torch.uint8)
    expected = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert ref.decode_e2m1(codes).tolist() == expected


def test_e4m3_matches_hand_values(ref):
    # 17 and 19 are ties (between 16|18 and 18|20): the even codes 0x58 (16) and 0x5A (20) win.
    x = torch.tensor([448.0, 464.0, 1e9, 17.0, 19.0, 2.0**-9, 2.0**-10, 1.5 * 2.0**-10, -1e-9, 1.0])
    assert ref.encode_e4m3(x).tolist() == [0x7E, 0x7E, 0x7E, 0x58, 0x5A, 0x01, 0x00, 0x01, 0x80, 0x38]


def test_e4m3_nan_is_0x7f_and_decodes_to_nan(ref):
    assert ref.encode_e4m3(torch.tensor([float("nan")])).tolist() == [0x7F]
    assert ref.decode_e4m3(torch.tensor([0x7F, 0xFF], dtype=torch.uint8)).isnan().all()


def test_e4m3_round_trips_every_finite_code(ref):
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    assert torch.equal(ref.encode_e4m3(ref.decode_e4m3(codes)), codes)
    torch_values = codes.view(torch.float8_e4m3fn).float()
    assert torch.equal(ref.decode_e4m3(codes), torch_values)


def test_ue8m0_decodes_powers_of_two(ref):
    codes = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    values = ref.decode_ue8m0(codes)
    assert values[:6].tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    assert values[6].isnan()


@pytest.mark.parametrize("qmax", [448.0, 6.0])
def test_mx_scale_exponent_is_smallest_non_clipping_power(ref, qmax):
    for k in (-100, -3, 0, 5, 60):
        edge = torch.tensor([qmax * 2.0**k])
        above = torch.nextafter(edge, torch.tensor([float("inf")]))
        assert ref.mx_scale_exponent(edge, qmax).item() == k, f"{qmax=} {k=}"
        assert ref.mx_scale_exponent(above, qmax).item() == k + 1, f"{qmax=} {k=}"


def test_mx_scale_exponent_clamps_at_minus_127(ref):
    amax = torch.tensor([0.0, 2.0**-140, 1e-45])
    assert ref.mx_scale_exponent(amax, 448.0).tolist() == [-127, -127, -127]


def test_nibbles_pack_even_element_low(ref):
    codes = torch.tensor([[1, 2, 3, 15]], dtype=torch.uint8)
    packed = ref.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0xF3]]
    assert torch.equal(ref.unpack_nibbles(packed), codes)


def brute_force_swizzle(plain: torch.Tensor) -> torch.Tensor:
    """SfAtom built tile by tile: tile (rt, kt) holds rows rt*128.. and columns kt*4..; inside it,
    row r lives at (r % 32) * 16 + (r // 32) * 4 and column c at + c."""
    rows, nkb = plain.shape
    row_tiles, k_tiles = -(-rows // 128), -(-nkb // 4)
    padded = torch.zeros(row_tiles * 128, k_tiles * 4, dtype=torch.uint8)
    padded[:rows, :nkb] = plain
    out = []
    for rt in range(row_tiles):
        for kt in range(k_tiles):
            tile = torch.zeros(512, dtype=torch.uint8)
            for r in range(128):
                for c in range(4):
                    tile[(r % 32) * 16 + (r // 32) * 4 + c] = padded[rt * 128 + r, kt * 4 + c]
            out.append(tile)
    return torch.cat(out)


@pytest.mark.parametrize("rows,nkb", [(1, 1), (128, 4), (130, 5), (300, 9)])
def test_sf_offset_matches_brute_force_tiles(ref, rows, nkb):
    plain = torch.randint(1, 255, (rows, nkb), dtype=torch.uint8)
    swizzled = ref.swizzle_scales(plain)
    assert swizzled.numel() == ref.sf_bytes(rows, nkb)
    assert torch.equal(swizzled, brute_force_swizzle(plain)), f"{rows=} {nkb=}"
    assert torch.equal(ref.unswizzle_scales(swizzled, rows, nkb), plain)
