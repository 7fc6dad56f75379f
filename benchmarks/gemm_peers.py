"""The peers: what a user runs instead of the package, the rules every method is timed by, and the dense
GEMM grid of `benchmarks/peers.py gemm` that measures them beside ours. Each peer is an independent
implementation (none calls the package's kernels), checked against the reference on CPU by
tests/test_bench_gemm_helpers.py and against ours on every row of the grid.

- TorchDequant / dequant_mm: unpack nibbles, decode by table lookup, multiply by the scales gathered from
  the swizzled buffer through an index precomputed once, then cuBLAS bf16 (what torchao does off Blackwell).
- triton_dequant: one Triton kernel, packed operand + swizzled scales -> bf16, scale offsets computed in
  the kernel with the SfAtom formula; then cuBLAS bf16.
- triton_dot_scaled: Triton's tl.dot_scaled on plain [rows, K/g] scales (it upcasts in-kernel on Hopper).
- humming / humming_linear (W4A16 rows): humming-kernels' W4A16 GEMM (vLLM's and SGLang's), a HummingLayer
  loaded with our weight's bytes in its ModelOpt NVFP4 or MXFP4 checkpoint layout (humming_tensors).
  Imported on first use; JIT-compiled by NVRTC from the CUDA toolkit of torch's major version, which it
  finds by itself at /usr/local/cuda (else CUDA_HOME). Offline install of the wheels in .whl/humming/:
      python -m pip install --no-index --find-links .whl/humming humming-kernels
- rowwise_fp8 / scaled_mm_rowwise: torch._scaled_mm with row-wise float32 scales (rowwise_fp8_stacked
  for torch._scaled_grouped_mm): a different recipe, shown for the FP8 tensor-core ceiling.
- on_reference: the package's public function with its op run by the reference's PyTorch ops.

Timing: median_us (triton.testing.do_bench, which clears L2 before every run), and Rotation, which cycles
through copies of the weights (rotation_copies) so that a memory-bound run streams them from HBM.

Triton is imported on first use (triton_kernels(), median_us), so this module imports without Triton or
a GPU; the kernels are jitted at that moment, so TRITON_INTERPRET=1 set before the first call runs them
on CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from benchmark import (  # noqa: F401
    BF16,
    GEMM_OPERANDS,
    OPERANDS,
    Operand,
    Ours,
    mm_bt,
    nvfp4_alpha,
    ours_fn,
    ours_for,
    quantize,
)
from torch.utils._python_dispatch import TorchDispatchMode

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


def rowwise_fp8_stacked(x: Tensor) -> tuple[Tensor, Tensor]:
    """rowwise_fp8 of [rows, K], or of [E, rows, K] matrix by matrix (bounding the float32 copies), with
    the scales [rows] or [E, rows] that torch._scaled_grouped_mm takes."""
    if x.dim() == 3:
        parts = [rowwise_fp8_stacked(m) for m in x]
        return torch.stack([v for v, _ in parts]), torch.stack([s for _, s in parts])
    values, scale = rowwise_fp8(x)
    return values, scale.squeeze(-1)


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


# ---- humming-kernels' W4A16 (imported on first use) ----------------------------------------------

HUMMING_INSTALL = "python -m pip install --no-index --find-links .whl/humming humming-kernels"


def humming_tensors(
    values: Tensor, scales: Tensor, operand: Operand, global_scale: Tensor | None = None
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(tensors, weight_config) of our weight [N, K] in the checkpoint layout of humming's schema.

    The codes are our bytes as they are: humming views them as int32 words holding element i at bits
    4i..4i+3 (pack_weight.cuh), which on a little-endian device is ours, element 2i in a byte's low
    nibble. The scales are unswizzled to row-major [N, K/g]. NVFP4 (schema/modelopt.py): UE4M3 scales
    as float8_e4m3fn and the float32 global scale as weight_scale_2 (w = code * scale * weight_scale_2);
    MXFP4 (schema/mxfp4.py): the UE8M0 bytes as they are.
    """
    n, k = values.shape[0], 2 * values.shape[1]
    plain = plain_scales(scales, n, k // operand.group)
    tensors = {"weight": values.view(torch.uint8).contiguous()}
    if operand.name == "nvfp4":
        scale_2 = torch.ones(1) if global_scale is None else global_scale
        tensors |= {"weight_scale": plain.view(torch.float8_e4m3fn),
                    "weight_scale_2": scale_2.to(device=values.device, dtype=torch.float32).reshape(1)}  # fmt: skip
        return tensors, {"quant_method": "modelopt", "quant_algo": "nvfp4"}
    if operand.name == "mxfp4":
        return tensors | {"weight_scale": plain}, {"quant_method": "mxfp4"}
    raise NotImplementedError(f"no humming W4A16 peer for {operand.name} weights")


def humming_linear(
    values: Tensor, scales: Tensor, operand: Operand, global_scale: Tensor | None = None
) -> Callable[[Tensor, Tensor | None], Tensor]:
    """fn(x, out) -> out: humming's W4A16 GEMM out (bf16 [M, N]) = x (bf16 [M, K]) @ W^T, with W our
    quantized weight loaded into a HummingLayer (on the weight's GPU) and transformed there once."""
    if values.device.type != "cuda":
        raise RuntimeError("humming runs on a CUDA GPU only")
    try:
        from humming.layer import HummingLayer
    except ImportError as e:
        raise ImportError(f"humming-kernels is not installed ({HUMMING_INSTALL}): {e}") from e
    tensors, config = humming_tensors(values, scales, operand, global_scale)
    n, k = values.shape[0], 2 * values.shape[1]
    with torch.cuda.device(values.device):
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config=config, torch_dtype=torch.bfloat16)
        layer = layer.to(values.device)
        layer.load_from_tensors(tensors)
        layer.transform()  # repacks the weight into humming's layout (a copy)
    return lambda x, out=None: layer(x, outputs=out)


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


# ---- the same op with PyTorch ops ---------------------------------------------------------------


class _ReferenceOps(TorchDispatchMode):
    """Runs the package's registered ops with their reference implementations (PyTorch ops on the
    tensors' device) instead of its kernels."""

    def __init__(self, fp4) -> None:
        super().__init__()
        self.namespace, self.impls = fp4.ops.name, fp4._registry.REFERENCE_IMPLS

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == self.namespace:
            return self.impls[func._opname](*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def on_reference(fp4, function: Callable) -> Callable:
    """The public function with its op run by the reference on the GPU: the peer "the same op done
    with PyTorch ops" (the public function's own validation and allocation included)."""

    def call(*args: object, **kwargs: object) -> object:
        with _ReferenceOps(fp4):
            return function(*args, **kwargs)

    return call


# ---- timing and checks --------------------------------------------------------------------------


def median_us(fn: Callable[[], object], warmup: float = 25, rep: float = 200) -> float:
    """Median of CUDA-event timings (triton.testing.do_bench: L2 cleared before each run), microseconds."""
    import triton.testing

    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def relative_error(out: Tensor, expected: Tensor) -> float:
    """max |out - expected| / max |expected| in float32 (NaN anywhere gives NaN: a failed check)."""
    diff = (out.float() - expected.float()).abs().max()
    return float(diff / expected.float().abs().max().clamp(min=1e-30))


# ---- the dense GEMM grid: every peer, the engine's bf16 ceiling and ours on one row's operands ----

W4A16_FORMATS = ("w4a16-nvfp4", "w4a16-mxfp4")
FORMATS = ("mxfp8", "mxfp4", "nvfp4", "e0m3", *W4A16_FORMATS)
DEFAULT_FORMATS = ("mxfp8", "mxfp4", "nvfp4", *W4A16_FORMATS)
MS = (1, 16, 64, 256, 1024, 2048, 4096)
QUALIFICATION_SHAPES = ((17408, 5120), (5120, 17408), (12288, 5120), (8192, 8192))
EXPERT_SHAPES = ((4096, 7168), (7168, 2048))
SHAPES = QUALIFICATION_SHAPES + EXPERT_SHAPES
QUICK_MS, QUICK_SHAPES = (16, 256, 1024, 4096), ((17408, 5120), (4096, 7168))
DEFAULT_BUDGET_S = 220.0
PEERS = ("cublas_bf16", "scaled_mm_fp8_rowwise", "dequant_mm", "triton_dequant_mm", "triton_dot_scaled", "humming")
# max |peer - ours| / max |ours|. The exact peers (humming too: bf16 times the exactly decoded weight,
# fp32 accumulation) differ from ours only by fp32 summation order and the bf16 rounding of the output.
# The FP8 peer re-quantizes every element to 3 mantissa bits: 3.4-4.8% in a float64 emulation of these
# formats and K; a broken peer (a transposed or misread scale, a swapped nibble) is off by O(1).
CHECK_TOLERANCE = dict.fromkeys(PEERS, 1e-2) | {"scaled_mm_fp8_rowwise": 0.15}
CEILING = "engine_bf16_ceiling"
CEILING_BACKEND = "sm90_engine"
CEILING_TOLERANCE = 1e-2  # exact operands, as cublas_bf16
DEFAULT_L2_BYTES = 60 * 2**20
PEER_NOTES = {
    "cublas_bf16": "torch.mm(A_bf16, B_bf16.T), operands dequantized exactly once outside the timing",
    "scaled_mm_fp8_rowwise": "torch._scaled_mm e4m3 x e4m3, row-wise fp32 scales, use_fast_accum="
    f"{FP8_FAST_ACCUM}; operands re-quantized from the dequantized bf16 outside the timing",
    "dequant_mm": "PyTorch ops dequantize A (unless bf16) and B (table lookup, scale gather by a precomputed index), "
    "then torch.mm",
    "triton_dequant_mm": "one Triton kernel dequantizes A (unless bf16) then B to bf16 (SfAtom offsets in-kernel), "
    "then torch.mm",
    "triton_dot_scaled": "Triton tl.dot_scaled, plain [rows, K/g] scales, one untuned config per M range",
    "humming": "humming-kernels W4A16 (W4A16 rows only): HummingLayer on the same weight bytes in its ModelOpt "
    "NVFP4 / MXFP4 checkpoint layout (scales unswizzled, NVFP4 global scale = ours' alpha), transformed once "
    "outside the timing, its default tuning",
    CEILING: "not a peer: GemmCall(A_bf16, B_bf16, formats bf16 x bf16).run_on('sm90_engine') on the "
    "operands dequantized exactly once outside the timing: the Hopper engine's pipeline without a decode",
}


def dispatched_backend(fp4, fmt: str, ours: Ours, m: int, n: int, k: int, cc: int) -> str | None:
    """The backend dispatch gives our call of this shape on compute capability cc ("reference" = the
    PyTorch fallback): a host-side query, answered without a GPU; None if the build cannot say."""
    a_op, b_op = GEMM_OPERANDS[fmt]
    out_format = "fp16" if ours.out_dtype == torch.float16 else "bf16"
    alpha = ours.op == "dense_gemm" and b_op.name == "nvfp4"  # ours_fn passes dense_gemm's NVFP4 alpha tensor
    try:
        call = fp4._gemm.described_call(a_op.name, b_op.name, m=m, n=n, k=k, alpha=alpha, out_format=out_format)
        name = call.backend(cc)
    except Exception:  # an older or newer build without this query: say nothing rather than guess
        return None
    return name or "reference"


def ours_backend(fp4, fmt: str, ours: Ours, m: int, n: int, k: int) -> str | None:
    """Which backend serves this GEMM here, so a row never passes off the fallback's time as the engine's
    and the composition's rows (dense, from M = 768 or 1024 by format on sm_90) show as such."""
    if not torch.cuda.is_available():
        return "reference"
    major, minor = torch.cuda.get_device_capability()
    return dispatched_backend(fp4, fmt, ours, m, n, k, 10 * major + minor)


@dataclass
class Operands:
    """One matrix quantized by the package, and what the peers derive from it outside the timing."""

    operand: Operand
    values: Tensor
    scales: Tensor  # swizzled, in the shape the package returned
    bf16: Tensor  # exactly dequantized (the package's reference)
    plain: Tensor  # uint8 [rows, K/g] for tl.dot_scaled
    fp8: tuple[Tensor, Tensor]  # row-wise e4m3 values and float32 [rows, 1] scales of bf16

    @classmethod
    def make(cls, fp4, x: Tensor, operand: Operand, ours: Ours) -> Operands:
        values, scales = quantize(fp4, x, operand, ours)
        if not operand.quantized:  # W4A16's activations: every method reads x itself
            return cls(operand, values, scales, x, scales, rowwise_fp8(x))
        rows, k = x.shape
        fmt = fp4.reference.FORMATS[operand.name]
        bf16 = fp4.reference.dequantize(values, scales, fmt).to(torch.bfloat16)
        return cls(operand, values, scales, bf16, plain_scales(scales, rows, k // operand.group),
                   rowwise_fp8(bf16))  # fmt: skip


@dataclass
class Weight:
    """B in each form a method consumes, with its rotation copies: built once per format and shape."""

    q: Operands
    packed: list[tuple[Tensor, ...]]  # (values, swizzled scales): ours, dequant_mm, triton_dequant_mm
    bf16: list[tuple[Tensor, ...]]  # cublas_bf16
    fp8: list[tuple[Tensor, ...]]  # scaled_mm_fp8_rowwise
    plain: list[tuple[Tensor, ...]]  # triton_dot_scaled
    # humming: one layer per copy of `packed`, built by the first W4A16 row that asks (every M of the
    # block shares them); or why they could not be built, which every later row would hit again
    humming: list[tuple[Callable[[Tensor, Tensor | None], Tensor]]] | str | None = None

    @classmethod
    def make(cls, q: Operands, l2_bytes: int) -> Weight:
        return cls(
            q,
            rotation_copies((q.values, q.scales), l2_bytes),
            rotation_copies((q.bf16,), l2_bytes),
            rotation_copies(q.fp8, l2_bytes),
            rotation_copies((q.values, q.plain), l2_bytes),
        )


def peer_fns(fmt: str, a: Operands, w: Weight, out: Tensor) -> dict[str, Callable[[], Callable[[], Tensor]]]:
    """Per peer, a builder of its timed callable (building may raise: the peer is then recorded null)."""
    a_op, b_op = GEMM_OPERANDS[fmt]
    m, k = a.bf16.shape
    n = w.q.bf16.shape[0]
    device = a.bf16.device

    def cublas() -> Callable[[], Tensor]:
        return Rotation(lambda b: mm_bt(a.bf16, b, out), w.bf16)

    def fp8() -> Callable[[], Tensor]:
        return Rotation(lambda b, bs: scaled_mm_rowwise(*a.fp8, b, bs), w.fp8)

    def dequant_mm() -> Callable[[], Tensor]:
        deq_b = TorchDequant.build(b_op, n, k, device)
        if not a_op.quantized:  # W4A16: only the weight is decoded
            return Rotation(lambda b, sfb: mm_bt(a.bf16, deq_b(b, sfb), out), w.packed)
        deq_a = TorchDequant.build(a_op, m, k, device)
        return Rotation(lambda b, sfb: mm_bt(deq_a(a.values, a.scales), deq_b(b, sfb), out), w.packed)

    def triton_dequant_mm() -> Callable[[], Tensor]:
        a_bf16 = torch.empty(m, k, dtype=torch.bfloat16, device=device) if a_op.quantized else a.bf16
        b_bf16 = torch.empty(n, k, dtype=torch.bfloat16, device=device)

        def run(b: Tensor, sfb: Tensor) -> Tensor:
            if a_op.quantized:
                triton_dequant(a.values, a.scales, a_op, a_bf16)
            return mm_bt(a_bf16, triton_dequant(b, sfb, b_op, b_bf16), out)

        return Rotation(run, w.packed)

    def dot_scaled() -> Callable[[], Tensor]:
        if a_op != b_op:
            raise NotImplementedError(f"one format for both operands only, not {a_op.name} x {b_op.name}")
        return Rotation(lambda b, bs: triton_dot_scaled(a.values, a.plain, b, bs, b_op, out), w.plain)

    def humming() -> Callable[[], Tensor]:
        return Rotation(lambda layer: layer(a.bf16, out), humming_layers(w, b_op, fmt))

    builders = (cublas, fp8, dequant_mm, triton_dequant_mm, dot_scaled, humming)
    fns = dict(zip(PEERS, builders, strict=True))
    if fmt not in W4A16_FORMATS:  # humming's FP4 x FP4 and FP8 paths need sm_100+ or are another recipe
        del fns["humming"]
    return fns


def humming_layers(w: Weight, b_op: Operand, fmt: str) -> list[tuple[Callable[[Tensor, Tensor | None], Tensor]]]:
    """w.humming, built on the first call: humming_linear of each rotation copy of the weight, NVFP4 with
    the global scale ours gets as alpha. A failure is kept and raised again (a JIT error, a missing
    install): each row of the block records it without paying for it again."""
    if w.humming is None:
        try:
            w.humming = [(humming_linear(values, scales, b_op, nvfp4_alpha(fmt, values.device)),)
                         for values, scales in w.packed]  # fmt: skip
        except Exception as e:
            w.humming = error_text(e)
            raise
    if isinstance(w.humming, str):
        raise RuntimeError(w.humming)
    return w.humming


def ceiling_call(fp4, a_bf16: Tensor, b_bf16: Tensor, out: Tensor) -> tuple:
    """The `gemm` op's call (an fp4._gemm.GemmCall) of a plain bf16 GEMM out = A_bf16 @ B_bf16^T."""
    no_scales = torch.empty(0, dtype=torch.uint8, device=a_bf16.device)
    return fp4._gemm.GemmCall(a_bf16, b_bf16, None, no_scales, "bf16", "bf16", out=out)


def ceiling_fn(fp4, a: Operands, w: Weight, out: Tensor, device: str) -> Callable[[], Tensor]:
    """The engine's bf16 ceiling on this row's operands, B's bf16 copies rotated as for cublas_bf16.

    On the GPU the engine runs by name (GemmCall.run_on), wherever dispatch would send the call; the CPU
    dry run has no engine, so there the op's dispatch (the reference) runs it."""
    calls = [(ceiling_call(fp4, a.bf16, b, out),) for (b,) in w.bf16]

    def run(call) -> Tensor:
        if device == "cuda":
            call.run_on(CEILING_BACKEND)
        else:
            call.run()
        return out

    return Rotation(run, calls)


def error_text(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:300]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def grid_median_us(fn: Callable[[], object], device: str) -> float:
    """Median time of fn in microseconds.

    CUDA: median_us with warm-up and repetition windows scaled to one run's time, so that big shapes take
    a few runs and small ones a hundred: the full grid must fit a few minutes. CPU (the dry run): a
    handful of wall-clock runs.
    """
    if device != "cuda":
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e6 * sorted(times)[1]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    once_ms = start.elapsed_time(end)
    return median_us(fn, warmup=min(max(3 * once_ms, 1.0), 25.0), rep=min(max(30 * once_ms, 10.0), 100.0))


def measure_checked(
    name: str,
    build: Callable[[], Callable[[], Tensor]],
    tolerance: float,
    expected: Tensor | None,
    device: str,
    times: dict[str, float | None],
    checks: dict[str, dict],
    notes: dict[str, str],
) -> None:
    """One method's output checked against ours, then its median time; a method that cannot run this
    case (format, OOM, compile error) is recorded null with the reason in notes."""
    times[name], got = None, None
    try:
        fn = build()
        got = fn()
        sync(device)
        if expected is not None:
            err = relative_error(got, expected)
            checks[name] = {"rel_err": err if math.isfinite(err) else str(err), "ok": err <= tolerance}
            if not checks[name]["ok"]:
                notes[name] = f"check failed: rel err {err:.3g} > {tolerance}"
        times[name] = grid_median_us(fn, device)
    except Exception as e:
        notes[name] = error_text(e)
    del got


def measure_row(fp4, fmt: str, ours: Ours, a: Operands, w: Weight, device: str) -> dict:
    m, k = a.bf16.shape
    n = w.q.bf16.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)  # shared by the peers and the ceiling
    ours_out = torch.empty(m, n, dtype=ours.out_dtype, device=device)
    ours_call = Rotation(ours_fn(fp4, ours, fmt, a.values, a.scales, ours_out), w.packed)
    times: dict[str, float | None] = {}
    checks: dict[str, dict] = {}
    notes: dict[str, str] = {}
    try:
        expected = ours_call().clone()  # untimed: the output every peer is checked against
        sync(device)
    except Exception as e:
        expected, notes["ours"] = None, error_text(e)
    for name, build in peer_fns(fmt, a, w, out).items():
        measure_checked(name, build, CHECK_TOLERANCE[name], expected, device, times, checks, notes)
    if len(checks) > 1 and not any(c["ok"] for c in checks.values()):
        notes["ours"] = "every peer disagrees with ours: ours is the likely culprit (no ratio is reported)"
    measure_checked(CEILING, lambda: ceiling_fn(fp4, a, w, out, device), CEILING_TOLERANCE, expected, device,
                    times, checks, notes)  # fmt: skip
    times["ours"] = grid_median_us(ours_call, device) if expected is not None else None
    return make_row(ours.op, fmt, m, n, k, times, checks, notes, ours_backend(fp4, fmt, ours, m, n, k))


def make_row(
    op: str,
    fmt: str,
    m: int,
    n: int,
    k: int,
    times: dict[str, float | None],
    checks: dict[str, dict],
    notes: dict[str, str],
    backend: str | None,
) -> dict:
    """The JSON row: times in us, our TFLOP/s, ratio_vs_X = X's time / ours, and the engine's bf16 ceiling
    with its ratio to cuBLAS bf16 (a ratio is null unless the methods in it passed their checks)."""
    ours_us = times.get("ours")
    row = {"op": op, "format": fmt, "M": m, "N": n, "K": k, "ours_backend": backend}
    row["ours_us"] = round(ours_us, 2) if ours_us else None
    for name in PEERS:
        row[f"{name}_us"] = round(times[name], 2) if times.get(name) else None
    row["tflops"] = round(2 * m * n * k / ours_us / 1e6, 2) if ours_us else None
    for name in PEERS:
        row[f"ratio_vs_{name}"] = ratio(times, checks, name, ours_us)
    row["ratio_vs_fp8_rowwise"] = row["ratio_vs_scaled_mm_fp8_rowwise"]
    ceiling_us = times.get(CEILING) if passed(checks, CEILING) else None
    row[f"{CEILING}_us"] = round(times[CEILING], 2) if times.get(CEILING) else None
    row[f"{CEILING}_ratio_vs_cublas_bf16"] = ratio(times, checks, "cublas_bf16", ceiling_us)
    row["peer_check"] = {name: checks.get(name) for name in (*PEERS, CEILING)}
    row["notes"] = notes
    return row


def passed(checks: dict[str, dict], name: str) -> bool:
    return (checks.get(name) or {}).get("ok", False)


def ratio(times: dict[str, float | None], checks: dict[str, dict], name: str, base_us: float | None) -> float | None:
    """name's time / base_us, rounded; null without both times or when name failed (or skipped) its check."""
    if not base_us or not times.get(name) or not passed(checks, name):
        return None
    return round(times[name] / base_us, 3)


def l2_bytes(device: str) -> int:
    if device != "cuda":
        return DEFAULT_L2_BYTES
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or DEFAULT_L2_BYTES


@dataclass(frozen=True)
class Block:
    """The rows that share one quantized weight: a format and (N, K), every M."""

    fmt: str
    n: int
    k: int

    def name(self) -> str:
        return f"{self.fmt} {self.n}x{self.k}"


def run_block(fp4, block: Block, ms: list[int], nvfp4_op: str, device: str, cache: int, start: float) -> list[dict]:
    ours = ours_for(block.fmt, nvfp4_op)
    a_op, b_op = GEMM_OPERANDS[block.fmt]
    torch.manual_seed(0)
    # weight-like B (std 0.02) and unit activations; the values only matter for the checks
    b = 0.02 * torch.randn(block.n, block.k, device=device, dtype=torch.bfloat16)
    w = Weight.make(Operands.make(fp4, b, b_op, ours), cache)
    rows = []
    for m in ms:
        a = Operands.make(fp4, torch.randn(m, block.k, device=device, dtype=torch.bfloat16), a_op, ours)
        rows.append(measure_row(fp4, block.fmt, ours, a, w, device))
        print(progress_line(rows[-1], time.perf_counter() - start), flush=True)
        del a
    return rows


def run_grid(
    fp4,
    grid: list[Block],
    ms: list[int],
    nvfp4_op: str,
    device: str,
    budget_s: float,
    save: Callable[[list[dict], list[str]], None],
) -> tuple[list[dict], list[str]]:
    """(rows, names of the blocks not run). No block starts after budget_s seconds (device time is
    scarce); `save` gets the rows so far after each block, so a run cut short still leaves its
    measurements on disk."""
    rows: list[dict] = []
    not_run: list[str] = []
    cache = l2_bytes(device)
    start = time.perf_counter()
    for block in grid:
        if time.perf_counter() - start > budget_s:
            not_run.append(block.name())
            continue
        rows += run_block(fp4, block, ms, nvfp4_op, device, cache, start)
        if device == "cuda":
            torch.cuda.empty_cache()
        save(rows, not_run)
    if not_run:
        print(f"budget of {budget_s:.0f} s spent: not run {', '.join(not_run)}", flush=True)
    return rows, not_run


def progress_line(row: dict, elapsed_s: float) -> str:
    def cell(name: str, key: str) -> str:
        value = row[key]
        return f"{name}={value:.2f}x" if value is not None else f"{name}=-"

    ours = f"{row['ours_us']:.1f} us" if row["ours_us"] else "-"
    warning = f"  OURS: {row['notes']['ours']}" if "ours" in row["notes"] else ""
    ratios = [cell(p, f"ratio_vs_{p}") for p in PEERS] + [cell(f"{CEILING}/cublas", f"{CEILING}_ratio_vs_cublas_bf16")]
    return (
        f"[{elapsed_s:6.0f} s] {row['format']:5s} M={row['M']:<5d} N={row['N']:<5d} K={row['K']:<5d} "
        f"ours {ours} ({row['ours_backend']}) " + " ".join(ratios) + warning
    )


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__
