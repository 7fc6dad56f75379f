"""The numeric contract of fp4-gemm in plain PyTorch (docs/FORMATS.md).

This module is the CPU implementation of every op and the oracle of every test. It imports only
torch and works without the compiled extension. It is written for clarity, not speed: vectorized
torch over whole tensors, no Python loops over elements, IEEE float32 where the contract says
float32.

Layout of the module: element codecs (E2M1, E4M3, E0M3, UE8M0, UE4M3), nibble packing, the block
formats (`BlockFormat`), the scale layouts (`sf_offset`), the quantizers, and the public functions
of the API with the same names and signatures as the package's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "BlockFormat",
    "MXFP8",
    "MXFP4",
    "NVFP4",
    "MODES",
    "encode_e2m1",
    "decode_e2m1",
    "encode_e4m3",
    "decode_e4m3",
    "decode_ue8m0",
    "pack_nibbles",
    "unpack_nibbles",
    "sf_offset",
    "sf_bytes",
    "swizzle_scales",
    "unswizzle_scales",
    "quantize_blocks",
    "dequantize_blocks",
    "group_wise_quant",
]

# ---- element codecs ---------------------------------------------------------------------------

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e4m3_magnitudes() -> torch.Tensor:
    """Value of E4M3 codes 0..126 (0x7F is NaN): subnormals m * 2^-9, normals (8 + m) * 2^(e - 10)."""
    codes = torch.arange(127)
    exponent, mantissa = codes >> 3, codes & 7
    subnormal = mantissa.double() * 2.0**-9
    normal = (8 + mantissa).double() * torch.pow(2.0, (exponent - 10).double())
    return torch.where(exponent == 0, subnormal, normal).float()


_GRIDS = {
    "e2m1": torch.tensor(E2M1_VALUES),
    "e4m3": _e4m3_magnitudes(),
    "e0m3": torch.arange(8, dtype=torch.float32),
}


def _grid(name: str, device: torch.device) -> torch.Tensor:
    return _GRIDS[name].to(device)


def round_to_grid(magnitude: torch.Tensor, grid: str) -> torch.Tensor:
    """Code (int64) of the grid value nearest to each non-negative float32 magnitude.

    Ties go to the even code; magnitudes beyond the largest value saturate to it.
    """
    values = _grid(grid, magnitude.device)
    midpoints = (values[:-1] + values[1:]) / 2  # exact in float32
    below = torch.searchsorted(midpoints, magnitude, right=False)  # midpoints < magnitude
    at_or_below = torch.searchsorted(midpoints, magnitude, right=True)  # midpoints <= magnitude
    tie = below != at_or_below
    return torch.where(tie & (below % 2 == 1), at_or_below, below)


def _sign_bit(x: torch.Tensor) -> torch.Tensor:
    """True where the sign bit is set (-0.0 included), as the hardware conversions see it."""
    return torch.signbit(x)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """E2M1 code (uint8, 0..15) of float32 values: round to nearest even, saturate to +-6, sign kept."""
    magnitude = round_to_grid(x.abs(), "e2m1")
    return (magnitude + 8 * _sign_bit(x)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    magnitude = _grid("e2m1", codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """E4M3 byte (uint8) of float32 values: round to nearest even, saturate to +-448, NaN -> 0x7F."""
    magnitude = round_to_grid(x.abs().nan_to_num(0.0), "e4m3")
    code = magnitude + 0x80 * _sign_bit(x)
    return torch.where(x.isnan(), 0x7F, code).to(torch.uint8)


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:
    magnitude = _grid("e4m3", codes.device)[(codes & 0x7F).clamp(max=126).long()]
    value = torch.where((codes & 0x80) != 0, -magnitude, magnitude)
    return torch.where((codes & 0x7F) == 0x7F, float("nan"), value)


def decode_ue8m0(codes: torch.Tensor) -> torch.Tensor:
    """2^(b - 127) as float32 (2^-127 is a float32 subnormal); 0xFF is NaN."""
    value = torch.pow(2.0, codes.double() - 127).float()
    return torch.where(codes == 0xFF, float("nan"), value)


def decode_ue4m3(codes: torch.Tensor) -> torch.Tensor:
    return decode_e4m3(codes)


def exp2_float32(exponent: torch.Tensor) -> torch.Tensor:
    """2^e exactly, as float32, for integer e in [-127, 127]."""
    return torch.pow(2.0, exponent.double()).float()


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] 4-bit codes -> [..., K/2] bytes; element 2i in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] 4-bit codes."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


# ---- block formats ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockFormat:
    """One quantization recipe: `group` elements along K share one scale byte."""

    name: str
    group: int
    element: str  # "e4m3" | "e2m1" | "e0m3"
    scale: str  # "ue8m0" | "ue4m3"
    qmax: float

    @property
    def element_bits(self) -> int:
        return 8 if self.element == "e4m3" else 4

    @property
    def scale_nan(self) -> int:
        return 0xFF if self.scale == "ue8m0" else 0x7F


MXFP8 = BlockFormat("mxfp8", 32, "e4m3", "ue8m0", 448.0)
MXFP4 = BlockFormat("mxfp4", 32, "e2m1", "ue8m0", 6.0)
NVFP4 = BlockFormat("nvfp4", 16, "e2m1", "ue4m3", 6.0)

# halops-style mode names
MODES = {"w8a8-mxfp8": MXFP8, "w4a4-mxfp4": MXFP4, "w4a4-nvfp4": NVFP4}


def _encode_elements(x: torch.Tensor, element: str) -> torch.Tensor:
    return encode_e4m3(x) if element == "e4m3" else encode_e2m1(x)


def _decode_elements(codes: torch.Tensor, element: str) -> torch.Tensor:
    return decode_e4m3(codes) if element == "e4m3" else decode_e2m1(codes)


def _decode_scales(codes: torch.Tensor, scale: str) -> torch.Tensor:
    return decode_ue8m0(codes) if scale == "ue8m0" else decode_ue4m3(codes)


# ---- scale layouts ----------------------------------------------------------------------------

SF_TILE_ROWS, SF_TILE_COLS, SF_TILE_BYTES = 128, 4, 512


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sf_offset(m: torch.Tensor | int, kb: torch.Tensor | int, nkb: int) -> torch.Tensor | int:
    """Byte offset of the scale of (row m, block kb) in a swizzled buffer of `nkb` scale columns.

    CUTLASS's Sm1xx SfAtom: 512-byte tiles of 128 rows x 4 columns, K-tile fastest, then row-tile.
    """
    nkt = _ceil_div(nkb, SF_TILE_COLS)
    tile = (m // SF_TILE_ROWS) * nkt + kb // SF_TILE_COLS
    return tile * SF_TILE_BYTES + (m % 32) * 16 + ((m % SF_TILE_ROWS) // 32) * 4 + kb % SF_TILE_COLS


def sf_bytes(rows: int, nkb: int) -> int:
    """Size of a swizzled scale buffer: whole 128 x 4 tiles."""
    return _ceil_div(rows, SF_TILE_ROWS) * _ceil_div(nkb, SF_TILE_COLS) * SF_TILE_BYTES


def swizzle_scales(plain: torch.Tensor) -> torch.Tensor:
    """Plain [rows, nkb] scale bytes -> flat swizzled buffer of sf_bytes(rows, nkb); padding is 0."""
    rows, nkb = plain.shape
    flat = torch.zeros(sf_bytes(rows, nkb), dtype=torch.uint8, device=plain.device)
    m = torch.arange(rows, device=plain.device)[:, None]
    kb = torch.arange(nkb, device=plain.device)[None, :]
    flat[sf_offset(m, kb, nkb)] = plain
    return flat


def unswizzle_scales(swizzled: torch.Tensor, rows: int, nkb: int) -> torch.Tensor:
    """Swizzled buffer (any shape, read flat) -> plain [rows, nkb]."""
    m = torch.arange(rows, device=swizzled.device)[:, None]
    kb = torch.arange(nkb, device=swizzled.device)[None, :]
    return swizzled.reshape(-1)[sf_offset(m, kb, nkb)]


def swizzled_scale_shape(rows: int, nkb: int) -> tuple[int, int]:
    """The 2-D view the halops-style API gives a swizzled buffer: [ceil(rows/128)*128, nkt*4]."""
    return _ceil_div(rows, SF_TILE_ROWS) * SF_TILE_ROWS, _ceil_div(nkb, SF_TILE_COLS) * SF_TILE_COLS


# ---- quantizers -------------------------------------------------------------------------------


def _float32_bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32).long() & 0xFFFFFFFF


def mx_scale_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Smallest s with amax <= qmax * 2^s, clamped to [-127, 127] (int64), from the float32 bits.

    With qmax = qm * 2^qe and amax = m * 2^e (1 <= m < 2): s = e - qe + (m > qm). A zero or
    subnormal amax gives -127 (every s it could need is below the clamp).
    """
    qmax_exponent = int(torch.tensor(qmax).frexp().exponent) - 1
    qmax_mantissa_bits = int(_float32_bits(torch.tensor([qmax]))) & 0x7FFFFF
    bits = _float32_bits(amax)
    biased = bits >> 23
    s = biased - 127 - qmax_exponent + ((bits & 0x7FFFFF) > qmax_mantissa_bits).long()
    return torch.where(biased == 0, -127, s).clamp(-127, 127)


def _blocks(x: torch.Tensor, group: int) -> torch.Tensor:
    rows, cols = x.shape
    return x.float().reshape(rows, cols // group, group)


def quantize_blocks(x: torch.Tensor, fmt: BlockFormat, global_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a [rows, K] matrix block by block along K.

    Returns (codes [rows, K] uint8, one element code per byte; scales [rows, K / g] uint8, plain
    layout). Blocks holding NaN or Inf get the NaN scale and all-zero codes.
    """
    blocks = _blocks(x, fmt.group)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    finite = blocks.isfinite().all(dim=-1, keepdim=True)
    amax = torch.where(finite, amax, 0.0)
    if fmt.scale == "ue8m0":
        s = mx_scale_exponent(amax, fmt.qmax)
        codes = _encode_elements(blocks * exp2_float32(-s), fmt.element)
        scales = (s + 127).to(torch.uint8)
    else:
        scale_f32 = torch.tensor(global_scale, dtype=torch.float32, device=x.device)
        scales = encode_e4m3((amax / fmt.qmax) * scale_f32)
        factor = scale_f32 / decode_ue4m3(scales)
        codes = _encode_elements(blocks * factor, fmt.element)
        codes = torch.where(scales == 0, 0, codes)
    codes = torch.where(finite, codes, 0).to(torch.uint8)
    scales = torch.where(finite, scales, fmt.scale_nan).to(torch.uint8)
    return codes.reshape(x.shape), scales.squeeze(-1)


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """Exact float32 values of [rows, K] element codes with plain [rows, K / g] scales."""
    rows, cols = codes.shape
    values = _decode_elements(codes, fmt.element).reshape(rows, cols // fmt.group, fmt.group)
    return (values * _decode_scales(scales, fmt.scale)[..., None]).reshape(rows, cols)


def store_values(codes: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """Element codes as stored: float8_e4m3fn [rows, K] or packed nibbles uint8 [rows, K/2]."""
    if fmt.element_bits == 8:
        return codes.view(torch.float8_e4m3fn)
    return pack_nibbles(codes)


def load_codes(values: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """Inverse of store_values: one uint8 code per element."""
    if fmt.element_bits == 8:
        return values.view(torch.uint8)
    return unpack_nibbles(values)


def quantize(x: torch.Tensor, fmt: BlockFormat, swizzle: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored values and scales of a [rows, K] matrix; swizzled scales in their 2-D halops view."""
    codes, plain = quantize_blocks(x, fmt)
    rows, nkb = plain.shape
    scales = swizzle_scales(plain).reshape(swizzled_scale_shape(rows, nkb)) if swizzle else plain
    return store_values(codes, fmt), scales


# ---- public functions (same names and signatures as the package's) ----------------------------


def group_wise_quant(
    input: torch.Tensor, mode: str = "w8a8-mxfp8", use_swizzle: bool = True, use_pdl: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of fp4_gemm.group_wise_quant (use_pdl has no numeric effect)."""
    return quantize(input, MODES[mode], use_swizzle)
