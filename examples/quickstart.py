"""Quickstart: load fp4-gemm the way consumers do and quantize activations in the three modes.

Runs on the GPU when there is one (native kernels), else on the CPU (the exact reference).
With LOCAL_KERNELS=org/fp4-gemm=<repo> set, it loads through get_kernel as a Hub consumer would;
otherwise through get_local_kernel on this checkout's build/.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import torch
from kernels import get_kernel, get_local_kernel

ROOT = Path(__file__).resolve().parent.parent
MODES = ("w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4")


def load_package() -> ModuleType:
    if "LOCAL_KERNELS" in os.environ:
        return get_kernel("org/fp4-gemm", version=1, trust_remote_code=True)
    return get_local_kernel(ROOT)


def main() -> None:
    fp4 = load_package()
    ref = fp4.reference
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (reference)"
    print(f"fp4-gemm on {name}")

    x = torch.randn(512, 4096, dtype=torch.bfloat16, device=device)
    for mode in MODES:
        values, scales = fp4.group_wise_quant(x, mode)
        fmt = ref.MODES[mode]
        plain = ref.unswizzle_scales(scales, x.shape[0], x.shape[1] // fmt.group)
        restored = ref.dequantize_blocks(ref.load_codes(values, fmt), plain, fmt)
        error = ((restored - x.float()).norm() / x.float().norm()).item()
        line = f"{mode}: values {tuple(values.shape)} {values.dtype}, scales {tuple(scales.shape)}, "
        line += f"round-trip relative error {error:.4f}"
        if device == "cuda":
            cpu_values, cpu_scales = fp4.group_wise_quant(x.cpu(), mode)
            exact = torch.equal(values.view(torch.uint8).cpu(), cpu_values.view(torch.uint8))
            exact &= torch.equal(scales.cpu(), cpu_scales)
            line += f", bit-exact vs CPU reference: {exact}"
        print(line)


if __name__ == "__main__":
    main()
