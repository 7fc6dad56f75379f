"""Operands, calls and the bound of the decode tests (test_gemm_skinny.py, test_gemm_grouped_decode.py):
the M <= 16 kernels of csrc/gemm/skinny, dense and grouped, block-scaled and bf16 (W4A16) activations."""

from __future__ import annotations

import functools

import torch
from checks import poisoned_like, ulp

MODES = {"mxfp8": "w8a8-mxfp8", "mxfp4": "w4a4-mxfp4", "nvfp4": "w4a4-nvfp4"}
GELU_SLOPE = 1.13  # the largest slope of the erf GELU: an error of its input carries over at most that much
# The decode shapes (N, K) of the benchmark: the four qualification shapes, then MoE expert shapes.
QUALIFICATION_SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120), (8192, 8192)]
EXPERT_SHAPES = [(4096, 7168), (7168, 2048), (2048, 7168), (1536, 7168)]
# The skinny tier's kernels by the `gemm` knobs that name them (csrc/gemm/skinny/backend.cu): the
# staged kernel (variant 3) serves every problem of the tier, the register-streaming kernel (variant
# 4) dense problems with 4-bit weights (A in their format or bf16) or MXFP8 weights (A MXFP8) whose
# activations fit in shared memory (elsewhere its id runs the staged one), as one CTA per K range
# (splits 1) or with K split over a cluster of CTAs.
SKINNY_KERNELS = {
    "staged": {"variant": 3},
    "register-stream": {"variant": 4, "splits": 1},
    "register-stream-cluster": {"variant": 4, "splits": 2},
}
REGISTER_STREAM_PAIRS = [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8", "mxfp8"), ("bf16", "nvfp4"),
                         ("bf16", "mxfp4")]  # fmt: skip


def quantize(ref, fmt: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantization by the reference (on x's device), with the scale buffer the public functions of
    fmt take."""
    values, scales = ref.quantize(x.half() if fmt == "e0m3" else x, ref.FORMATS[fmt], swizzle=True)
    return values, scales.reshape(-1) if fmt in ("nvfp4", "e0m3") else scales


def random_bf16(rows: int, cols: int, seed: int, scale: float = 1.0, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(rows, cols, generator=g, device=device) * scale).to(torch.bfloat16)


@functools.lru_cache(maxsize=8)
def quantized_weight(ref, fmt: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight-like B (N(0, 0.05)) quantized by the reference on the CPU, and its exact float64 values."""
    b, sfb = quantize(ref, fmt, random_bf16(n, k, seed, scale=0.05))
    return b, sfb, ref.dequantize(b, sfb, ref.FORMATS[fmt]).double()


class Operands:
    """A [M, K] and B [N, K] on the CPU, their exact float64 values, and CUDA copies. a_format "bf16":
    A is plain bf16 (W4A16) and sfa an empty buffer."""

    def __init__(self, ref, a_format: str, b_format: str, m: int, n: int, k: int, seed: int = 0,
                 a_scale: float = 1.0) -> None:  # fmt: skip
        x = random_bf16(m, k, seed, scale=a_scale)
        if a_format == "bf16":
            self.a, self.sfa, self.a_dq = x, torch.empty(0, dtype=torch.uint8), x.double()
        else:
            self.a, self.sfa = quantize(ref, a_format, x)
            self.a_dq = ref.dequantize(self.a, self.sfa, ref.FORMATS[a_format]).double()
        self.b, self.sfb, self.b_dq = quantized_weight(ref, b_format, n, k, seed + 1)

    def cuda(self) -> tuple[torch.Tensor, ...]:
        return tuple(t.cuda() for t in (self.a, self.b, self.sfa, self.sfb))

    def product(self) -> torch.Tensor:
        return self.a_dq @ self.b_dq.T


def gemm(fp4, a, b, sfa, sfb, a_format: str, b_format: str, out: torch.Tensor, *, alpha=None, alpha_scale=1.0,
         bias=None, residual=None, activation="none", grouping="dense", group_index=None, group_rows=0,
         sm_count=-1, warps=0, stages=0, splits=0, interleaved=False, variant=-1) -> torch.Tensor:  # fmt: skip
    """The `gemm` op directly (what every public GEMM function calls), into out; a bf16 A has no sfa.
    variant (and splits): SKINNY_KERNELS' knobs run that kernel of the skinny tier."""
    out_format = {torch.bfloat16: "bf16", torch.float16: "fp16"}[out.dtype]
    fp4._gemm.GemmCall(
        a, b, None if a_format == "bf16" else sfa, sfb, a_format, b_format, interleaved, grouping, group_index,
        group_rows, alpha, alpha_scale, bias, residual, activation, out, None, out_format, variant=variant,
        sm_count=sm_count, warps=warps, stages=stages, splits=splits, pdl=False,
    ).run()  # fmt: skip
    return out


def poisoned_out(m: int, n: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return poisoned_like(torch.empty(m, n, dtype=dtype, device="cuda"))


def epilogue_bound(y: torch.Tensor, abs_product: torch.Tensor, k: int, alpha, extras, activation: str,
                   out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(expected, bound) for act(alpha * A @ B^T + extras), given y = alpha * A @ B^T and |A| @ |B|^T in
    float64: the FORMATS.md accumulation term K 2^-24 |A| @ |B|^T scaled by alpha, the float32
    additions of bias and residual add their rounding, GELU carries its input error over at most
    GELU_SLOPE times, relu2 2|y| + |d| times, and the output ulp is of the result. alpha: a float, or
    a per-row float64 column."""
    terms = y.abs()
    for extra in extras:
        y = y + extra
        terms = terms + extra.abs()
    expected = {"none": y, "gelu": torch.nn.functional.gelu(y), "relu2": torch.relu(y) ** 2}[activation]
    alpha_abs = alpha.abs() if isinstance(alpha, torch.Tensor) else abs(alpha)
    input_error = k * 2.0**-24 * alpha_abs * abs_product + 2.0**-23 * terms
    slope = {"none": 1.0, "gelu": GELU_SLOPE, "relu2": 2 * y.abs() + input_error}[activation]
    return expected, ulp(expected, out_dtype) + slope * input_error + 2.0**-22 * expected.abs()


def assert_close_to(out: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    """NaN exactly where expected has NaN; elsewhere |out - expected| <= bound."""
    out = out.to(expected.device).double()
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan), f"{what}: NaN where the reference has none, or the reverse"
    err = torch.where(nan, 0.0, (out - expected).abs())
    worst = (err - bound).max().item()
    assert worst <= 0, f"{what}: error exceeds the bound by {worst:.3g} (max err {err.max().item():.3g})"


def assert_epilogue_within_bound(out: torch.Tensor, ops: Operands, alpha: float = 1.0, bias=None, residual=None,
                                 activation: str = "none", what: str = "") -> None:  # fmt: skip
    """The FORMATS.md bound for act(alpha * A @ B^T + bias + residual) on CPU operands."""
    extras = [t.double().cpu() for t in (bias, residual) if t is not None]
    abs_product = ops.a_dq.abs() @ ops.b_dq.abs().T
    k = ops.a_dq.shape[1]
    expected, bound = epilogue_bound(alpha * ops.product(), abs_product, k, alpha, extras, activation, out.dtype)
    assert_close_to(out.cpu(), expected, bound, what)


def gpu_weight(fp4, ref, fmt: str, rows: int, k: int, seed: int, scale: float = 1.0) -> tuple[torch.Tensor, ...]:
    """A weight-like [rows, K] (N(0, 0.05) times scale) quantized by the package on the GPU (its
    quantizers equal the reference bit for bit, test_quantize.py)."""
    x = random_bf16(rows, k, seed, scale=0.05 * scale, device="cuda")
    if fmt == "e0m3":
        return fp4.quantize_e0m3_sfa_fp16(x.half())
    return fp4.group_wise_quant(x, MODES[fmt])


def gpu_activation(fp4, ref, fmt: str, rows: int, k: int, seed: int, scale: float = 1.0):
    """(a, sfa, exact float64 values) on the GPU; fmt "bf16": plain bf16 rows."""
    x = random_bf16(rows, k, seed, scale=scale, device="cuda")
    if fmt == "bf16":
        return x, torch.empty(0, dtype=torch.uint8, device="cuda"), x.double()
    a, sfa = fp4.group_wise_quant(x, MODES[fmt])
    return a, sfa, ref.dequantize(a, sfa, ref.FORMATS[fmt]).double()
