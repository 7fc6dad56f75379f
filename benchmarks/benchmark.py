"""`kernels benchmark ./` workloads for the dense block-scaled GEMMs at (N, K) = (17408, 5120): decode
(M = 16) and prefill (M = 4096) for each format. The runner's verify step is cuBLAS bf16 on the exactly
dequantized operands, so its reference time is the cuBLAS time on the same data.

kernel-builder uploads only benchmarks/benchmark*.py, so this file imports nothing but torch and kernels;
the side-by-side comparison against every peer, with ratios (`python benchmarks/peers.py gemm`, in
gemm_peers.py), takes its operand table and its calls of our functions from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from kernels.benchmark import Benchmark

Tensor = torch.Tensor

# ---- operand formats and our functions (shared with gemm_peers.py and suites.py) ---------------


@dataclass(frozen=True)
class Operand:
    """Block format of one GEMM operand as the package stores it (docs/FORMATS.md)."""

    name: str
    group: int  # elements per scale byte, along K
    element: str  # "e4m3" | "e2m1" | "e0m3"
    scale: str  # "ue8m0" | "ue4m3"

    @property
    def packed(self) -> bool:
        """4-bit elements, two per byte (element 2i in the low nibble)."""
        return self.element in ("e2m1", "e0m3")

    @property
    def quantized(self) -> bool:
        """False for W4A16's bf16 activations, which every method reads as they are."""
        return self.element != "bf16"

    def stored_cols(self, k: int) -> int:
        return k // 2 if self.packed else k


OPERANDS = {
    "mxfp8": Operand("mxfp8", 32, "e4m3", "ue8m0"),
    "mxfp4": Operand("mxfp4", 32, "e2m1", "ue8m0"),
    "nvfp4": Operand("nvfp4", 16, "e2m1", "ue4m3"),
    "e0m3": Operand("e0m3", 16, "e0m3", "ue4m3"),
}

BF16 = Operand("bf16", 1, "bf16", "none")  # W4A16's activations: no blocks, no scales

# benchmark format -> (A operand, B operand); "e0m3" is E0M3 weights with NVFP4 activations, the w4a16
# formats bf16 activations with 4-bit weights (named by dense_gemm's mode)
GEMM_OPERANDS = {
    "mxfp8": (OPERANDS["mxfp8"], OPERANDS["mxfp8"]),
    "mxfp4": (OPERANDS["mxfp4"], OPERANDS["mxfp4"]),
    "nvfp4": (OPERANDS["nvfp4"], OPERANDS["nvfp4"]),
    "e0m3": (OPERANDS["nvfp4"], OPERANDS["e0m3"]),
    "w4a16-nvfp4": (BF16, OPERANDS["nvfp4"]),
    "w4a16-mxfp4": (BF16, OPERANDS["mxfp4"]),
}


HALOPS_MODES = {"mxfp8": "w8a8-mxfp8", "mxfp4": "w4a4-mxfp4", "nvfp4": "w4a4-nvfp4"}


@dataclass(frozen=True)
class Ours:
    op: str  # the public function timed
    quantizer: str  # "group_wise_quant" or "flashrt": which quantizers produced the operands
    out_dtype: torch.dtype


def ours_for(fmt: str, nvfp4_op: str) -> Ours:
    if fmt == "e0m3":
        return Ours("e0m3_weight_gemm_fp16", "flashrt", torch.float16)
    if fmt == "nvfp4" and nvfp4_op == "nvfp4_gemm_bf16":
        return Ours("nvfp4_gemm_bf16", "flashrt", torch.bfloat16)
    return Ours("dense_gemm", "group_wise_quant", torch.bfloat16)


def quantize(fp4, x: Tensor, operand: Operand, ours: Ours) -> tuple[Tensor, Tensor]:
    """(values, swizzled scales) of a bf16 matrix, by the package's quantizer that feeds `ours`; bf16
    activations: x itself and no scales."""
    if not operand.quantized:
        return x, torch.empty(0, dtype=torch.uint8, device=x.device)
    if ours.quantizer == "group_wise_quant":
        return fp4.group_wise_quant(x, HALOPS_MODES[operand.name])
    if operand.name == "e0m3":
        return fp4.quantize_e0m3_sfa_fp16(x.half())
    return fp4.quantize_fp4_sfa_bf16(x)


def ours_fn(fp4, ours: Ours, fmt: str, a: Tensor, sfa: Tensor, out: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """fn(b, sfb) -> out: our public function on the fixed activation (the weight is what rotates)."""
    if ours.op == "e0m3_weight_gemm_fp16":
        return lambda b, sfb: fp4.e0m3_weight_gemm_fp16(a, b, sfa, sfb, alpha=1.0, a_format=1, out=out)
    if ours.op == "nvfp4_gemm_bf16":
        return lambda b, sfb: fp4.nvfp4_gemm_bf16(a, b, sfa, sfb, 1.0, out)
    alpha = nvfp4_alpha(fmt, a.device)
    mode = HALOPS_MODES.get(fmt, fmt)  # the w4a16 formats are named by their mode
    sfa = sfa if GEMM_OPERANDS[fmt][0].quantized else None

    def call(b: Tensor, sfb: Tensor) -> Tensor:
        fp4.dense_gemm(a, b, sfa, sfb, out, alpha=alpha, mode=mode)
        return out

    return call


def nvfp4_alpha(fmt: str, device: torch.device | str) -> Tensor | None:
    """The second-level (global) scale of an NVFP4 weight, float32 [1], that dense_gemm gets: w4a4-nvfp4
    requires it; w4a16-nvfp4 gets it too, as its peers apply one; the MX modes run without it."""
    if GEMM_OPERANDS[fmt][1].name != "nvfp4":
        return None
    return torch.ones(1, dtype=torch.float32, device=device)


def mm_bt(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a @ b^T with cuBLAS (bf16 operands, fp32 accumulation, bf16 output)."""
    return torch.mm(a, b.t(), out=out)


# ---- the workloads ------------------------------------------------------------------------------

N, K = 17408, 5120
# The runner checks torch.allclose(out, verify(), atol=1e-2) (rtol 1e-5). Activations of std 0.1 and
# weights of std 0.02 keep |out| below 1, where bf16 results of two correct summation orders differ by
# a step or two (<= 2^-8): a correct kernel passes, a wrong one cannot hide under the tolerance.
A_STD, B_STD = 0.1, 0.02

Workload = tuple[Callable[[Benchmark], None], Callable[[Benchmark], None], Callable[[Benchmark], Tensor]]


def _workload(fmt: str, m: int) -> Workload:
    """(setup, benchmark, verify) of one format and M."""
    ours = ours_for(fmt, "dense_gemm")
    a_op, b_op = GEMM_OPERANDS[fmt]

    def operand(self: Benchmark, rows: int, std: float, op: Operand) -> tuple[Tensor, ...]:
        x = std * torch.randn(rows, K, device=self.device, dtype=torch.bfloat16)
        values, scales = quantize(self.kernel, x, op, ours)
        exact = self.kernel.reference.dequantize(values, scales, self.kernel.reference.FORMATS[op.name])
        return values, scales, exact.to(torch.bfloat16)

    def setup(self: Benchmark) -> None:
        a, sfa, self.a_bf16 = operand(self, m, A_STD, a_op)
        self.b, self.sfb, self.b_bf16 = operand(self, N, B_STD, b_op)
        self.out = torch.empty(m, N, dtype=ours.out_dtype, device=self.device)
        self.ours = ours_fn(self.kernel, ours, fmt, a, sfa, self.out)

    def benchmark(self: Benchmark) -> None:
        self.ours(self.b, self.sfb)

    def verify(self: Benchmark) -> Tensor:
        return mm_bt(self.a_bf16, self.b_bf16).to(self.out.dtype)

    return setup, benchmark, verify


class DenseGemmBenchmark(Benchmark):
    """dense_gemm (MXFP8, MXFP4, NVFP4) and e0m3_weight_gemm_fp16 (E0M3 weights, NVFP4 activations)."""

    seed = 0

    setup_mxfp8_m16, benchmark_mxfp8_m16, verify_mxfp8_m16 = _workload("mxfp8", 16)
    setup_mxfp8_m4096, benchmark_mxfp8_m4096, verify_mxfp8_m4096 = _workload("mxfp8", 4096)
    setup_mxfp4_m16, benchmark_mxfp4_m16, verify_mxfp4_m16 = _workload("mxfp4", 16)
    setup_mxfp4_m4096, benchmark_mxfp4_m4096, verify_mxfp4_m4096 = _workload("mxfp4", 4096)
    setup_nvfp4_m16, benchmark_nvfp4_m16, verify_nvfp4_m16 = _workload("nvfp4", 16)
    setup_nvfp4_m4096, benchmark_nvfp4_m4096, verify_nvfp4_m4096 = _workload("nvfp4", 4096)
    setup_e0m3_m16, benchmark_e0m3_m16, verify_e0m3_m16 = _workload("e0m3", 16)
    setup_e0m3_m4096, benchmark_e0m3_m4096, verify_e0m3_m4096 = _workload("e0m3", 4096)
