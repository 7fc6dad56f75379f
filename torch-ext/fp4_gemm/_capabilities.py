"""capabilities(): the contract a runtime dispatcher reads instead of copying constants.

Per public function and arch, the status is "native" (a kernel of this build, run and tested on that
arch), "native (compile-verified)" (a kernel of this build whose arch no GPU here could run),
"reference" (the exact reference, run with PyTorch ops on the device) or "unsupported" (this build
has no code for the arch). A GEMM function is native on an arch when a backend serves every call it
makes for the representative arguments below (each M tier, bias dtype, residual dtype, mode and
a_format it accepts): the calls are recorded from the public functions themselves, run on fake
tensors (nothing is computed), and asked of the build's backends (GemmCall.backends).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import _halops, _nvfp4, _validate, reference
from ._gemm import GEMM_OP, OUT_DTYPES, GemmCall
from ._ops import ops
from ._registry import NATIVE_CUDA_OPS

# Every CUDA capability the package builds for: build.toml's kernel sections (tests hold the two
# equal). An `a` target runs on its own GPU arch, a family (`f`) target on every member of its family:
# 10.0f on B200 (sm_100) and B300 (sm_103), 12.0f on the RTX 50 series and RTX PRO (sm_120) and
# DGX Spark's GB10 (sm_121). The sm_XX names of the status table derive from them.
SUPPORTED_CUDA_CAPABILITIES = ("9.0a", "10.0f", "11.0a", "12.0f")
FAMILY_MEMBERS = {"10.0f": ("sm_100", "sm_103"), "12.0f": ("sm_120", "sm_121")}
ARCHS = {
    arch: cap
    for cap in SUPPORTED_CUDA_CAPABILITIES
    for arch in FAMILY_MEMBERS.get(cap, ("sm_" + cap[:-1].replace(".", ""),))
}
# The flashrt package's constants (its __all__), with this package's values.
NVFP4_BLOCK_SIZE = reference.NVFP4.group
NVFP4_SCALE_TILE_ROWS = reference.SF_TILE_ROWS
NVFP4_SCALE_TILE_BLOCKS = reference.SF_TILE_COLS
SUPPORTED_LAYOUTS = ("row-major-packed-e2m1", "cutlass-sm1xx-blockscaled", "fp4-gemm-stream-8x64")
RUN_ARCHS = frozenset({"sm_90"})  # archs whose kernels ran in this package's tests (an H100 and an H200)
# What flashrt's variant ids (variant_names) run on each capability's code, for dense GEMMs above 16
# rows (csrc/gemm/sm90/backend.cu tile_shape, csrc/gemm/blackwell/args.h BlackwellTile).
VARIANT_TILES = {
    "9.0a": {0: "128 x 128", 1: "128 x 256", 2: "64 x 256 (no pingpong kernel: the short tile)"},
    "10.0f": {0: "1-SM 128 x 128", 1: "2-SM 256 x 128", 2: "1-SM 128 x 128 (no pingpong kernel)"},
    "11.0a": {0: "1-SM 128 x 128", 1: "2-SM 256 x 128", 2: "1-SM 128 x 128 (no pingpong kernel)"},
    "12.0f": {0: "cooperative 128 x 128", 1: "cooperative 256 x 128 (FP4; MXFP8: 128 x 128)", 2: "pingpong 128 x 128"},
}

# public function -> the registered op that does its work
FUNCTION_OPS = {
    "group_wise_quant": "quantize",
    "quantize_fp4_sfa_fp16": "quantize",
    "quantize_fp4_sfa_bf16": "quantize",
    "quantize_fp4_sfa_bf16_pdl": "quantize",
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
# the public functions that issue `gemm`: the halops ones with their grouping, then the flashrt ones
HALOPS_GEMMS = {
    "dense_gemm": "dense",
    "batch_gemm": "batched",
    "group_contiguous_gemm": "contiguous",
    "group_masked_gemm": "masked",
}
FLASHRT_GEMMS = (
    "nvfp4_gemm_bf16",
    "nvfp4_gemm_fp16",
    "nvfp4_gemm_variant_bf16",
    "fp4_w4a16_linear_bf16",
    "nvfp4_gemm_streamk_bf16",
    "nvfp4_gemm_streamk_bias_bf16",
    "nvfp4_gemm_bias_bf16",
    "nvfp4_gemm_residual_bf16",
    "nvfp4_gemm_bias_residual_bf16",
    "nvfp4_gemm_bias_residual_fp16",
    "nvfp4_gemm_bias_gelu_bf16",
    "nvfp4_gemm_nvfp4",
    "nvfp4_gemm_relu2_nvfp4",
    "nvfp4_gemm_bias_gelu_nvfp4",
    "nvfp4_gemm_bias_gelu_nvfp4_fp16",
    "nvfp4_gemm_geglu_nvfp4_fp16",
    "cutlass_fp4_gemm_geglu_il_hw_v10",
    "e0m3_weight_gemm_fp16",
    "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
    "fp4_w4a4_gemm_warpsplit_mrows_bf16",
    "fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16",
    "fp4_w4a4_gemv_warpsplit_bf16",
    "nvfp4_gemm_m256_bf16",
    "nvfp4_w4a16_marlin_bf16",
)
FUNCTION_OPS.update(dict.fromkeys([*HALOPS_GEMMS, *FLASHRT_GEMMS], "gemm"))
# No kernel of the package: host arithmetic, or (the W4A16 tier's bind-time helpers) plain torch ops
# on the tensors' device.
HOST_FUNCTIONS = (
    "sfa_size_bytes",
    "capabilities",
    "nvfp4_gemm_m256_workspace_size",
    "aligned_fp4_dim",
    "allocate_w4a16_marlin_workspace",
    "adopt_nvfp4_w4a16_marlin",
)

# The representative arguments: every M tier (the decode GEMV, the largest M of the M <= 16
# kernels, the general engines, the M >= 512 tier) at N = K = 4096; grouped calls have 8 groups of
# 4 or 256 rows.
QUERY_M = (1, 16, 256, 512)
QUERY_N = QUERY_K = 4096
QUERY_GROUPS = 8
QUERY_GROUP_ROWS = (4, 256)


def _fake(*shape: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """A tensor on the GPU (a FakeTensor while capabilities records: no memory, no GPU needed)."""
    return torch.empty(shape, dtype=dtype, device="cuda")


def _values(rows: tuple[int, ...], fmt: reference.BlockFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored values [*rows, K] of a format and the swizzled scales of all their rows."""
    dtype = torch.float8_e4m3fn if fmt.element_bits == 8 else torch.uint8
    scales = _fake(reference.sf_bytes(int(torch.Size(rows).numel()), QUERY_K // fmt.group))
    return _fake(*rows, fmt.stored_cols(QUERY_K), dtype=dtype), scales


def _flashrt_arguments(function: Callable) -> Iterator[tuple[list, dict]]:
    """Candidate calls of a flashrt-style GEMM, from its parameters: each M of QUERY_M, each bias and
    residual dtype, each a_format, a workspace where it takes one (the validation keeps the valid)."""
    parameters = inspect.signature(function).parameters
    choices: list[list[tuple[str, Callable[[int], object]]]] = []
    if "bias" in parameters:
        choices.append([("bias", lambda m, d=d: _fake(QUERY_N, dtype=d)) for d in _validate.BIAS_DTYPES])
    if "residual" in parameters:
        choices.append([("residual", lambda m, d=d: _fake(m, QUERY_N, dtype=d)) for d in OUT_DTYPES.values()])
    if "a_format" in parameters:
        choices.append([("a_format", lambda m, f=f: f) for f in (0, 1)])
    if "workspace" in parameters:
        choices.append([("workspace", lambda m: _fake(m * QUERY_N))])  # above one int32 per 128 x 128 tile
    for m in QUERY_M:
        for chosen in itertools.product(*choices):
            (a, sfa), (b, sfb) = _values((m,), reference.NVFP4), _values((QUERY_N,), reference.NVFP4)
            yield [a, b, sfa, sfb], {name: make(m) for name, make in chosen}


def _w4a16_arguments(function: Callable) -> Iterator[tuple[list, dict]]:
    """Candidate calls of nvfp4_w4a16_marlin_bf16: bf16 x of each M of QUERY_M (and one above the
    m256 tier's 512: the W4A16 tier serves every M), the adopted NVFP4 weight."""
    for m in (*QUERY_M, 1024):
        x = _fake(m, QUERY_K, dtype=torch.bfloat16)
        b, sfb = _values((QUERY_N,), reference.NVFP4)
        yield [x, b, sfb, _fake(1, dtype=torch.float32)], {"workspace": _fake(1, dtype=torch.int32)}


def _halops_arguments(function: Callable, weight_only: bool = False) -> Iterator[tuple[list, dict]]:
    """Candidate calls of a halops GEMM: each mode (the w4a16 ones when weight_only), with and without
    a bias, alpha given (required in w4a4-nvfp4); grouped ones with QUERY_GROUPS groups of each of
    QUERY_GROUP_ROWS rows."""
    grouping = HALOPS_GEMMS[function.__name__]
    groups = 1 if grouping == "dense" else QUERY_GROUPS
    n = QUERY_N
    for mode, fmt in (reference.W4A16_MODES if weight_only else reference.MODES).items():
        for rows, with_bias in itertools.product(QUERY_M if grouping == "dense" else QUERY_GROUP_ROWS, (False, True)):
            a_rows = (groups, rows) if grouping == "batched" else (groups * rows,)
            a, sfa = (_fake(*a_rows, QUERY_K, dtype=torch.bfloat16), None) if weight_only else _values(a_rows, fmt)
            b, sfb = _values((n,) if grouping == "dense" else (groups, n), fmt)
            out = _fake(*a.shape[:-1], n, dtype=torch.bfloat16)
            index = {"contiguous": (groups * rows,), "masked": (groups,)}.get(grouping)  # expert ids, counts
            group_index = [] if index is None else [_fake(*index, dtype=torch.int32)]
            kwargs = {"mode": mode, "alpha": _fake(groups, dtype=torch.float32)}
            if with_bias:
                kwargs["bias"] = _fake(*b.shape[:-2], n, dtype=torch.bfloat16)
            if grouping == "masked":
                kwargs["max_m_per_expert"] = rows
            yield [a, b, sfa, sfb, *group_index, out], kwargs


class _GemmRecorder(TorchDispatchMode):
    """Records the `gemm` calls made while active, without running them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[GemmCall] = []

    def __torch_dispatch__(self, func: object, types: object, args: tuple = (), kwargs: dict | None = None) -> object:
        if func == GEMM_OP:
            self.calls.append(GemmCall.from_op_arguments(*args, **(kwargs or {})))
            return None
        return func(*args, **(kwargs or {}))


def _on_meta(call: GemmCall) -> GemmCall:
    """The same call on meta tensors, which GemmCall.backends reads as aligned buffers."""
    meta = (torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v for v in call)
    return GemmCall(*meta)


@functools.cache
def gemm_calls(function: str, weight_only: bool = False) -> tuple[GemmCall, ...]:
    """The `gemm` calls a public GEMM function makes for its representative arguments, on meta tensors
    (a halops GEMM's weight-only w4a16 modes when weight_only)."""
    if function in HALOPS_GEMMS:
        fn = getattr(_halops, function)
        candidates = functools.partial(_halops_arguments, weight_only=weight_only)
    elif function == "nvfp4_w4a16_marlin_bf16":
        fn, candidates = getattr(_nvfp4, function), _w4a16_arguments
    else:
        fn, candidates = getattr(_nvfp4, function), _flashrt_arguments
    recorder = _GemmRecorder()
    with FakeTensorMode(), recorder:
        for args, kwargs in candidates(fn):
            try:
                fn(*args, **kwargs)
            except ValueError:
                continue  # not a call the function accepts
    if not recorder.calls:
        raise RuntimeError(f"capabilities: no representative call of {function} is valid")
    return tuple(_on_meta(call) for call in recorder.calls)


def built_archs() -> list[str]:
    """CUDA capabilities compiled into this build (from the variant's metadata.json)."""
    metadata = Path(__file__).with_name("metadata.json")
    if not metadata.exists():
        return []
    return list(json.loads(metadata.read_text())["backend"]["archs"])


def op_status(function: str, op: str, arch: str, built: list[str], weight_only: bool = False) -> str:
    if op not in NATIVE_CUDA_OPS:
        return "reference"  # PyTorch ops on the device: any CUDA GPU
    if ARCHS[arch] not in built:
        return "unsupported"  # the kernel exists, but this build has no code for the arch
    if op == "gemm" and not all(call.backend(int(arch[3:])) for call in gemm_calls(function, weight_only)):
        return "reference"
    return "native" if arch in RUN_ARCHS else "native (compile-verified)"


@functools.cache
def _function_status() -> dict[str, dict[str, str]]:
    built = built_archs()
    table = {
        name: {arch: op_status(name, op, arch, built) for arch in ARCHS} | {"cpu": "reference"}
        for name, op in FUNCTION_OPS.items()
    }
    for name in HOST_FUNCTIONS:
        table[name] = {arch: "native" for arch in ARCHS} | {"cpu": "native"}
    return table


@functools.cache
def _w4a16_mode_status() -> dict[str, dict[str, str]]:
    built = built_archs()
    return {
        name: {arch: op_status(name, "gemm", arch, built, weight_only=True) for arch in ARCHS} | {"cpu": "reference"}
        for name in HALOPS_GEMMS
    }


def function_status() -> dict[str, dict[str, str]]:
    """Per public function, per arch and cpu: its status (a fresh copy: the table depends only on the build)."""
    return {name: dict(status) for name, status in _function_status().items()}


def flashrt_keys() -> dict[str, object]:
    """The keys the flashrt package's capabilities() returns, with this package's values: its tiers run
    on every arch here, sm_120 included. No sm_120 GPU has run them, so no (N, K) is qualified there;
    its W4A16 tier reads the adopted weight as ModelOpt stores it, with SfAtom scales, at any M."""
    return {
        "quantization": "W4A4 NVFP4 E2M1",
        "block_size": NVFP4_BLOCK_SIZE,
        "scale_layout": "pad128(rows) x pad4(dim/16), 512 bytes per tile",
        "scale_size": "ceil(rows/128) * ceil((dim/16)/4) * 512 bytes",
        "layouts": SUPPORTED_LAYOUTS,
        "cuda_capabilities": SUPPORTED_CUDA_CAPABILITIES,
        "public_m_alignment": 1,
        "raw_sm120_tile_m": 128,  # the default tile's rows (csrc/gemm/blackwell/args.h)
        "sm120_m256_min_m": _validate.M256_MIN_M,
        "sm120_m256_qualified_nk": (),
        "sm120_m256_diagnostic_nk": (),
        "sm120_interleaved_gemv_m": 1,
        "sm120_interleaved_weight_layout": "fp4-gemm-stream-8x64",
        "sm120_warpsplit_mrows": (1, _validate.MROWS_MAX_M),
        "sm120_warpsplit_mrows_n_alignment": 8,
        "sm120_warpsplit_mrows_k_alignment": "64 * warps",
        "sm120_w4a16_marlin_m": "any M >= 1",
        "sm120_w4a16_marlin_n_alignment": 1,
        "sm120_w4a16_marlin_k_alignment": _validate.W4A16_K_ALIGNMENT,
        "sm120_w4a16_marlin_weight_layout": "row-major-packed-e2m1",
        "sm120_w4a16_marlin_scale_layout": "cutlass-sm1xx-blockscaled",
        "errors": "exceptions",
    }


def capabilities() -> dict[str, object]:
    """The public contract: formats, scale layout, alignments, tiers, archs and per-function status,
    and the flashrt package's keys (flashrt_keys) beside them."""
    return flashrt_keys() | {
        "package": "fp4-gemm",
        "formats": {
            name: {"element": fmt.element, "scale": fmt.scale, "block_size": fmt.group}
            for name, fmt in reference.FORMATS.items()
        },
        "halops_modes": {mode: fmt.name for mode, fmt in reference.MODES.items()},
        # this package's weight-only modes of the halops GEMMs (bf16 activations), and where they run
        "halops_w4a16_modes": {mode: fmt.name for mode, fmt in reference.W4A16_MODES.items()},
        "halops_w4a16_status": {name: dict(status) for name, status in _w4a16_mode_status().items()},
        "swizzled_scale_layout": {
            "name": "cutlass-sm1xx-sfatom",
            "tile_rows": reference.SF_TILE_ROWS,
            "tile_blocks": reference.SF_TILE_COLS,
            "tile_bytes": reference.SF_TILE_BYTES,
            "offset": "((m // 128) * ceil(nkb / 4) + kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4",
            "size_bytes": "ceil(rows / 128) * ceil(nkb / 4) * 512",
        },
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
        "variant_tiles": {arch: dict(VARIANT_TILES[ARCHS[arch]]) for arch in ARCHS},
        "variant_hints": dict(_validate.FLASHRT_VARIANTS),  # flashrt's schedule ids -> the variant that runs
        "built_cuda_capabilities": tuple(built_archs()),
        "gemm_backends": tuple(f"sm_{cc}" for cc in ops.gemm_backend_archs()),
        "run_archs": tuple(sorted(RUN_ARCHS)),
        # a GPU this build has no code for, loaded with check_arch=False: each op's <op>_reference twin
        "other_cuda_archs": "reference",
        "functions": function_status(),
        "error_types": "ValueError before launch for every rule; RuntimeError from CUDA",
    }


def sfa_size_bytes(rows: int, dim: int) -> int:
    """Bytes of the swizzled NVFP4 scale buffer of a [rows, dim] matrix: ceil(rows/128) * ceil(dim/16/4) * 512."""
    _validate.positive_int("rows", rows)
    _validate.positive_int("dim", dim)
    _validate.multiple("dim", dim, 16, "NVFP4 blocks of 16")
    return reference.sf_bytes(rows, dim // reference.NVFP4.group)
