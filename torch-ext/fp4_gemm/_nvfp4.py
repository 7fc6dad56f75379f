"""The flashrt-style NVFP4 API: quantizers, dequantizer, GEMMs with fused epilogues, the decode tiers.

Conventions shared by every function here (docs/API.md has the full table):
- A matrix [rows, K] is stored as packed E2M1 uint8 [rows, K/2] (element 2i in the low nibble) plus a
  flat uint8 scale buffer of sfa_size_bytes(rows, K) bytes: UE4M3 per 16 elements in the CUTLASS
  Sm1xx SfAtom layout. `is_sfb` is accepted for compatibility and does not change the layout.
- GEMMs compute out = epilogue(alpha * A @ B^T) with A [M, K] and B [N, K]; alpha is a Python float.
- `packed`/`sfa`/`out`/`out_packed`/`out_sfa` are optional caller buffers, checked then written.
- NVFP4 outputs are (packed [M, N_out/2], scales of sfa_size_bytes(M, N_out)); `_fp16` in a name
  means the result is rounded to fp16 before it is re-quantized.
- `variant` (flashrt's ids 7 and 10 included, as hints), `warps` and `stages` pick how a kernel
  runs; `skinny`, `scratch` and `workspace` are the seed API's and unused (`workspace` is checked).
  None of them changes the result.
- Each function validates its arguments, allocates what it returns unless given, and runs one
  registered op: the GEMMs one GemmCall (_gemm.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from . import _validate, reference
from ._gemm import GemmCall, gemm_outputs, op_entry, packed_outputs
from ._ops import ops

Tensor = torch.Tensor
OptTensor = torch.Tensor | None


# ---- quantizers -------------------------------------------------------------------------------


def _quantize(x: Tensor, recipe: str, rows: int, cols: int, packed: OptTensor, sfa: OptTensor) -> tuple[Tensor, Tensor]:
    if packed is None:
        packed, sfa = packed_outputs(rows, cols, x.device)
    ops.quantize(x, recipe, True, True, packed, sfa)
    return packed, sfa


def quantize_fp4_sfa_fp16(
    x: Tensor, packed: OptTensor = None, sfa: OptTensor = None, is_sfb: bool = False
) -> tuple[Tensor, Tensor]:
    """NVFP4 of a float16 [rows, K] matrix (K % 16 == 0): (packed [rows, K/2], flat SfAtom scales)."""
    _validate.fp4_quantizer(x, torch.float16, packed, sfa)
    return _quantize(x, "nvfp4", *x.shape, packed, sfa)


def quantize_fp4_sfa_bf16(
    x: Tensor, packed: OptTensor = None, sfa: OptTensor = None, is_sfb: bool = False
) -> tuple[Tensor, Tensor]:
    """NVFP4 of a bfloat16 [rows, K] matrix, read directly (no cast): (packed, flat SfAtom scales)."""
    _validate.fp4_quantizer(x, torch.bfloat16, packed, sfa)
    return _quantize(x, "nvfp4", *x.shape, packed, sfa)


def quantize_fp4_sfa_mse_fp16(
    x: Tensor, packed: OptTensor = None, sfa: OptTensor = None, is_sfb: bool = False
) -> tuple[Tensor, Tensor]:
    """NVFP4 of float16 with each block's scale chosen by least squared error among the RTN scale code
    and its neighbours (RTN code -1, +1, -2, +2): per block never worse than quantize_fp4_sfa_fp16."""
    _validate.fp4_quantizer(x, torch.float16, packed, sfa)
    return _quantize(x, "nvfp4_mse", *x.shape, packed, sfa)


def quantize_fp4_sfa_mse_bf16(
    x: Tensor, packed: OptTensor = None, sfa: OptTensor = None, is_sfb: bool = False
) -> tuple[Tensor, Tensor]:
    """quantize_fp4_sfa_mse_fp16 for bfloat16 input."""
    _validate.fp4_quantizer(x, torch.bfloat16, packed, sfa)
    return _quantize(x, "nvfp4_mse", *x.shape, packed, sfa)


def aligned_fp4_dim(dim: int, alignment: int = 32) -> int:
    """The physical width of a logical FP4 GEMM dimension: dim rounded up to a multiple of alignment (a
    positive multiple of 16), what quantize_fp4_sfa_padded_bf16 and pack_nvfp4_weight_bf16 pad to."""
    _validate.positive_int("dim", dim)
    _validate.alignment(alignment)
    return _validate.aligned_dim(dim, alignment)


def padded_bias(bias: OptTensor, rows: int) -> OptTensor:
    """bias zero-padded to `rows` entries (None stays None)."""
    if bias is None:
        return None
    out = torch.zeros(rows, dtype=bias.dtype, device=bias.device)
    out[: bias.numel()] = bias
    return out


def quantize_fp4_sfa_padded_bf16(x: Tensor, *, alignment: int = 32, is_sfb: bool = False) -> tuple[Tensor, Tensor, int]:
    """NVFP4 of a bfloat16 [rows, K] matrix zero-padded to K' = ceil(K / alignment) * alignment (the
    kernel reads with bounds; no padded copy). Returns (packed [rows, K'/2], scales of
    sfa_size_bytes(rows, K'), K). Bind-time helper: it allocates."""
    _validate.padded_quantizer(x, alignment)
    rows, logical = x.shape
    packed, sfa = _quantize(x, "nvfp4", rows, _validate.aligned_dim(logical, alignment), None, None)
    return packed, sfa, logical


def pack_nvfp4_weight_bf16(
    weight: Tensor, bias: OptTensor = None, *, alignment: int = 32, mse: bool = False
) -> tuple[Tensor, Tensor, OptTensor, tuple[int, int]]:
    """Pack a logical bfloat16 weight [N, K] at bind time, zero-padding both N and K up to `alignment`.

    Returns (packed [N', K'/2], sfb of sfa_size_bytes(N', K'), bias zero-padded to [N'] or None,
    (N, K)). `mse` picks the least-squares scales of quantize_fp4_sfa_mse_bf16.
    """
    _validate.pack_weight(weight, bias, alignment, mse)
    n, k = weight.shape
    rows, cols = _validate.aligned_dim(n, alignment), _validate.aligned_dim(k, alignment)
    packed, sfb = _quantize(weight, "nvfp4_mse" if mse else "nvfp4", rows, cols, None, None)
    return packed, sfb, padded_bias(bias, rows), (n, k)


def quantize_e0m3_sfa_fp16(
    x: Tensor, packed: OptTensor = None, sfa: OptTensor = None, is_sfb: bool = False
) -> tuple[Tensor, Tensor]:
    """E0M3 (integers -7..7) of a float16 [rows, K] matrix with UE4M3 scales per 16 (sf = amax / 7)."""
    _validate.fp4_quantizer(x, torch.float16, packed, sfa)
    return _quantize(x, "e0m3", *x.shape, packed, sfa)


def dequantize_fp4_sfa_fp16(packed: Tensor, sfa: Tensor, out: OptTensor = None, is_sfb: bool = False) -> Tensor:
    """Exact float16 [rows, K] of packed NVFP4 [rows, K/2] and its flat SfAtom scales (NaN scale -> NaN)."""
    _validate.dequantizer(packed, sfa, out)
    if out is None:
        out = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.float16, device=packed.device)
    ops.dequantize(packed, sfa, "nvfp4", True, out)
    return out


# ---- GEMMs ------------------------------------------------------------------------------------


class _Kind(NamedTuple):
    """What the name of a flashrt-style GEMM fixes: its GemmCall fields other than the tensors, alpha
    and the knobs, and the optional tensors it requires. Called through _validate.checked on a call's
    metadata (the kind is then one part of the key, not six; whether bias and residual are given is
    another, so their requirement is checked once per key; the variant as given, so its rule and
    flashrt's ids too): the rules' M and N_out, the op's packed fields of the call's GemmCall
    (GemmCall.codes) and the op's entry (op_entry), which the call remembers."""

    activation: str = "none"
    out_format: str = "bf16"
    a_format: str = "nvfp4"
    b_format: str = "nvfp4"
    b_interleaved: bool = False
    schedule: str = "auto"
    requires: tuple[str, ...] = ()  # the optional tensors ("bias", "residual") the function requires
    auto_variant: bool = True  # whether variant -1 (chosen by shape) is accepted

    def __call__(
        self,
        a: Tensor,
        b: Tensor,
        sfa: Tensor,
        sfb: Tensor,
        bias: OptTensor,
        residual: OptTensor,
        out: OptTensor,
        out_scales: OptTensor,
        workspace: OptTensor,
        tier_rules: Callable[[object, object, object, object], None] | None,
        warps: int,
        stages: int,
        variant: int,
    ) -> tuple[int, int, tuple[int, int], Callable[..., None]]:
        given = {"bias": bias, "residual": residual}
        _validate.required(**{name: given[name] for name in self.requires})
        variant = _validate.variant(variant, allow_auto=self.auto_variant)
        m, n_out, _ = _validate.nvfp4_gemm_rules(
            a, b, sfa, sfb, bias, residual, self.activation, self.out_format, out, out_scales, tier_rules, warps, stages
        )  # fmt: skip
        if self.schedule == "m256":
            _validate.m256_rules(a, workspace, _m256_workspace_bytes(m, n_out))
        call = GemmCall(
            a, b, sfa, sfb, self.a_format, self.b_format, self.b_interleaved, activation=self.activation,
            out_format=self.out_format, schedule=self.schedule, variant=variant, warps=warps, stages=stages,
        )  # fmt: skip
        return m, n_out, call.codes(), op_entry()


def _nvfp4_gemm(
    kind: _Kind,
    a: Tensor,
    b: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float,
    bias: OptTensor = None,
    residual: OptTensor = None,
    out: OptTensor = None,
    out_scales: OptTensor = None,
    workspace: OptTensor = None,
    tier: tuple = (None, 0, 0),
    variant: int = -1,
) -> Tensor | tuple[Tensor, Tensor]:
    """Every flashrt-style GEMM: validated, its output allocated unless given, one GemmCall run.
    `workspace`: the M >= 512 tier's (its kind's schedule "m256"); `tier`: a decode tier's rules and
    knobs, (_validate.mrows, gemv or gemv_standard, warps, stages)."""
    m, n_out, (kind_code, knobs), run = _validate.checked(
        kind, a, b, sfa, sfb, bias, residual, out, out_scales, workspace, *tier, variant
    )
    alpha = _validate.nvfp4_gemm_buffers(alpha, a, b, sfa, sfb, bias, residual, out, out_scales)
    if workspace is not None:
        _validate.m256_buffers(workspace, (a, b, sfa, sfb, out))
    if out is None:
        out, out_scales = gemm_outputs(m, n_out, kind.out_format, a.device)
    run(a, b, sfa, sfb, None, None, bias, residual, out, out_scales, kind_code, alpha, knobs)
    return out if out_scales is None else (out, out_scales)


# The kinds of the functions below.
_BF16 = _Kind()
_EXPLICIT_VARIANT = _Kind(auto_variant=False)
_FP16 = _Kind(out_format="fp16")
_STREAMK = _Kind(schedule="streamk")
_STREAMK_BIAS = _Kind(schedule="streamk", requires=("bias",))
_BIAS = _Kind(requires=("bias",))
_RESIDUAL = _Kind(requires=("residual",))
_BIAS_RESIDUAL = _Kind(requires=("bias", "residual"))
_BIAS_RESIDUAL_FP16 = _Kind(out_format="fp16", requires=("bias", "residual"))
_BIAS_GELU = _Kind(activation="gelu", requires=("bias",))
_NVFP4 = _Kind(out_format="nvfp4")
_RELU2_NVFP4 = _Kind(activation="relu2", out_format="nvfp4")
_BIAS_GELU_NVFP4 = _Kind(activation="gelu", out_format="nvfp4", requires=("bias",))
_BIAS_GELU_NVFP4_FROM_FP16 = _Kind(activation="gelu", out_format="nvfp4_from_fp16", requires=("bias",))
_GEGLU_NVFP4_FROM_FP16 = _Kind(activation="geglu", out_format="nvfp4_from_fp16")
_E0M3 = {a_format: _Kind(out_format="fp16", a_format=a_format, b_format="e0m3") for a_format in ("nvfp4", "e0m3")}
_INTERLEAVED = _Kind(b_interleaved=True)
_M256 = _Kind(schedule="m256")


def nvfp4_gemm_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    alpha: float = 1.0,
    out: OptTensor = None,
    variant: int = -1,
) -> Tensor:
    """out = alpha * A @ B^T, bfloat16 [M, N]."""
    return _nvfp4_gemm(_BF16, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out, variant=variant)


def nvfp4_gemm_fp16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    alpha: float = 1.0,
    out: OptTensor = None,
    variant: int = -1,
) -> Tensor:
    """out = alpha * A @ B^T, float16 [M, N]."""
    return _nvfp4_gemm(_FP16, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out, variant=variant)


def nvfp4_gemm_variant_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    alpha: float = 1.0,
    out: OptTensor = None,
    variant: int = 0,
) -> Tensor:
    """nvfp4_gemm_bf16 on an explicit schedule: variant is one of capabilities()['variants'] other than -1,
    or a flashrt schedule id (7, 10: hints that run the automatic choice)."""
    return _nvfp4_gemm(_EXPLICIT_VARIANT, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out, variant=variant)


def fp4_w4a16_linear_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    alpha: float = 1.0,
    out: OptTensor = None,
    variant: int = -1,
) -> Tensor:
    """Compatibility alias of nvfp4_gemm_bf16 (both operands are NVFP4, despite the name)."""
    return nvfp4_gemm_bf16(a_packed, b_packed, sfa, sfb, alpha, out, variant)


def nvfp4_gemm_streamk_bf16(
    a_packed: Tensor, b_packed: Tensor, sfa: Tensor, sfb: Tensor, alpha: float = 1.0, out: OptTensor = None
) -> Tensor:
    """nvfp4_gemm_bf16 on a stream-K schedule (same result)."""
    return _nvfp4_gemm(_STREAMK, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out)


def nvfp4_gemm_streamk_bias_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    bias: Tensor,
    alpha: float = 1.0,
    out: OptTensor = None,
) -> Tensor:
    """out = alpha * A @ B^T + bias on a stream-K schedule; bias [N] bf16/fp16/fp32."""
    return _nvfp4_gemm(_STREAMK_BIAS, a_packed, b_packed, sfa, sfb, alpha=alpha, bias=bias, out=out)


def nvfp4_gemm_bias_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    bias: Tensor,
    *,
    alpha: float = 1.0,
    out: OptTensor = None,
) -> Tensor:
    """out = alpha * A @ B^T + bias, bfloat16 [M, N]; bias [N] bf16/fp16/fp32."""
    return _nvfp4_gemm(_BIAS, a_packed, b_packed, sfa, sfb, alpha=alpha, bias=bias, out=out)


def nvfp4_gemm_residual_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    residual: Tensor,
    alpha: float = 1.0,
    out: OptTensor = None,
) -> Tensor:
    """out = alpha * A @ B^T + residual; residual bfloat16 [M, N]."""
    return _nvfp4_gemm(_RESIDUAL, a_packed, b_packed, sfa, sfb, alpha=alpha, residual=residual, out=out)


def nvfp4_gemm_bias_residual_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    bias: Tensor,
    residual: Tensor,
    *,
    alpha: float = 1.0,
    out: OptTensor = None,
) -> Tensor:
    """out = alpha * A @ B^T + bias + residual, bfloat16 [M, N]."""
    return _nvfp4_gemm(_BIAS_RESIDUAL, a_packed, b_packed, sfa, sfb, alpha=alpha, bias=bias, residual=residual, out=out)


def nvfp4_gemm_bias_residual_fp16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    bias: Tensor,
    residual: Tensor,
    *,
    alpha: float = 1.0,
    out: OptTensor = None,
) -> Tensor:
    """out = alpha * A @ B^T + bias + residual, float16 [M, N]; residual float16 [M, N]."""
    return _nvfp4_gemm(
        _BIAS_RESIDUAL_FP16, a_packed, b_packed, sfa, sfb, alpha=alpha, bias=bias, residual=residual, out=out
    )


def nvfp4_gemm_bias_gelu_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    bias: Tensor,
    alpha: float = 1.0,
    out: OptTensor = None,
) -> Tensor:
    """out = gelu(alpha * A @ B^T + bias) (exact erf GELU), bfloat16 [M, N]."""
    return _nvfp4_gemm(_BIAS_GELU, a_packed, b_packed, sfa, sfb, alpha=alpha, bias=bias, out=out)


def nvfp4_gemm_nvfp4(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    out_packed: OptTensor = None,
    out_sfa: OptTensor = None,
) -> tuple[Tensor, Tensor]:
    """NVFP4 of alpha * A @ B^T (float32 result quantized): (packed [M, N/2], scales); N % 16 == 0."""
    return _nvfp4_gemm(_NVFP4, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out_packed, out_scales=out_sfa)


def nvfp4_gemm_relu2_nvfp4(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    out_packed: OptTensor = None,
    out_sfa: OptTensor = None,
) -> tuple[Tensor, Tensor]:
    """NVFP4 of relu(alpha * A @ B^T)^2."""
    return _nvfp4_gemm(_RELU2_NVFP4, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out_packed, out_scales=out_sfa)


def nvfp4_gemm_bias_gelu_nvfp4(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    bias: Tensor,
    alpha: float = 1.0,
    out_packed: OptTensor = None,
    out_sfa: OptTensor = None,
) -> tuple[Tensor, Tensor]:
    """NVFP4 of gelu(alpha * A @ B^T + bias) (float32 result quantized)."""
    return _nvfp4_gemm(
        _BIAS_GELU_NVFP4, a_packed, b_packed, sfa, sfb, alpha=alpha, bias=bias, out=out_packed, out_scales=out_sfa
    )


def nvfp4_gemm_bias_gelu_nvfp4_fp16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    bias: Tensor,
    *,
    alpha: float = 1.0,
    out_packed: OptTensor = None,
    out_sfa: OptTensor = None,
) -> tuple[Tensor, Tensor]:
    """NVFP4 of gelu(alpha * A @ B^T + bias) rounded to fp16 first; bias [N] (fp16 in the seed API)."""
    kind = _BIAS_GELU_NVFP4_FROM_FP16
    return _nvfp4_gemm(kind, a_packed, b_packed, sfa, sfb, alpha=alpha, bias=bias, out=out_packed, out_scales=out_sfa)


def nvfp4_gemm_geglu_nvfp4_fp16(
    a_packed: Tensor,
    b_interleaved_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    skinny: bool = False,
    scratch: OptTensor = None,
    out_packed: OptTensor = None,
    out_sfa: OptTensor = None,
) -> tuple[Tensor, Tensor]:
    """GeGLU over an interleaved weight: B row 2j is gate j, row 2j+1 is up j; y = alpha * A @ B^T,
    out[:, j] = gelu(y[:, 2j]) * y[:, 2j+1], rounded to fp16, then NVFP4: (packed [M, N/4], scales of
    sfa_size_bytes(M, N/2)). `skinny` (the seed API's schedule choice) and `scratch` are accepted and
    have no effect: the staged backend serves GeGLU at every M."""
    return _nvfp4_gemm(
        _GEGLU_NVFP4_FROM_FP16, a_packed, b_interleaved_packed, sfa, sfb, alpha=alpha, out=out_packed,
        out_scales=out_sfa,
    )  # fmt: skip


def cutlass_fp4_gemm_geglu_il_hw_v10(
    a_packed: Tensor,
    b_interleaved_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    scratch: OptTensor = None,
    out_packed: OptTensor = None,
    out_sfa: OptTensor = None,
) -> tuple[Tensor, Tensor]:
    """nvfp4_gemm_geglu_nvfp4_fp16 with skinny=True (the seed API's name for that schedule)."""
    return nvfp4_gemm_geglu_nvfp4_fp16(
        a_packed,
        b_interleaved_packed,
        sfa,
        sfb,
        alpha=alpha,
        skinny=True,
        scratch=scratch,
        out_packed=out_packed,
        out_sfa=out_sfa,
    )


def e0m3_weight_gemm_fp16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    a_format: int = 1,
    out: OptTensor = None,
) -> Tensor:
    """out = alpha * A @ B^T, float16 [M, N], with E0M3 weights B (quantize_e0m3_sfa_fp16) and
    activations A in E2M1 (a_format=1, NVFP4) or E0M3 (a_format=0)."""
    a_fmt = _validate.e0m3_a_format(a_format)
    return _nvfp4_gemm(_E0M3[a_fmt], a_packed, b_packed, sfa, sfb, alpha=alpha, out=out)


# ---- decode and large-M tiers -----------------------------------------------------------------


def fp4_repack_b_interleaved_sm120(b_packed: Tensor, *, out: OptTensor = None) -> Tensor:
    """Repack a packed NVFP4 weight [N, K/2] (N % 8 == 0, K % 64 == 0) once, at bind time, into the
    streaming layout of fp4_w4a4_gemv_warpsplit_interleaved_bf16: same shape and dtype, tiles of
    8 rows x 64 elements (8 x 32 bytes) stored contiguously, K-tile fastest. Runs on every arch."""
    _validate.repack(b_packed, out)
    out = torch.empty_like(b_packed) if out is None else out
    ops.repack(b_packed, out)
    return out


def fp4_w4a4_gemv_warpsplit_interleaved_bf16(
    a_packed: Tensor,
    b_interleaved: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    warps: int = 8,
    stages: int = 3,
    out: OptTensor = None,
) -> Tensor:
    """M = 1 decode GEMV over a repacked weight: out = alpha * a @ B^T, bfloat16 [1, N]; sfb is the
    original weight's scales. warps in {2, 4, 8}, stages in [1, 8]."""
    return _nvfp4_gemm(
        _INTERLEAVED, a_packed, b_interleaved, sfa, sfb, alpha=alpha, out=out, tier=(_validate.gemv, warps, stages)
    )


def fp4_w4a4_gemm_warpsplit_mrows_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    warps: int = 2,
    stages: int = 6,
    out: OptTensor = None,
) -> Tensor:
    """Speculative-verify tier on the standard layout: 1 <= M <= 16, N % 8 == 0, K % (64 * warps) == 0,
    warps in {2, 4, 8}. out = alpha * A @ B^T, bfloat16 [M, N]."""
    return _nvfp4_gemm(_BF16, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out, tier=(_validate.mrows, warps, stages))


def nvfp4_gemm_m256_workspace_size(a_packed: Tensor, b_packed: Tensor, sfa: Tensor, sfb: Tensor) -> int:
    """Workspace bytes of nvfp4_gemm_m256_bf16 for these shapes. Allocate it once, before graph capture."""
    m, n, _ = _validate.nvfp4_gemm(a_packed, b_packed, sfa, sfb, 1.0, None, None, "none", "bf16", None, None)
    return _m256_workspace_bytes(m, n)


def _m256_workspace_bytes(m: int, n: int) -> int:
    tiles = -(-m // 128) * -(-n // 128)  # one int32 counter per 128 x 128 tile
    return -(-4 * tiles // 256) * 256


def nvfp4_gemm_m256_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    workspace: OptTensor = None,
    alpha: float = 1.0,
    out: OptTensor = None,
) -> Tensor:
    """Large-M tier (M >= 512) of nvfp4_gemm_bf16 with a caller-owned workspace of at least
    nvfp4_gemm_m256_workspace_size(...) bytes; pass the same workspace on every graph replay."""
    return _nvfp4_gemm(_M256, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out, workspace=workspace)


# ---- PDL twins and the standard-layout GEMV (flashrt HEAD) -------------------------------------


def quantize_fp4_sfa_bf16_pdl(
    x: Tensor, packed: OptTensor = None, sfa: OptTensor = None, is_sfb: bool = False
) -> tuple[Tensor, Tensor]:
    """quantize_fp4_sfa_bf16 launched with programmatic dependent launch: the same bytes. Every
    quantizer of this family launches with PDL already; the name is flashrt's."""
    return quantize_fp4_sfa_bf16(x, packed, sfa, is_sfb)


def fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    warps: int = 2,
    stages: int = 6,
    out: OptTensor = None,
) -> Tensor:
    """fp4_w4a4_gemm_warpsplit_mrows_bf16 launched with programmatic dependent launch (as every GEMM of
    this family is): the same result."""
    return fp4_w4a4_gemm_warpsplit_mrows_bf16(a_packed, b_packed, sfa, sfb, alpha=alpha, warps=warps, stages=stages,
                                              out=out)  # fmt: skip


def fp4_w4a4_gemv_warpsplit_bf16(
    a_packed: Tensor,
    b_packed: Tensor,
    sfa: Tensor,
    sfb: Tensor,
    *,
    alpha: float = 1.0,
    warps: int = 4,
    stages: int = 4,
    out: OptTensor = None,
) -> Tensor:
    """M = 1 decode GEMV on the standard (row-major packed, not repacked) weight: out = alpha * a @ B^T,
    bfloat16 [1, N]. warps in {2, 4, 8}, stages in [1, 8]. The K split is reduced inside a cluster of
    CTAs (no cross-call scratch): graph-replay safe."""
    return _nvfp4_gemm(
        _BF16, a_packed, b_packed, sfa, sfb, alpha=alpha, out=out, tier=(_validate.gemv_standard, warps, stages)
    )


# ---- the W4A16 tier: bf16 activations, NVFP4 weights (flashrt HEAD) ----------------------------
#
# The adopted layout is this package's own: the packed weight as ModelOpt stores it (uint8 [N, K/2],
# row-major), its UE4M3 scales swizzled into SfAtom bytes (a flat uint8 buffer of
# sfa_size_bytes(N, K)), the global scale a float32 [1] tensor. Every tier reads it as it is: the
# M <= 16 kernels, the Hopper engine (bf16 A) and, from M = 1024 on sm_90 or above M = 16 on
# Blackwell, the composition backend.


def allocate_w4a16_marlin_workspace(device: torch.device | str) -> Tensor:
    """The workspace nvfp4_w4a16_marlin_bf16 takes: one int32 zero on the device (flashrt's holds one
    per SM). This package's kernels keep no state in it (their K split reduces inside a cluster of
    CTAs); it is accepted, checked and passed through so that code written for flashrt runs unchanged.
    Allocate it once, before graph capture."""
    return torch.zeros(1, dtype=torch.int32, device=_validate.device("device", device))


def adopt_nvfp4_w4a16_marlin(
    weight_packed: Tensor, weight_scale: Tensor, weight_scale_2: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Bind-time conversion of one ModelOpt NVFP4 layer into the W4A16 tier's operands.

    Parameters
    ----------
    weight_packed : uint8 [N, K/2], E2M1 codes, element 2i in the low nibble; K % 32 == 0.
    weight_scale : float8_e4m3fn (or its bytes, uint8) [N, K/16], row-major UE4M3 block scales.
    weight_scale_2 : float32, one element: the global scale (weight = code * weight_scale * weight_scale_2).

    Returns
    -------
    (weight, scale, global_scale, workspace): weight_packed itself (contiguous), the scales as SfAtom
    bytes (flat uint8 of sfa_size_bytes(N, K)), weight_scale_2 as float32 [1], and
    allocate_w4a16_marlin_workspace(device). All on weight_packed's device.
    """
    n, k = _validate.adopt_w4a16(weight_packed, weight_scale, weight_scale_2)
    plain = weight_scale.contiguous().view(torch.uint8)
    scale = reference.swizzle_scales(plain).reshape(-1).contiguous()
    global_scale = weight_scale_2.reshape(1).to(torch.float32).contiguous()
    workspace = allocate_w4a16_marlin_workspace(weight_packed.device)
    return weight_packed.contiguous(), scale, global_scale, workspace


def nvfp4_w4a16_marlin_bf16(
    x: Tensor, weight: Tensor, scale: Tensor, global_scale: Tensor, *, workspace: Tensor, out: OptTensor = None
) -> Tensor:
    """out = x @ dequant(W)^T * global_scale, bfloat16 [M, N], for bf16 x [M, K] (any M >= 1) and the
    operands of adopt_nvfp4_w4a16_marlin. Allocates nothing when `out` is given; CUDA-graph safe."""
    codes, run = _validate.checked(_w4a16_remembered, x, weight, scale, global_scale, workspace, out)
    _validate.w4a16_gemm_buffers(x, weight, scale, global_scale, workspace, out)
    if out is None:
        out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.bfloat16, device=x.device)
    if codes is not None:
        run(x, weight, None, scale, None, global_scale, None, None, out, None, codes[0], 1.0, codes[1])
    return out


def _w4a16_remembered(
    x: Tensor, weight: Tensor, scale: Tensor, global_scale: Tensor, workspace: Tensor, out: OptTensor
) -> tuple[tuple[int, int] | None, Callable[..., None]]:
    """What nvfp4_w4a16_marlin_bf16 remembers for its metadata (_validate.checked): its GemmCall's
    packed fields, None for a weight without rows (nothing to launch, as GemmCall.run), and the op's
    entry (op_entry)."""
    _validate.w4a16_gemm_rules(x, weight, scale, global_scale, workspace, out)
    call = GemmCall(x, weight, None, scale, "bf16", "nvfp4", alpha=global_scale)
    return None if weight.numel() == 0 else call.codes(), op_entry()
