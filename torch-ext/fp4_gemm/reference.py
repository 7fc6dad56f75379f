"""The numeric contract of fp4-gemm in plain PyTorch (docs/FORMATS.md).

This module is the CPU implementation of every op and the oracle of every test. It imports only
torch and works without the compiled extension. It is written for clarity, not speed: vectorized
torch over whole tensors, no Python loops over elements, IEEE float32 where the contract says
float32.

Layout of the module, bottom up:
  element codecs (E2M1, E4M3, E0M3, UE8M0, UE4M3) and nibble packing;
  block formats (`BlockFormat`) and quantization recipes;
  scale layouts (`sf_offset`, the CUTLASS Sm1xx SfAtom);
  quantizers and dequantizers;
  the registered ops' CPU implementations (`*_into`: they write caller-provided outputs).
The public functions are the package's (_halops.py, _nvfp4.py), over the registered ops: on CPU
tensors they run these implementations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


_DEVICE_GRIDS: dict[tuple[str, torch.device], torch.Tensor] = {}


def _grid(name: str, device: torch.device) -> torch.Tensor:
    """The grid on `device`, copied once: later calls (a CUDA graph capture too) copy nothing."""
    key = (name, torch.device(device))
    if key not in _DEVICE_GRIDS:
        _DEVICE_GRIDS[key] = _GRIDS[name].to(device)
    return _DEVICE_GRIDS[key]


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


def encode_e0m3(x: torch.Tensor) -> torch.Tensor:
    """E0M3 code (uint8): magnitude min(rint_half_even(|x|), 7), sign bit only when the magnitude is > 0."""
    magnitude = round_to_grid(x.abs(), "e0m3")
    return (magnitude + 8 * (_sign_bit(x) & (magnitude > 0))).to(torch.uint8)


def decode_e0m3(codes: torch.Tensor) -> torch.Tensor:
    magnitude = (codes & 7).float()
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def exp2_float32(exponent: torch.Tensor) -> torch.Tensor:
    """2^e exactly, as float32, for integer e in [-127, 127]."""
    return torch.pow(2.0, exponent.double()).float()


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] 4-bit codes -> [..., K/2] bytes; element 2i in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] 4-bit codes."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


# ---- block formats and recipes ----------------------------------------------------------------


@dataclass(frozen=True)
class BlockFormat:
    """One block-scaled format: `group` elements along K share one scale byte."""

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

    def stored_cols(self, k: int) -> int:
        """Width of the stored values of a K-wide row: bytes of E4M3, or K/2 packed nibbles."""
        return k * self.element_bits // 8


MXFP8 = BlockFormat("mxfp8", 32, "e4m3", "ue8m0", 448.0)
MXFP4 = BlockFormat("mxfp4", 32, "e2m1", "ue8m0", 6.0)
NVFP4 = BlockFormat("nvfp4", 16, "e2m1", "ue4m3", 6.0)
E0M3 = BlockFormat("e0m3", 16, "e0m3", "ue4m3", 7.0)

FORMATS = {fmt.name: fmt for fmt in (MXFP8, MXFP4, NVFP4, E0M3)}

# halops-style mode names
MODES = {"w8a8-mxfp8": MXFP8, "w4a4-mxfp4": MXFP4, "w4a4-nvfp4": NVFP4}
# The halops GEMMs' weight-only modes (this package's extension of the spec): bf16 activations as they
# are (no scales), weights in the format named.
W4A16_MODES = {"w4a16-nvfp4": NVFP4, "w4a16-mxfp4": MXFP4}

# Quantization recipes of the `quantize` op: a format, and for nvfp4_mse the least-squares scale search.
RECIPES = {**{name: (fmt, False) for name, fmt in FORMATS.items()}, "nvfp4_mse": (NVFP4, True)}

# Candidate UE4M3 scale codes of the MSE search, as offsets from the RTN code, in evaluation order.
MSE_CANDIDATE_OFFSETS = (0, -1, 1, -2, 2)


def _encode_elements(x: torch.Tensor, element: str) -> torch.Tensor:
    return {"e4m3": encode_e4m3, "e2m1": encode_e2m1, "e0m3": encode_e0m3}[element](x)


def _decode_elements(codes: torch.Tensor, element: str) -> torch.Tensor:
    return {"e4m3": decode_e4m3, "e2m1": decode_e2m1, "e0m3": decode_e0m3}[element](codes)


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


def swizzled_scale_shape(rows: int, nkb: int) -> tuple[int, int]:
    """The 2-D view the halops-style API gives a swizzled buffer: [ceil(rows/128)*128, nkt*4]."""
    return _ceil_div(rows, SF_TILE_ROWS) * SF_TILE_ROWS, _ceil_div(nkb, SF_TILE_COLS) * SF_TILE_COLS


def _grid_offsets(rows: int, nkb: int, device: torch.device) -> torch.Tensor:
    m = torch.arange(rows, device=device)[:, None]
    kb = torch.arange(nkb, device=device)[None, :]
    return sf_offset(m, kb, nkb)


def swizzle_scales(plain: torch.Tensor) -> torch.Tensor:
    """Plain [rows, nkb] scale bytes -> flat swizzled buffer of sf_bytes(rows, nkb); padding is 0."""
    rows, nkb = plain.shape
    flat = torch.zeros(sf_bytes(rows, nkb), dtype=torch.uint8, device=plain.device)
    flat[_grid_offsets(rows, nkb, plain.device)] = plain
    return flat


def unswizzle_scales(swizzled: torch.Tensor, rows: int, nkb: int) -> torch.Tensor:
    """Swizzled buffer (any shape, read flat) -> plain [rows, nkb]."""
    return swizzled.reshape(-1)[_grid_offsets(rows, nkb, swizzled.device)]


def read_scales(scales: torch.Tensor, rows: int, nkb: int, swizzled: bool) -> torch.Tensor:
    """Plain [rows, nkb] view of a scale buffer in either layout."""
    return unswizzle_scales(scales, rows, nkb) if swizzled else scales.reshape(rows, nkb)


# ---- quantizers and dequantizers --------------------------------------------------------------


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


def _squared_error(blocks: torch.Tensor, scale_codes: torch.Tensor) -> torch.Tensor:
    """Float32 reconstruction error of each NVFP4 block at the given scale codes.

    The sum runs over the block in index order, one rounding per product and per add, exactly as
    the kernels evaluate it: the choice of scale depends on these bits.
    """
    sf = decode_ue4m3(scale_codes)
    restored = decode_e2m1(encode_e2m1(blocks * (1.0 / sf))) * sf
    d = blocks - restored
    error = torch.zeros_like(sf)
    for i in range(blocks.shape[-1]):
        error = error + d[..., i : i + 1] * d[..., i : i + 1]
    return error


def _least_squares_scales(blocks: torch.Tensor, rtn: torch.Tensor) -> torch.Tensor:
    """Per block, the candidate scale code (RTN code + MSE_CANDIDATE_OFFSETS, within 1..126) of least
    squared error; a candidate replaces the best so far only if strictly better (ties keep RTN)."""
    best, best_error = rtn.long(), _squared_error(blocks, rtn)
    for offset in MSE_CANDIDATE_OFFSETS[1:]:
        candidate = rtn.long() + offset
        usable = (rtn != 0) & (candidate >= 1) & (candidate <= 126)
        error = _squared_error(blocks, candidate.clamp(1, 126).to(torch.uint8))
        better = usable & (error < best_error)
        best = torch.where(better, candidate, best)
        best_error = torch.where(better, error, best_error)
    return best.to(torch.uint8)


def quantize_blocks(x: torch.Tensor, fmt: BlockFormat, mse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a [rows, K] matrix block by block along K.

    Returns (codes [rows, K] uint8, one element code per byte; scales [rows, K / g] uint8, plain
    layout). Blocks holding NaN or Inf get the NaN scale and all-zero codes. `mse` (NVFP4 only)
    picks each block's scale by least squared error instead of round-to-nearest.
    """
    rows, cols = x.shape
    blocks = x.float().reshape(rows, cols // fmt.group, fmt.group)
    finite = blocks.isfinite().all(dim=-1, keepdim=True)
    amax = torch.where(finite, blocks.abs().amax(dim=-1, keepdim=True), 0.0)
    if fmt.scale == "ue8m0":
        s = mx_scale_exponent(amax, fmt.qmax)
        codes = _encode_elements(blocks * exp2_float32(-s), fmt.element)
        scales = (s + 127).to(torch.uint8)
    else:
        scales = encode_e4m3(amax / fmt.qmax)
        if mse:
            scales = _least_squares_scales(blocks, scales)
        codes = _encode_elements(blocks * (1.0 / decode_ue4m3(scales)), fmt.element)
        codes = torch.where(scales == 0, 0, codes)
    codes = torch.where(finite, codes, 0).to(torch.uint8)
    scales = torch.where(finite, scales, fmt.scale_nan).to(torch.uint8)
    return codes.reshape(rows, cols), scales.squeeze(-1)


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


def quantize(x: torch.Tensor, fmt: BlockFormat, swizzle: bool, mse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored values and scales of a [rows, K] matrix; swizzled scales in their 2-D halops view."""
    codes, plain = quantize_blocks(x, fmt, mse)
    rows, nkb = plain.shape
    scales = swizzle_scales(plain).reshape(swizzled_scale_shape(rows, nkb)) if swizzle else plain
    return store_values(codes, fmt), scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, fmt: BlockFormat, swizzled: bool = True) -> torch.Tensor:
    """Exact float32 [rows, K] of stored values (any leading shape, rows = all but the last dim)."""
    stored = values.reshape(-1, values.shape[-1])
    codes = load_codes(stored, fmt)
    rows, k = codes.shape
    return dequantize_blocks(codes, read_scales(scales, rows, k // fmt.group, swizzled), fmt)


# ---- streaming weight layout (decode GEMV) ----------------------------------------------------

STREAM_TILE_ROWS, STREAM_TILE_K = 8, 64  # one tile: 8 rows x 64 elements = 8 x 32 bytes, contiguous


def interleave_rows(packed: torch.Tensor) -> torch.Tensor:
    """Row-major packed NVFP4 [N, K/2] -> streaming layout (same shape): tiles of 8 rows x 32 bytes,
    tile (n // 8, k // 64) at byte ((n // 8) * (K / 64) + k // 64) * 256, rows inside a tile 32 bytes apart."""
    n, kb = packed.shape
    tiles = packed.reshape(n // STREAM_TILE_ROWS, STREAM_TILE_ROWS, kb // 32, 32)
    return tiles.permute(0, 2, 1, 3).reshape(n, kb).contiguous()


def deinterleave_rows(streamed: torch.Tensor) -> torch.Tensor:
    """Inverse of interleave_rows."""
    n, kb = streamed.shape
    tiles = streamed.reshape(n // STREAM_TILE_ROWS, kb // 32, STREAM_TILE_ROWS, 32)
    return tiles.permute(0, 2, 1, 3).reshape(n, kb).contiguous()


# ---- the registered ops' CPU implementations --------------------------------------------------
# Same arguments as the op schemas in torch_binding.cpp; outputs are written in place.


def quantize_into(
    input: torch.Tensor, recipe: str, swizzle: bool, pdl: bool, values: torch.Tensor, scales: torch.Tensor
) -> None:
    """`quantize` op. `values` may be wider and taller than `input`: the extra region quantizes zeros."""
    fmt, mse = RECIPES[recipe]
    out_rows, out_cols = values.shape[0], values.shape[1] * 8 // fmt.element_bits
    padded = torch.zeros(out_rows, out_cols, dtype=torch.float32, device=input.device)
    padded[: input.shape[0], : input.shape[1]] = input.float()
    stored, stored_scales = quantize(padded, fmt, swizzle, mse)
    values.copy_(stored.view(values.dtype))
    scales.copy_(stored_scales.reshape(scales.shape))


def dequantize_into(values: torch.Tensor, scales: torch.Tensor, recipe: str, swizzle: bool, out: torch.Tensor) -> None:
    """`dequantize` op: exact float32 values rounded to out's dtype."""
    out.copy_(dequantize(values, scales, RECIPES[recipe][0], swizzle).reshape(out.shape))


def gelu(y: torch.Tensor) -> torch.Tensor:
    """The exact (erf) GELU, y * Phi(y), written with erfc so the negative tail keeps its precision
    (1 + erf(y / sqrt 2) cancels catastrophically there)."""
    return 0.5 * y * torch.special.erfc(-y * 0.5**0.5)


ACTIVATIONS = {
    "none": lambda y: y,
    "gelu": gelu,
    "relu2": lambda y: torch.relu(y) ** 2,
    "geglu": lambda y: gelu(y[:, 0::2]) * y[:, 1::2],  # weight rows 2j (gate) and 2j+1 (up)
}


def row_groups(
    grouping: str, rows: int, groups: int, group_index: torch.Tensor | None, group_rows: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group (weight matrix) of every row of A, and which rows the op owns (writes).

    dense: one group. batched: `group_rows` rows per group. contiguous: group_index holds each row's
    expert id; -1 and ids outside [0, groups) are not owned. masked: `group_rows` rows per group, of
    which the first clamp(group_index[g], 0, group_rows) are owned.
    """
    index = torch.arange(rows, device=device)
    if grouping in ("dense", "batched", "masked"):
        group = index // group_rows if grouping != "dense" else torch.zeros_like(index)
        owned = torch.ones_like(index, dtype=torch.bool)
        if grouping == "masked":
            valid = group_index.long().clamp(0, group_rows)
            owned = index % group_rows < valid[group]
        return group, owned
    expert = group_index.long()
    owned = (expert >= 0) & (expert < groups)
    return expert.clamp(0, groups - 1), owned


def group_scale_tiles(rows: int, groups: int) -> int:
    """128-row tiles that tile_group_scales_into may fill: ceil(rows / 128) + groups, since the sum
    over experts of ceil(rows_e / 128) is at most rows / 128 + groups (csrc/gemm/blackwell/group_scales.h)."""
    return _ceil_div(rows, SF_TILE_ROWS) + groups


def contiguous_group_rows(group_index: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each expert's rows of a contiguous grouping: from its first to its last row with its id
    (rows 0, first 0 when it has none); ids outside [0, groups) belong to no expert."""
    ids = group_index.long().reshape(-1)
    index = torch.arange(ids.numel(), device=ids.device)
    key = torch.where((ids >= 0) & (ids < groups), ids, groups)  # one spare slot for the others
    first = torch.full((groups + 1,), ids.numel(), dtype=torch.long, device=ids.device)
    last = torch.full((groups + 1,), -1, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, key, index, "amin")[:groups]
    last = last.scatter_reduce(0, key, index, "amax")[:groups]
    rows = (last - first + 1).clamp(min=0)
    return torch.where(rows > 0, first, 0), rows


def tile_group_scales_into(
    group_index: torch.Tensor | None,
    group_rows: int,
    scales: torch.Tensor,
    groups: int,
    nkb: int,
    layout: torch.Tensor,
    out_scales: torch.Tensor,
) -> None:
    """`tile_group_scales` op: a grouping's scales re-laid so that every group starts on a 128-row
    SfAtom tile. The groups are contiguous (group_index: expert id per row) or, without group_index,
    strided (group g = rows [g * group_rows, (g + 1) * group_rows), the ids r // group_rows). layout
    int32 [3, groups] receives each expert's first row, rows (contiguous_group_rows) and first tile
    (exclusive prefix sum of ceil(rows / 128), all clamped to group_scale_tiles tiles); out_scales (at
    least group_scale_tiles(M, groups) tiles of ceil(nkb / 4) * 512 bytes) holds row first + i of
    expert e at row tile * 128 + i. The rest of an expert's last tile and the padding columns are 0;
    tiles past the last expert's are not written."""
    if group_index is None:
        group_index = torch.arange(groups * group_rows, device=scales.device, dtype=torch.int32) // group_rows
    capacity = group_scale_tiles(group_index.numel(), groups)
    first, rows = contiguous_group_rows(group_index, groups)
    tiles = -(-rows // SF_TILE_ROWS)
    tile = (torch.cumsum(tiles, 0) - tiles).clamp(max=capacity)
    tiles = torch.minimum(tiles, capacity - tile)
    rows = torch.minimum(rows, tiles * SF_TILE_ROWS)
    layout.copy_(torch.stack([first, rows, tile]).to(torch.int32).reshape(layout.shape))
    device = scales.device
    expert = torch.repeat_interleave(torch.arange(groups, device=device), tiles * SF_TILE_ROWS)
    dest = torch.arange(expert.numel(), device=device)  # the experts' tiles follow one another
    i = dest - tile[expert] * SF_TILE_ROWS
    kb = torch.arange(_ceil_div(nkb, SF_TILE_COLS) * SF_TILE_COLS, device=device)
    valid = (i < rows[expert])[:, None] & (kb < nkb)[None, :]
    source = sf_offset(
        (first[expert] + i).clamp(max=max(group_index.numel() - 1, 0))[:, None], kb.clamp(max=nkb - 1), nkb
    )
    values = torch.where(valid, scales.reshape(-1)[source], 0).to(torch.uint8)
    out_scales.reshape(-1)[sf_offset(dest[:, None], kb[None, :], nkb)] = values


def gemm_accumulate(a: torch.Tensor, b: torch.Tensor, group: torch.Tensor, groups: int) -> torch.Tensor:
    """acc[m, n] = sum_k A[m, k] * B[group[m], n, k] in float64 over exactly dequantized operands."""
    a64, b64 = a.double(), b.double().reshape(groups, -1, a.shape[1])
    acc = torch.zeros(a.shape[0], b64.shape[1], dtype=torch.float64, device=a.device)
    for g in range(groups):
        acc = torch.where((group == g)[:, None], a64 @ b64[g].T, acc)
    return acc


def gemm_epilogue(
    acc: torch.Tensor,
    group: torch.Tensor,
    alpha: torch.Tensor | None,
    alpha_scale: float,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
) -> torch.Tensor:
    """y = act(alpha * acc + bias + residual), in float64."""
    y = acc * alpha_scale
    if alpha is not None:
        y = y * alpha.double().reshape(-1)[group if alpha.numel() > 1 else torch.zeros_like(group)][:, None]
    if bias is not None:
        y = y + (bias.double().reshape(-1, y.shape[1])[group] if bias.dim() > 1 else bias.double()[None, :])
    if residual is not None:
        y = y + residual.double().reshape(y.shape)
    return ACTIVATIONS[activation](y)


def operand_values(values: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """Float32 [rows, K] of a GEMM operand: block-scaled values dequantized exactly, or a plain bf16
    operand ("bf16": the W4A16 tier's activations; its scales are ignored) as it is."""
    if fmt == "bf16":
        return values.reshape(-1, values.shape[-1]).float()
    return dequantize(values, scales, FORMATS[fmt])


def gemm_into(
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor | None,
    sfb: torch.Tensor,
    a_format: str,
    b_format: str,
    b_interleaved: bool,
    grouping: str,
    group_index: torch.Tensor | None,
    group_rows: int,
    alpha: torch.Tensor | None,
    alpha_scale: float,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    out: torch.Tensor,
    out_scales: torch.Tensor | None,
    out_format: str,
    schedule: str,
    variant: int,
    sm_count: int,
    warps: int,
    stages: int,
    splits: int,
    pdl: bool,
) -> None:
    """`gemm` op: the GEMM result of docs/FORMATS.md written into `out` (sfa is None for a bf16 A;
    schedule, variant, sm_count, warps, stages, splits and pdl pick how a kernel runs, never what it
    computes)."""
    groups = b.shape[0] if b.dim() == 3 else 1
    b_values = b.reshape(-1, b.shape[-1])
    if b_interleaved:
        b_values = deinterleave_rows(b_values)
    a_dq = operand_values(a, sfa, a_format)
    b_dq = operand_values(b_values, sfb, b_format)
    group, owned = row_groups(grouping, a_dq.shape[0], groups, group_index, group_rows, a.device)
    acc = gemm_accumulate(a_dq, b_dq, group, groups)
    y = gemm_epilogue(acc, group, alpha, alpha_scale, bias, residual, activation).float()
    if out_format in ("bf16", "fp16"):
        flat = out.reshape(y.shape)
        flat.copy_(torch.where(owned[:, None], y.to(out.dtype), flat))
        return
    if out_format == "nvfp4_from_fp16":
        y = y.half().float()
    codes, plain = quantize_blocks(y, NVFP4)
    out.copy_(pack_nibbles(codes).reshape(out.shape))
    out_scales.copy_(swizzle_scales(plain).reshape(out_scales.shape))


# SwiGLU in float32 with every step rounded on its own, so kernels reproduce it bit for bit: exp is
# Cody-Waite reduction by ln 2 and a degree-6 Taylor polynomial (about 2 ulp), then IEEE division.
EXP_LOG2E, EXP_LN2_HI, EXP_LN2_LO = 1.44269504, 0.693145751953125, 1.428606765330187e-06
EXP_TAYLOR = (1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0)  # highest degree first
EXP_MIN, EXP_MAX = -87.0, 88.0  # 2^n stays a normal float32


def exp_float32(x: torch.Tensor) -> torch.Tensor:
    """exp of float32 x, step by step: n = rint(x * log2 e), r = (x - n * ln2_hi) - n * ln2_lo,
    p = Horner(r) (each product and sum rounded), result p * 2^n; x is clamped to [-87, 88]; NaN stays NaN."""
    # Python-float constants take the tensor's dtype: each is rounded to float32, as in the kernels,
    # and no host-to-device copy happens (the function runs inside CUDA graph captures).
    clamped = x.float().clamp(EXP_MIN, EXP_MAX)
    n = torch.round(clamped * EXP_LOG2E)
    r = (clamped - n * EXP_LN2_HI) - n * EXP_LN2_LO
    p = torch.full_like(r, EXP_TAYLOR[0])
    for c in EXP_TAYLOR[1:]:
        p = p * r + c
    power = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return torch.where(x.isnan(), x, p * power)


def swiglu_float32(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """up * silu(gate) = up * (gate / (1 + exp(-gate))) in float32, each step rounded on its own."""
    gate, up = gate.float(), up.float()
    return up * (gate / (1.0 + exp_float32(-gate)))


def swiglu_quant_into(
    input: torch.Tensor, counts: torch.Tensor, recipe: str, values: torch.Tensor, scales: torch.Tensor
) -> None:
    """`swiglu_quant` op: y = swiglu_float32(gate, up) for input = [gate | up] rows, then quantized.
    Group g owns the first clamp(counts[g], 0, M) of its M = rows / groups rows; other rows' values and
    scale bytes are not written."""
    fmt = RECIPES[recipe][0]
    rows, width = input.shape
    hidden, groups = width // 2, counts.numel()
    y = swiglu_float32(input[:, :hidden], input[:, hidden:])
    codes, plain = quantize_blocks(y, fmt)
    _, owned = row_groups("masked", rows, groups, counts, rows // groups, input.device)
    stored = store_values(codes, fmt).view(values.dtype)
    values.copy_(torch.where(owned[:, None], stored, values))
    nkb = hidden // fmt.group
    padded_owned = torch.ones(swizzled_scale_shape(rows, nkb)[0], dtype=torch.bool, device=input.device)
    padded_owned[:rows] = owned
    new_scales = swizzle_scales(plain)
    rows_of_bytes = _rows_of_swizzled_bytes(new_scales.numel(), nkb, input.device)
    flat = scales.reshape(-1)
    flat.copy_(torch.where(padded_owned[rows_of_bytes], new_scales, flat))


def _rows_of_swizzled_bytes(size: int, nkb: int, device: torch.device) -> torch.Tensor:
    """Row index of every byte of a swizzled buffer (padding rows included)."""
    rows = size // (_ceil_div(nkb, SF_TILE_COLS) * SF_TILE_COLS)
    row_of = torch.empty(size, dtype=torch.long, device=device)
    row_of[_grid_offsets(rows, _ceil_div(nkb, SF_TILE_COLS) * SF_TILE_COLS, device)] = torch.arange(
        rows, device=device
    )[:, None]
    return row_of


def routing_positions(topk_ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each (token, slot): its position among the slots routed to the same expert, counting in
    (token, slot) order, and each expert's true slot count. Slots with ids outside [0, experts)
    are unrouted (position -1, counted nowhere)."""
    ids = topk_ids.reshape(-1).long()
    routed = (ids >= 0) & (ids < experts)
    key = torch.where(routed, ids, experts)
    sorted_key, order = torch.sort(key, stable=True)
    counts = torch.zeros(experts + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    starts = torch.cumsum(counts, 0) - counts
    position = torch.empty_like(ids)
    position[order] = torch.arange(ids.numel(), device=ids.device) - starts[sorted_key]
    return torch.where(routed, position, -1).reshape(topk_ids.shape), counts[:experts]


def broadcast_scale_bytes(scale: torch.Tensor, hidden: int) -> torch.Tensor:
    """UE8M0 byte of every 32-element block of each token: int32 broadcast mode (byte j of column i
    is the scale of 128-element group 4i + j, shared by its four blocks) or uint8 direct mode."""
    if scale.dtype == torch.int32:
        per_group = scale.contiguous().view(torch.uint8).reshape(scale.shape[0], hidden // 128)
        return per_group.repeat_interleave(4, dim=1)
    return scale.reshape(scale.shape[0], hidden // 32)


def permute_into(
    x: torch.Tensor,
    scale: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    max_token_num: int,
    permute_x: torch.Tensor,
    out_scale: torch.Tensor,
    index_map: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """`permute_to_masked` op: each routed (token, slot) copies the token's row and its scale bytes to
    row expert * max_token_num + position; positions >= max_token_num are dropped (index -1) while
    counts keep the true totals. Rows no slot lands on are zeroed (values and scale bytes): every
    byte of permute_x and out_scale is written."""
    tokens, topk = topk_ids.shape
    hidden = x.shape[1]
    position, true_counts = routing_positions(topk_ids, num_experts)
    placed = (position >= 0) & (position < max_token_num)
    index_map.copy_(torch.where(placed, position, -1).to(torch.int32))
    counts.copy_(true_counts.reshape(counts.shape).to(torch.int32))

    permute_x.view(torch.uint8).zero_()
    out_scale.zero_()
    total_rows = num_experts * max_token_num
    expert = topk_ids.long().clamp(0, num_experts - 1)
    dest = torch.where(placed, expert * max_token_num + position, total_rows).reshape(-1)  # spare row
    token = torch.arange(tokens, device=x.device).repeat_interleave(topk)
    target = permute_x.view(torch.uint8)  # bytes: index_copy_ has no float8 kernels
    rows = torch.cat([target, target[:1]])
    rows.index_copy_(0, dest, x.view(torch.uint8)[token])
    target.copy_(rows[:total_rows])

    nkb = hidden // 32
    sf = broadcast_scale_bytes(scale, hidden)[token]
    offsets = _grid_offsets(total_rows, nkb, x.device)
    spare = out_scale.numel()
    byte_dest = torch.where(placed.reshape(-1, 1), offsets[dest.clamp(max=total_rows - 1)], spare)
    flat = torch.cat([out_scale.reshape(-1), out_scale.reshape(-1)[:1]])
    flat[byte_dest.reshape(-1)] = sf.reshape(-1)
    out_scale.copy_(flat[:spare].reshape(out_scale.shape))


def repack_into(b: torch.Tensor, out: torch.Tensor) -> None:
    """`repack` op: row-major packed NVFP4 weight -> the streaming layout of interleave_rows."""
    out.copy_(interleave_rows(b))
