"""capabilities(): the contract a runtime dispatcher reads instead of copying constants.

Per public function and arch, the status is "native" (a kernel of this build, run and tested on that
arch), "native (compile-verified)" (a kernel of this build whose arch no GPU here could run),
"reference" (the exact reference, run with PyTorch ops on the device) or "unsupported" (this build
has no code for the arch).
"""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass
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
}


@dataclass(frozen=True)
class GemmKind:
    """What a public GEMM function asks the `gemm` op for; the backend that serves it decides the
    function's status (ops.gemm_backend answers from the same predicates dispatch uses)."""

    a_format: str = "nvfp4"
    b_format: str = "nvfp4"
    b_interleaved: bool = False
    grouping: str = "dense"
    activation: str = "none"
    out_format: str = "bf16"
    schedule: str = "auto"
    # a representative M: 256 for the general tiers, the tier's own M for the decode tiers; grouped
    # kinds ask about 8 groups of m rows each (ops.gemm_backend)
    m: int = 256


HALOPS_MODES = ("mxfp8", "mxfp4", "nvfp4")
# public GEMM function -> every kind of problem it can issue (all must be native for "native")
GEMM_KINDS: dict[str, tuple[GemmKind, ...]] = {
    "dense_gemm": tuple(GemmKind(f, f) for f in HALOPS_MODES),
    "batch_gemm": tuple(GemmKind(f, f, grouping="batched") for f in HALOPS_MODES),
    "group_contiguous_gemm": tuple(GemmKind(f, f, grouping="contiguous") for f in HALOPS_MODES),
    "group_masked_gemm": tuple(GemmKind(f, f, grouping="masked") for f in HALOPS_MODES),
    "nvfp4_gemm_bf16": (GemmKind(),),
    "nvfp4_gemm_fp16": (GemmKind(out_format="fp16"),),
    "nvfp4_gemm_variant_bf16": (GemmKind(),),
    "fp4_w4a16_linear_bf16": (GemmKind(),),
    "nvfp4_gemm_streamk_bf16": (GemmKind(schedule="streamk"),),
    "nvfp4_gemm_streamk_bias_bf16": (GemmKind(schedule="streamk"),),
    "nvfp4_gemm_bias_bf16": (GemmKind(),),
    "nvfp4_gemm_residual_bf16": (GemmKind(),),
    "nvfp4_gemm_bias_residual_bf16": (GemmKind(),),
    "nvfp4_gemm_bias_residual_fp16": (GemmKind(out_format="fp16"),),
    "nvfp4_gemm_bias_gelu_bf16": (GemmKind(activation="gelu"),),
    "nvfp4_gemm_nvfp4": (GemmKind(out_format="nvfp4"),),
    "nvfp4_gemm_relu2_nvfp4": (GemmKind(activation="relu2", out_format="nvfp4"),),
    "nvfp4_gemm_bias_gelu_nvfp4": (GemmKind(activation="gelu", out_format="nvfp4"),),
    "nvfp4_gemm_bias_gelu_nvfp4_fp16": (GemmKind(activation="gelu", out_format="nvfp4_from_fp16"),),
    "nvfp4_gemm_geglu_nvfp4_fp16": (GemmKind(activation="geglu", out_format="nvfp4_from_fp16"),),
    "cutlass_fp4_gemm_geglu_il_hw_v10": (GemmKind(activation="geglu", out_format="nvfp4_from_fp16"),),
    "e0m3_weight_gemm_fp16": (
        GemmKind("nvfp4", "e0m3", out_format="fp16"),
        GemmKind("e0m3", "e0m3", out_format="fp16"),
    ),
    "fp4_w4a4_gemv_warpsplit_interleaved_bf16": (GemmKind(b_interleaved=True, schedule="gemv", m=1),),
    "fp4_w4a4_gemm_warpsplit_mrows_bf16": tuple(GemmKind(schedule="mrows", m=m) for m in (1, 16)),
    "nvfp4_gemm_m256_bf16": (GemmKind(schedule="m256", m=512),),
}
FUNCTION_OPS.update({name: "gemm" for name in GEMM_KINDS})
HOST_FUNCTIONS = ("sfa_size_bytes", "capabilities", "nvfp4_gemm_m256_workspace_size")


def built_archs() -> list[str]:
    """CUDA capabilities compiled into this build (from the variant's metadata.json)."""
    metadata = Path(__file__).with_name("metadata.json")
    if not metadata.exists():
        return []
    return list(json.loads(metadata.read_text())["backend"]["archs"])


def gemm_backend(kind: GemmKind, arch: str) -> str:
    """Name of the backend serving `kind` on `arch` in this build ("" = the reference), for a problem of
    N = K = 4096 (grouped kinds: 8 groups of kind.m rows, with the group fields a real call sets)."""
    return ops.gemm_backend(int(arch[3:]), *astuple(kind)[:-1], kind.m, 4096, 4096)


def op_status(function: str, op: str, arch: str, built: list[str]) -> str:
    if op not in NATIVE_CUDA_OPS:
        return "reference"  # PyTorch ops on the device: any CUDA GPU
    if ARCHS[arch] not in built:
        return "unsupported"  # the kernel exists, but this build has no code for the arch
    if op == "gemm" and not all(gemm_backend(kind, arch) for kind in GEMM_KINDS[function]):
        return "reference"
    return "native" if arch in RUN_ARCHS else "native (compile-verified)"


def function_status() -> dict[str, dict[str, str]]:
    built = built_archs()
    table = {
        name: {arch: op_status(name, op, arch, built) for arch in ARCHS} | {"cpu": "reference"}
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
