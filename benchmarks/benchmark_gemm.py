"""`kernels benchmark ./` workloads for the dense block-scaled GEMMs at (N, K) = (17408, 5120): decode
(M = 16) and prefill (M = 4096) for each format. The runner's verify step is cuBLAS bf16 on the exactly
dequantized operands, so its reference time is the cuBLAS time on the same data.

The side-by-side comparison against every peer, with ratios, is benchmarks/bench_gemm.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from kernels.benchmark import Benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the runner loads this file by path
import bench_gemm  # noqa: E402
import gemm_peers  # noqa: E402

N, K = 17408, 5120
# The runner checks torch.allclose(out, verify(), atol=1e-2) (rtol 1e-5). Activations of std 0.1 and
# weights of std 0.02 keep |out| below 1, where bf16 results of two correct summation orders differ by
# a step or two (<= 2^-8): a correct kernel passes, a wrong one cannot hide under the tolerance.
A_STD, B_STD = 0.1, 0.02

Workload = tuple[Callable[[Benchmark], None], Callable[[Benchmark], None], Callable[[Benchmark], torch.Tensor]]


def _workload(fmt: str, m: int) -> Workload:
    """(setup, benchmark, verify) of one format and M."""
    ours = bench_gemm.ours_for(fmt, "dense_gemm")
    a_op, b_op = gemm_peers.GEMM_OPERANDS[fmt]

    def operand(self: Benchmark, rows: int, std: float, op: gemm_peers.Operand) -> tuple[torch.Tensor, ...]:
        x = std * torch.randn(rows, K, device=self.device, dtype=torch.bfloat16)
        values, scales = bench_gemm.quantize(self.kernel, x, op, ours)
        exact = self.kernel.reference.dequantize(values, scales, self.kernel.reference.FORMATS[op.name])
        return values, scales, exact.to(torch.bfloat16)

    def setup(self: Benchmark) -> None:
        a, sfa, self.a_bf16 = operand(self, m, A_STD, a_op)
        self.b, self.sfb, self.b_bf16 = operand(self, N, B_STD, b_op)
        self.out = torch.empty(m, N, dtype=ours.out_dtype, device=self.device)
        self.ours = bench_gemm.ours_fn(self.kernel, ours, fmt, a, sfa, self.out)

    def benchmark(self: Benchmark) -> None:
        self.ours(self.b, self.sfb)

    def verify(self: Benchmark) -> torch.Tensor:
        return gemm_peers.mm_bt(self.a_bf16, self.b_bf16).to(self.out.dtype)

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
