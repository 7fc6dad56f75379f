"""The peers of the GEMM benchmark (bench_gemm.py): what a Hopper user can run on block-scaled operands
without this package. Each is an independent implementation (none calls the package), checked against
the reference on CPU by tests/test_bench_gemm_helpers.py and against ours on every benchmark row.

- TorchDequant / dequant_mm: unpack nibbles, decode by table lookup, multiply by the scales gathered from
  the swizzled buffer through an index precomputed once, then cuBLAS bf16 (what torchao does off Blackwell).
- triton_dequant: one Triton kernel, packed operand + swizzled scales -> bf16, scale offsets computed in
  the kernel with the SfAtom formula; then cuBLAS bf16.
- triton_dot_scaled: Triton's tl.dot_scaled on plain [rows, K/g] scales (it upcasts in-kernel on Hopper).
- rowwise_fp8 / scaled_mm_rowwise: torch._scaled_mm with row-wise float32 scales (a different recipe,
  shown for the FP8 tensor-core ceiling).

Triton is imported on first use (triton_kernels()), so this module imports without Triton or a GPU; the
kernels are jitted at that moment, so TRITON_INTERPRET=1 set before the first call runs them on CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from benchmark import GEMM_OPERANDS, OPERANDS, Operand, mm_bt  # noqa: F401 (the peers' operand table)

Tensor = torch.Tensor

# ---- scale layout -------------------------------------------------------------------------------


def sf_index(rows: int, nkb: int, device: torch.device | str = "cpu") -> Tensor:
    """int64 [rows, nkb]: byte offset of the scale of (row m, block kb) in a swizzled (SfAtom) buffer.

    512-byte tiles of 128 rows x 4 blocks, K-tile fastest, then row-tile; written out here rather than
    imported so that the peers stay independent of the package they are compared with.
    """
    nkt = -(-nkb // 4)
    m = torch.arange(rows, device=device)[:, None]
    kb = torch.arange(nkb, device=device)[None, :]
    return ((m // 128) * nkt + kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4


def plain_scales(scales: Tensor, rows: int, nkb: int) -> Tensor:
    """Row-major uint8 [rows, nkb] copy of a swizzled scale buffer (any shape, read flat)."""
    return scales.reshape(-1)[sf_index(rows, nkb, scales.device)].contiguous()


# ---- decode tables ------------------------------------------------------------------------------

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e4m3_values() -> Tensor:
    """float32 [256]: the value of every E4M3 byte; 0x7F and 0xFF are NaN."""
    code = torch.arange(256)
    exponent, mantissa = (code >> 3) & 15, code & 7
    magnitude = torch.where(
        exponent == 0,
        mantissa.double() * 2.0**-9,
        (8 + mantissa).double() * torch.pow(2.0, (exponent - 10).double()),
    ).float()
    value = torch.where(code >= 128, -magnitude, magnitude)
    return torch.where((code & 0x7F) == 0x7F, float("nan"), value)


def element_table(element: str, device: torch.device | str = "cpu") -> Tensor:
    """bf16 [16]: the value of every 4-bit code (bit 3 is the sign)."""
    magnitudes = {"e2m1": torch.tensor(E2M1_MAGNITUDES), "e0m3": torch.arange(8).float()}[element]
    return torch.cat([magnitudes, -magnitudes]).to(device=device, dtype=torch.bfloat16)


def scale_table(scale: str, device: torch.device | str = "cpu") -> Tensor:
    """bf16 [256]: the value of every scale byte (exact: 2^k and E4M3 values are bf16 numbers)."""
    if scale == "ue8m0":
        code = torch.arange(256)
        values = torch.pow(2.0, code.double() - 127).float()
        values = torch.where(code == 255, float("nan"), values)
    else:
        values = e4m3_values()
    return values.to(device=device, dtype=torch.bfloat16)


# ---- PyTorch dequantize + cuBLAS ----------------------------------------------------------------


@dataclass
class TorchDequant:
    """Plain-PyTorch dequantizer of one [rows, K] operand: tables and the scale gather index are built
    once (outside any timing); each call decodes the values and gathers and applies the scales.

    Every product is computed in bf16 and is exact there: an E2M1/E0M3/E4M3 value times a power of two
    or an E4M3 scale needs at most 7 significant bits.
    """

    operand: Operand
    rows: int
    k: int
    index: Tensor  # int64 [rows * nkb]: flat offsets into the swizzled buffer
    elements: Tensor  # bf16 [16]: 4-bit code values (unused for E4M3)
    scales: Tensor  # bf16 [256]: scale byte values

    @classmethod
    def build(cls, operand: Operand, rows: int, k: int, device: torch.device | str) -> TorchDequant:
        index = sf_index(rows, k // operand.group, device).reshape(-1)
        elements = element_table(operand.element if operand.packed else "e2m1", device)
        return cls(operand, rows, k, index, elements, scale_table(operand.scale, device))

    def __call__(self, values: Tensor, scales: Tensor) -> Tensor:
        """bf16 [rows, K] of stored values (float8/uint8) and their swizzled scales."""
        if self.operand.packed:
            byte = values.view(torch.uint8)
            codes = torch.stack((byte & 0xF, byte >> 4), dim=-1).view(self.rows, self.k)
            x = self.elements[codes.int()]
        else:
            x = values.view(torch.float8_e4m3fn).to(torch.bfloat16)
        s = self.scales[scales.reshape(-1)[self.index].int()]
        g = self.operand.group
        return (x.view(self.rows, -1, g) * s.view(self.rows, -1, 1)).view(self.rows, self.k)


# ---- FP8 row-wise (torch._scaled_mm) ------------------------------------------------------------

E4M3_MAX = 448.0
# use_fast_accum=True: this peer shows the FP8 tensor-core ceiling, not an accuracy class of its own
FP8_FAST_ACCUM = True


def rowwise_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    """(float8_e4m3fn [rows, K], float32 [rows, 1]) with x ~ values * scale, scale = amax(row) / 448."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / E4M3_MAX
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def scaled_mm_rowwise(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor) -> Tensor:
    """bf16 [M, N] = (a * a_scale) @ (b * b_scale)^T with row-wise scales on both operands."""
    return torch._scaled_mm(
        a, b.t(), scale_a=a_scale, scale_b=b_scale.t(), out_dtype=torch.bfloat16, use_fast_accum=FP8_FAST_ACCUM
    )


# ---- Triton kernels (jitted on first use) -------------------------------------------------------
# The functions below are plain Python until triton_kernels() runs triton.jit on them in place: the
# module then imports without Triton, and TRITON_INTERPRET is read when they are jitted, not at import.
# Their bodies resolve `tl` and each other through this module's globals, as jitted code always does.

tl = None  # triton.language, set by triton_kernels()

ELEMENT_CODES = {"e4m3": 0, "e2m1": 1, "e0m3": 2}
SCALE_CODES = {"ue8m0": 0, "ue4m3": 1}


def _e4m3_magnitude(c):
    """float32 of E4M3 magnitude codes c (int32, 0..126): (8 + m) * 2^(e - 10), or m * 2^-9 for e = 0."""
    e = c >> 3
    m = c & 7
    normal = ((e + 120) << 23) | (m << 20)  # float32 bits of (1 + m/8) * 2^(e - 7)
    return tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True))


def _decode_element(c, ELEMENT: tl.constexpr):
    """float32 value of element codes c (int32): E4M3 bytes, or 4-bit E2M1 / E0M3 codes (bit 3 = sign)."""
    if ELEMENT == 0:
        magnitude = tl.where((c & 0x7F) == 0x7F, float("nan"), _e4m3_magnitude(c & 0x7F))
        sign = c & 0x80
    elif ELEMENT == 1:
        q = c & 7
        e = q >> 1
        normal = ((e + 126) << 23) | ((q & 1) << 22)  # float32 bits of (1 + m/2) * 2^(e - 1)
        magnitude = tl.where(e == 0, (q & 1).to(tl.float32) * 0.5, normal.to(tl.float32, bitcast=True))
        sign = c & 8
    else:
        magnitude = (c & 7).to(tl.float32)
        sign = c & 8
    return tl.where(sign != 0, -magnitude, magnitude)


def _decode_scale(b, SCALE: tl.constexpr):
    """float32 value of scale bytes b (int32): UE8M0 2^(b - 127) (b = 0 is the subnormal 2^-127), or UE4M3."""
    if SCALE == 0:
        value = tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)
        return tl.where(b == 255, float("nan"), value)
    return tl.where((b & 0x7F) == 0x7F, float("nan"), _e4m3_magnitude(b & 0x7F))


def _dequant_kernel(
    values,
    scales,
    out,
    rows,
    k,
    nkt,
    ELEMENT: tl.constexpr,
    SCALE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[rows, k] (bf16) of one BLOCK_ROWS x BLOCK_K tile: values decoded, times their block scale.

    Scales are read from the swizzled buffer directly (offsets from the SfAtom formula), so the kernel
    needs no preprocessing of the package's layout.
    """
    BLOCKS: tl.constexpr = BLOCK_K // GROUP
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    kb = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    ok = (r[:, None] < rows) & (kb[None, :] < k // GROUP)  # [BLOCK_ROWS, BLOCKS]
    rt = r[:, None]
    sf = ((rt // 128) * nkt + kb[None, :] // 4) * 512 + (rt % 32) * 16 + ((rt % 128) // 32) * 4 + kb[None, :] % 4
    s = _decode_scale(tl.load(scales + sf, mask=ok, other=0).to(tl.int32), SCALE)[:, :, None]
    row = r.to(tl.int64)[:, None, None]
    if ELEMENT == 0:  # one byte per element
        j = tl.arange(0, GROUP)[None, None, :]
        c = tl.load(values + row * k + kb[None, :, None] * GROUP + j, mask=ok[:, :, None], other=0).to(tl.int32)
        x = tl.reshape(_decode_element(c, ELEMENT) * s, (BLOCK_ROWS, BLOCK_K))
    else:  # two codes per byte, element 2i in the low nibble
        j = tl.arange(0, GROUP // 2)[None, None, :]
        ptr = values + row * (k // 2) + kb[None, :, None] * (GROUP // 2) + j
        c = tl.load(ptr, mask=ok[:, :, None], other=0).to(tl.int32)
        lo = _decode_element(c & 15, ELEMENT) * s
        hi = _decode_element(c >> 4, ELEMENT) * s
        x = tl.reshape(tl.join(lo, hi), (BLOCK_ROWS, BLOCK_K))  # join interleaves: lo0 hi0 lo1 hi1 ...
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (r[:, None] < rows) & (cols[None, :] < k)
    tl.store(out + r.to(tl.int64)[:, None] * k + cols[None, :], x.to(tl.bfloat16), mask=mask)


def _dot_scaled_kernel(
    a,
    a_scale,
    b,
    b_scale,
    c,
    m,
    n,
    k,
    FORMAT: tl.constexpr,
    PACK: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """c[m, n] (bf16) = A @ B^T with A [m, k/PACK], B [n, k/PACK] and plain scales [rows, k/SCALE_GROUP]."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(m, BLOCK_M)
    grid_n = tl.cdiv(n, BLOCK_N)
    # GROUP_M row tiles sweep the columns together, so each B tile is reused from L2
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    # rows beyond m / n wrap around: every load stays in bounds without a mask; the store is masked
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % m
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % n
    kp = tl.arange(0, BLOCK_K // PACK)
    ks = tl.arange(0, BLOCK_K // SCALE_GROUP)
    a_ptr = a + rm.to(tl.int64)[:, None] * (k // PACK) + kp[None, :]
    b_ptr = b + rn.to(tl.int64)[:, None] * (k // PACK) + kp[None, :]
    as_ptr = a_scale + rm.to(tl.int64)[:, None] * (k // SCALE_GROUP) + ks[None, :]
    bs_ptr = b_scale + rn.to(tl.int64)[:, None] * (k // SCALE_GROUP) + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, k // BLOCK_K):
        b_tile = tl.load(b_ptr)
        acc = tl.dot_scaled(tl.load(a_ptr), tl.load(as_ptr), FORMAT, b_tile.T, tl.load(bs_ptr), FORMAT, acc)
        a_ptr += BLOCK_K // PACK
        b_ptr += BLOCK_K // PACK
        as_ptr += BLOCK_K // SCALE_GROUP
        bs_ptr += BLOCK_K // SCALE_GROUP
    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (cm[:, None] < m) & (cn[None, :] < n)
    tl.store(c + cm.to(tl.int64)[:, None] * n + cn[None, :], acc.to(tl.bfloat16), mask=mask)


_JITTED: SimpleNamespace | None = None


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_kernels() -> SimpleNamespace:
    """Import Triton and jit the kernels above (once per process): namespace with dequant, dot_scaled."""
    global _JITTED, tl, _e4m3_magnitude, _decode_element, _decode_scale, _dequant_kernel, _dot_scaled_kernel
    if _JITTED is None:
        import triton
        import triton.language

        tl = triton.language
        _e4m3_magnitude = triton.jit(_e4m3_magnitude)
        _decode_element = triton.jit(_decode_element)
        _decode_scale = triton.jit(_decode_scale)
        # row counts are not specialized on: M = 1 or M % 16 would otherwise each compile a new kernel
        _dequant_kernel = triton.jit(_dequant_kernel, do_not_specialize=["rows"])
        _dot_scaled_kernel = triton.jit(_dot_scaled_kernel, do_not_specialize=["m"])
        _JITTED = SimpleNamespace(triton=triton, dequant=_dequant_kernel, dot_scaled=_dot_scaled_kernel)
    return _JITTED


DEQUANT_BLOCK_ROWS, DEQUANT_BLOCK_K = 16, 512  # 8192 elements a program: 4 KB of FP4 in, 16 KB out


def triton_dequant(values: Tensor, scales: Tensor, operand: Operand, out: Tensor) -> Tensor:
    """out (bf16 [rows, K]) = the operand dequantized by one Triton kernel reading the swizzled scales."""
    kernels = triton_kernels()
    rows, k = out.shape
    block_k = min(DEQUANT_BLOCK_K, next_power_of_2(k))
    grid = (-(-rows // DEQUANT_BLOCK_ROWS), -(-k // block_k))
    kernels.dequant[grid](
        values.view(torch.uint8), scales.reshape(-1), out, rows, k, -(-k // operand.group // 4),
        ELEMENT=ELEMENT_CODES[operand.element], SCALE=SCALE_CODES[operand.scale], GROUP=operand.group,
        BLOCK_ROWS=DEQUANT_BLOCK_ROWS, BLOCK_K=block_k, num_warps=4,
    )  # fmt: skip
    return out


def next_power_of_2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(x)))


@dataclass(frozen=True)
class DotScaledConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def dot_scaled_config(m: int) -> DotScaledConfig:
    """One untuned configuration per M range (no autotuning: the benchmark's time budget is minutes)."""
    if m <= 16:
        return DotScaledConfig(16, 64, 256, 4, 4)
    if m <= 256:
        return DotScaledConfig(64, 128, 128, 4, 3)
    return DotScaledConfig(128, 128, 128, 8, 3)


# tl.dot_scaled's name of each element format; E0M3 has none
DOT_SCALED_FORMATS = {"e4m3": "e4m3", "e2m1": "e2m1"}


def triton_dot_scaled(
    a: Tensor, a_scales: Tensor, b: Tensor, b_scales: Tensor, operand: Operand, out: Tensor
) -> Tensor:
    """out (bf16 [M, N]) = A @ B^T by tl.dot_scaled; a_scales/b_scales plain uint8 [rows, K/g].

    UE4M3 scales (NVFP4, one per 16) go in as float8_e4m3fn, the form tl.dot_scaled takes for them;
    whether a Hopper build lowers that is for the benchmark to find out (it records the error).
    """
    if operand.element not in DOT_SCALED_FORMATS:
        raise NotImplementedError(f"tl.dot_scaled has no {operand.element} format")
    m, n = out.shape
    k = a.shape[1] * (2 if operand.packed else 1)
    config = dot_scaled_config(m)
    if k % config.block_k:
        raise ValueError(f"K = {k} is not a multiple of BLOCK_K = {config.block_k}")
    key = (operand, config)
    if key in _DOT_SCALED_FAILURES:  # a failed compile fails again: do not pay (and print) it per row
        raise RuntimeError(_DOT_SCALED_FAILURES[key])
    if operand.scale == "ue4m3":
        a_scales, b_scales = a_scales.view(torch.float8_e4m3fn), b_scales.view(torch.float8_e4m3fn)
    kernels = triton_kernels()
    grid = (-(-m // config.block_m) * -(-n // config.block_n),)
    try:
        kernels.dot_scaled[grid](
            a, a_scales, b, b_scales, out, m, n, k,
            FORMAT=DOT_SCALED_FORMATS[operand.element], PACK=2 if operand.packed else 1, SCALE_GROUP=operand.group,
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=8,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )  # fmt: skip
    except Exception as e:
        _DOT_SCALED_FAILURES[key] = f"tl.dot_scaled ({operand.name}, {config}): {type(e).__name__}: {e}"
        raise
    return out


# (operand, config) -> why the kernel could not be built or launched. Triton 3.6 does not compile
# tl.dot_scaled with UE4M3 scales (NVFP4) for sm_90: an MLIR pass fails (checked ahead of time).
_DOT_SCALED_FAILURES: dict[tuple[Operand, DotScaledConfig], str] = {}


# ---- rotation of operand copies -----------------------------------------------------------------


def copies_for(nbytes: int, l2_bytes: int) -> int:
    """Copies to cycle through so that between two uses of one copy the others (>= L2 in all) have
    passed through the cache: 1 + ceil(L2 / bytes), at least 2."""
    return max(2, 1 + math.ceil(l2_bytes / max(nbytes, 1)))


def nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def rotation_copies(args: tuple[Tensor, ...], l2_bytes: int) -> list[tuple[Tensor, ...]]:
    """`args` and enough clones of them to defeat L2 (copies_for of their total size)."""
    return [args] + [tuple(t.clone() for t in args) for _ in range(copies_for(nbytes(*args), l2_bytes) - 1)]


class Rotation:
    """fn(*args) on the next copy of its arguments at each call, so no run finds its weight in L2."""

    def __init__(self, fn: Callable[..., Tensor], copies: list[tuple[Tensor, ...]]) -> None:
        self.fn, self.copies, self.calls = fn, copies, 0

    def __call__(self) -> Tensor:
        args = self.copies[self.calls % len(self.copies)]
        self.calls += 1
        return self.fn(*args)
