"""`kernels benchmark ./` workloads for the quantizers and the MoE data movement (H200-sized).

The side-by-side comparison against PyTorch, with bandwidth fractions, is `python benchmarks/peers.py quant`.
"""

from __future__ import annotations

import torch
from kernels.benchmark import Benchmark


class QuantizeBenchmark(Benchmark):
    seed = 0

    def setup_nvfp4_m16384_k8192(self) -> None:
        self.x = torch.randn(16384, 8192, device=self.device, dtype=torch.bfloat16)

    def benchmark_nvfp4_m16384_k8192(self) -> None:
        self.out = self.kernel.group_wise_quant(self.x, "w4a4-nvfp4")[0]

    def verify_nvfp4_m16384_k8192(self) -> torch.Tensor:
        ref = self.kernel.reference
        return ref.quantize(self.x, ref.NVFP4, swizzle=True)[0]

    def setup_mxfp8_m16384_k8192(self) -> None:
        self.x = torch.randn(16384, 8192, device=self.device, dtype=torch.bfloat16)

    def benchmark_mxfp8_m16384_k8192(self) -> None:
        self.out = self.kernel.group_wise_quant(self.x, "w8a8-mxfp8")[0].view(torch.uint8)

    def verify_mxfp8_m16384_k8192(self) -> torch.Tensor:
        ref = self.kernel.reference
        return ref.quantize(self.x, ref.MXFP8, swizzle=True)[0].view(torch.uint8)


class DequantizeBenchmark(Benchmark):
    seed = 0

    def setup_nvfp4_m16384_k8192(self) -> None:
        x = torch.randn(16384, 8192, device=self.device, dtype=torch.float16)
        self.packed, self.sfa = self.kernel.quantize_fp4_sfa_fp16(x)

    def benchmark_nvfp4_m16384_k8192(self) -> None:
        self.out = self.kernel.dequantize_fp4_sfa_fp16(self.packed, self.sfa)

    def verify_nvfp4_m16384_k8192(self) -> torch.Tensor:
        ref = self.kernel.reference
        return ref.dequantize(self.packed, self.sfa, ref.NVFP4).half()


class SwigluQuantBenchmark(Benchmark):
    seed = 0

    def setup_prefill_e8_m2048_h4096(self) -> None:
        self.x = torch.randn(8 * 2048, 2 * 4096, device=self.device, dtype=torch.bfloat16)
        self.counts = torch.full((8,), 2048, device=self.device, dtype=torch.int32)

    def benchmark_prefill_e8_m2048_h4096(self) -> None:
        self.out = self.kernel.fused_swiglu_quant(self.x, self.counts, True)[0]

    def verify_prefill_e8_m2048_h4096(self) -> torch.Tensor:
        ref = self.kernel.reference  # every row is owned: the quantized SwiGLU of the whole input
        return ref.quantize(ref.swiglu_float32(self.x[:, :4096], self.x[:, 4096:]), ref.NVFP4, swizzle=True)[0]
