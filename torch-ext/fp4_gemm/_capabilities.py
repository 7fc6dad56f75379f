"""capabilities(): the contract a runtime dispatcher reads instead of copying constants.

Per public function and arch, the status is "native" (a kernel of this build, run and tested on that
arch), "native (compile-verified)" (a kernel of this build whose arch no GPU here could run),
"reference" (the exact reference, run with PyTorch ops on the device) or "unsupported" (this build
has no code for the arch).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import _validate, reference
from ._ops import ops
from ._registry import NATIVE_CUDA_OPS

ARCHS = {"sm_90": "9.0a", "sm_100": "10.0a", "sm_110": "11.0a", "sm_120": "12.0a"}
RUN_ARCHS = frozenset({"sm_90"})  # archs whose kernels ran in this package's tests (an H200)

# public function -> the registered op that does its work
FUNCTION_OPS = {
    "group_wise_quant": "quantize",
    "quantize_fp4_sfa_fp16": "quantize",
    "quantize_fp4_sfa_bf16": "quantize",
    "quantize_fp4_sfa_mse_fp16": "quantize",
    "quantize_fp4_sfa_mse_bf16": "quantize",
    "quantize_fp4_sfa_padded_bf16": "quantize",
    "pack_nvfp4_weight_bf16": "quantize",
    "quantize_e0m3_sfa_fp16": "quantize",
    "dequantize_fp4_sfa_fp16": "dequantize",
    "fused_swiglu_quant": "swiglu_quant",
    "prefill_permute_to_masked_gemm": "permute_to_masked",
    "fp4_repack_b_interleaved_sm120": "repack",
    **{
        name: "gemm"
        for name in (
            "dense_gemm",
            "batch_gemm",
            "group_contiguous_gemm",
            "group_masked_gemm",
            "nvfp4_gemm_bf16",
            "nvfp4_gemm_fp16",
            "nvfp4_gemm_variant_bf16",
            "nvfp4_gemm_nvfp4",
            "nvfp4_gemm_geglu_nvfp4_fp16",
            "cutlass_fp4_gemm_geglu_il_hw_v10",
            "nvfp4_gemm_bias_gelu_nvfp4_fp16",
            "nvfp4_gemm_bias_residual_fp16",
            "nvfp4_gemm_bias_bf16",
            "nvfp4_gemm_bias_residual_bf16",
            "nvfp4_gemm_residual_bf16",
            "nvfp4_gemm_bias_gelu_bf16",
            "nvfp4_gemm_bias_gelu_nvfp4",
            "nvfp4_gemm_streamk_bf16",
            "nvfp4_gemm_streamk_bias_bf16",
            "fp4_w4a16_linear_bf16",
            "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
            "fp4_w4a4_gemm_warpsplit_mrows_bf16",
            "nvfp4_gemm_m256_bf16",
            "e0m3_weight_gemm_fp16",
            "nvfp4_gemm_relu2_nvfp4",
        )
    },
}
HOST_FUNCTIONS = ("sfa_size_bytes", "capabilities", "nvfp4_gemm_m256_workspace_size")


def built_archs() -> list[str]:
    """CUDA capabilities compiled into this build (from the variant's metadata.json)."""
    metadata = Path(__file__).with_name("metadata.json")
    if not metadata.exists():
        return []
    return list(json.loads(metadata.read_text())["backend"]["archs"])


def op_status(op: str, arch: str, built: list[str]) -> str:
    if op not in NATIVE_CUDA_OPS:
        return "reference"  # PyTorch ops on the device: any CUDA GPU
    if ARCHS[arch] not in built:
        return "unsupported"  # the kernel exists, but this build has no code for the arch
    return "native" if arch in RUN_ARCHS else "native (compile-verified)"


def function_status() -> dict[str, dict[str, str]]:
    built = built_archs()
    table = {
        name: {arch: op_status(op, arch, built) for arch in ARCHS} | {"cpu": "reference"}
        for name, op in FUNCTION_OPS.items()
    }
    for name in HOST_FUNCTIONS:
        table[name] = {arch: "native" for arch in ARCHS} | {"cpu": "native"}
    return table


def capabilities() -> dict[str, object]:
    """The public contract: formats, scale layout, alignments, tiers, archs and per-function status."""
    return {
        "package": "fp4-gemm",
        "formats": {
            name: {"element": fmt.element, "scale": fmt.scale, "block_size": fmt.group}
            for name, fmt in reference.FORMATS.items()
        },
        "halops_modes": {mode: fmt.name for mode, fmt in reference.MODES.items()},
        "block_size": reference.NVFP4.group,
        "scale_layout": {
            "name": "cutlass-sm1xx-sfatom",
            "tile_rows": reference.SF_TILE_ROWS,
            "tile_blocks": reference.SF_TILE_COLS,
            "tile_bytes": reference.SF_TILE_BYTES,
            "offset": "((m // 128) * ceil(nkb / 4) + kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4",
            "size_bytes": "ceil(rows / 128) * ceil(nkb / 4) * 512",
        },
        "scale_size": "ceil(rows/128) * ceil((dim/16)/4) * 512 bytes",
        "layouts": ("row-major-packed-e2m1", "cutlass-sm1xx-blockscaled", "fp4-gemm-stream-8x64"),
        "streaming_weight_layout": "tiles of 8 rows x 64 elements (8 x 32 bytes), K-tile fastest, then row-tile",
        "alignment": {
            "k": {name: fmt.group for name, fmt in reference.FORMATS.items()},
            "public_m": 1,
            "quantizer_padding": "quantize_fp4_sfa_padded_bf16 / pack_nvfp4_weight_bf16: multiples of 16, default 32",
        },
        "tiers": {
            "gemv_interleaved": {
                "m": (1, 1),
                "n_multiple": reference.STREAM_TILE_ROWS,
                "k_multiple": reference.STREAM_TILE_K,
            },
            "mrows": {
                "m": (1, _validate.MROWS_MAX_M),
                "n_multiple": 8,
                "k_multiple": "64 * warps",
                "warps": _validate.SKINNY_WARPS,
                "stages": (1, _validate.MAX_STAGES),
            },
            "m256": {
                "m_min": _validate.M256_MIN_M,
                "workspace": "nvfp4_gemm_m256_workspace_size(a, b, sfa, sfb) bytes",
            },
        },
        "variants": {arch: (-1, *_validate.VARIANTS) for arch in ARCHS},
        "variant_names": {-1: "auto", 0: "default", 1: "widen", 2: "pingpong"},
        "cuda_capabilities": tuple(ARCHS.values()),
        "built_cuda_capabilities": tuple(built_archs()),
        "gemm_backends": tuple(f"sm_{cc}" for cc in ops.gemm_backend_archs()),
        "run_archs": tuple(sorted(RUN_ARCHS)),
        "functions": function_status(),
        "errors": "ValueError before launch for every rule; RuntimeError from CUDA",
    }


def sfa_size_bytes(rows: int, dim: int) -> int:
    """Bytes of the swizzled NVFP4 scale buffer of a [rows, dim] matrix: ceil(rows/128) * ceil(dim/16/4) * 512."""
    _validate.positive_int("rows", rows)
    _validate.positive_int("dim", dim)
    _validate.multiple("dim", dim, 16, "NVFP4 blocks of 16")
    return reference.sfa_size_bytes(rows, dim)
