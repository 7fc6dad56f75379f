"""One valid call of every public function, built on any device: the harness of the API-wide tests.

`make_call(name, device, seed)` returns (args, kwargs) for `fp4.<name>`. Inputs are quantized from
random data by the reference itself on the CPU, then moved, so the CPU and CUDA calls see the same
bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from conftest import load_reference

ref = load_reference()

M, N, K = 40, 64, 128  # small, rows not a multiple of 128
E, MAX_M = 3, 48  # MoE experts and rows per expert


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def flat_operand(x: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """x quantized with its flat scale buffer (what the flashrt-style quantizers return)."""
    values, scales = ref.quantize(x, fmt, swizzle=True)
    return values, scales.reshape(-1)


def nvfp4_operand(rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return flat_operand(_rand(rows, k, seed=seed), ref.NVFP4)


def mode_operand(rows: int, k: int, mode: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x quantized in a halops mode, with the 2-D scale view group_wise_quant returns."""
    return ref.quantize(_rand(rows, k, seed=seed), ref.MODES[mode], swizzle=True)


def _to(value: object, device: str) -> object:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value


def _gemm_operands(seed: int, n: int = N, m: int = M, k: int = K) -> list[torch.Tensor]:
    a, sfa = nvfp4_operand(m, k, seed)
    b, sfb = nvfp4_operand(n, k, seed + 1)
    return [a, b, sfa, sfb]


def _halops(grouping: str, mode: str, seed: int) -> tuple[list, dict]:
    kwargs: dict = {"mode": mode}
    if mode == "w4a4-nvfp4":
        kwargs["alpha"] = torch.full((1 if grouping == "dense" else E,), 0.5)
    if grouping == "dense":
        a, sfa = mode_operand(M, K, mode, seed)
        w, sfb = mode_operand(N, K, mode, seed + 1)
        out = torch.full((M, N), 7.0, dtype=torch.bfloat16)
        kwargs["bias"] = _rand(N, seed=seed + 2)
        return [a, w, sfa, sfb, out], kwargs
    if grouping == "batched":
        a, sfa = mode_operand(E * M, K, mode, seed)
        w, sfb = mode_operand(E * N, K, mode, seed + 1)
        out = torch.full((E, M, N), 7.0, dtype=torch.bfloat16)
        return [a.reshape(E, M, -1), w.reshape(E, N, -1), sfa, sfb, out], kwargs
    rows = E * MAX_M
    a, sfa = mode_operand(rows, K, mode, seed)
    w, sfb = mode_operand(E * N, K, mode, seed + 1)
    out = torch.full((rows, N), 7.0, dtype=torch.bfloat16)
    kwargs["bias"] = _rand(E, N, seed=seed + 2)
    if grouping == "contiguous":
        ids = torch.tensor([0] * 50 + [-1] * 10 + [1] * 30 + [2] * (rows - 90), dtype=torch.int32)
        return [a, w.reshape(E, N, -1), sfa, sfb, ids, out], kwargs
    masked_m = torch.tensor([MAX_M, 5, 0], dtype=torch.int32)
    return [a, w.reshape(E, N, -1), sfa, sfb, masked_m, out], {**kwargs, "max_m_per_expert": MAX_M}


def _quantizer(dtype: torch.dtype) -> Callable[[int], tuple[list, dict]]:
    return lambda seed: ([_rand(M, K, seed=seed, dtype=dtype)], {})


def _permute(seed: int) -> tuple[list, dict]:
    """Even seeds: bf16 tokens with int32 broadcast scales; odd seeds: E4M3 tokens with uint8 scales."""
    tokens, hidden, topk = 50, 512, 3
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, E, (tokens, topk), generator=g, dtype=torch.int64)
    if seed % 2 == 0:
        scale = torch.randint(100, 140, (tokens, hidden // 512), generator=g, dtype=torch.int32) * 0x01010101
        return [_rand(tokens, hidden, seed=seed), scale, ids, E, 128], {}
    scale = torch.randint(100, 140, (tokens, hidden // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    return [_rand(tokens, hidden, seed=seed, dtype=torch.float8_e4m3fn), scale, ids, E, 128], {}


CASES: dict[str, Callable[[int], tuple[list, dict]]] = {
    "group_wise_quant": lambda seed: ([_rand(M, K, seed=seed)], {"mode": "w4a4-nvfp4"}),
    "dense_gemm": lambda seed: _halops("dense", "w8a8-mxfp8", seed),
    "batch_gemm": lambda seed: _halops("batched", "w4a4-mxfp4", seed),
    "group_contiguous_gemm": lambda seed: _halops("contiguous", "w4a4-nvfp4", seed),
    "group_masked_gemm": lambda seed: _halops("masked", "w8a8-mxfp8", seed),
    "fused_swiglu_quant": lambda seed: (
        [_rand(E * MAX_M, 2 * 64, seed=seed), torch.tensor([MAX_M, 7, 0], dtype=torch.int32)],
        {"is_fp4": True},
    ),
    "prefill_permute_to_masked_gemm": _permute,
    "quantize_fp4_sfa_fp16": _quantizer(torch.float16),
    "quantize_fp4_sfa_bf16": _quantizer(torch.bfloat16),
    "quantize_fp4_sfa_mse_fp16": _quantizer(torch.float16),
    "quantize_fp4_sfa_mse_bf16": _quantizer(torch.bfloat16),
    "quantize_fp4_sfa_padded_bf16": lambda seed: ([_rand(M, 100, seed=seed)], {}),
    "pack_nvfp4_weight_bf16": lambda seed: ([_rand(50, 100, seed=seed), _rand(50, seed=seed + 1)], {"mse": True}),
    "quantize_e0m3_sfa_fp16": _quantizer(torch.float16),
    "dequantize_fp4_sfa_fp16": lambda seed: (list(nvfp4_operand(M, K, seed)), {}),
    "nvfp4_gemm_bf16": lambda seed: (_gemm_operands(seed), {"alpha": 0.75}),
    "nvfp4_gemm_fp16": lambda seed: (_gemm_operands(seed), {}),
    "nvfp4_gemm_variant_bf16": lambda seed: (_gemm_operands(seed), {"variant": 1}),
    "nvfp4_gemm_nvfp4": lambda seed: (_gemm_operands(seed), {}),
    "nvfp4_gemm_geglu_nvfp4_fp16": lambda seed: (_gemm_operands(seed), {}),
    "cutlass_fp4_gemm_geglu_il_hw_v10": lambda seed: (_gemm_operands(seed), {}),
    "nvfp4_gemm_bias_gelu_nvfp4_fp16": lambda seed: (
        _gemm_operands(seed) + [_rand(N, seed=seed + 5, dtype=torch.float16)],
        {},
    ),
    "nvfp4_gemm_bias_residual_fp16": lambda seed: (
        _gemm_operands(seed)
        + [_rand(N, seed=seed + 5, dtype=torch.float16), _rand(M, N, seed=seed + 6, dtype=torch.float16)],
        {},
    ),
    "nvfp4_gemm_bias_bf16": lambda seed: (_gemm_operands(seed) + [_rand(N, seed=seed + 5)], {"alpha": 2.0}),
    "nvfp4_gemm_bias_residual_bf16": lambda seed: (
        _gemm_operands(seed) + [_rand(N, seed=seed + 5), _rand(M, N, seed=seed + 6)],
        {},
    ),
    "nvfp4_gemm_residual_bf16": lambda seed: (_gemm_operands(seed) + [_rand(M, N, seed=seed + 6)], {}),
    "nvfp4_gemm_bias_gelu_bf16": lambda seed: (_gemm_operands(seed) + [_rand(N, seed=seed + 5)], {}),
    "nvfp4_gemm_bias_gelu_nvfp4": lambda seed: (_gemm_operands(seed) + [_rand(N, seed=seed + 5)], {}),
    "nvfp4_gemm_streamk_bf16": lambda seed: (_gemm_operands(seed), {}),
    "nvfp4_gemm_streamk_bias_bf16": lambda seed: (_gemm_operands(seed) + [_rand(N, seed=seed + 5)], {}),
    "fp4_w4a16_linear_bf16": lambda seed: (_gemm_operands(seed), {}),
    "fp4_repack_b_interleaved_sm120": lambda seed: ([nvfp4_operand(N, K, seed)[0]], {}),
    "fp4_w4a4_gemv_warpsplit_interleaved_bf16": lambda seed: _gemv(seed),
    "fp4_w4a4_gemm_warpsplit_mrows_bf16": lambda seed: (_gemm_operands(seed, m=16), {"warps": 2}),
    "nvfp4_gemm_m256_bf16": lambda seed: _m256(seed),
    "e0m3_weight_gemm_fp16": lambda seed: _e0m3(seed),
    "nvfp4_gemm_relu2_nvfp4": lambda seed: (_gemm_operands(seed), {}),
    "sfa_size_bytes": lambda seed: ([300, 5120], {}),
    "aligned_fp4_dim": lambda seed: ([4304], {"alignment": 32}),
    "quantize_fp4_sfa_bf16_pdl": _quantizer(torch.bfloat16),
    "fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16": lambda seed: (_gemm_operands(seed, m=16), {"warps": 2}),
    "fp4_w4a4_gemv_warpsplit_bf16": lambda seed: (_gemm_operands(seed, m=1), {"warps": 2, "stages": 2}),
    "allocate_w4a16_marlin_workspace": lambda seed: (["cpu"], {}),
    "adopt_nvfp4_w4a16_marlin": lambda seed: _modelopt_layer(seed),
    "nvfp4_w4a16_marlin_bf16": lambda seed: _w4a16(seed),
    "nvfp4_gemm_m256_workspace_size": lambda seed: (_gemm_operands(seed, m=512), {}),
}


def _modelopt_layer(seed: int) -> tuple[list, dict]:
    """One ModelOpt NVFP4 layer: packed codes [N, K/2], row-major e4m3 scales [N, K/16], scale_2."""
    b, sfb = nvfp4_operand(N, K, seed)
    plain = ref.unswizzle_scales(sfb, N, K // 16).contiguous().view(torch.float8_e4m3fn)
    return [b, plain, torch.tensor([0.5], dtype=torch.float32)], {}


def _w4a16(seed: int) -> tuple[list, dict]:
    b, sfb = nvfp4_operand(N, K, seed + 1)
    workspace = torch.zeros(1, dtype=torch.int32)
    return [_rand(M, K, seed=seed), b, sfb, torch.tensor([0.5], dtype=torch.float32)], {"workspace": workspace}


def _gemv(seed: int) -> tuple[list, dict]:
    a, b, sfa, sfb = _gemm_operands(seed, m=1)
    return [a, ref.interleave_rows(b), sfa, sfb], {"warps": 2, "stages": 2}


def _m256(seed: int) -> tuple[list, dict]:
    a, b, sfa, sfb = _gemm_operands(seed, m=512)
    tiles = -(-512 // 128) * -(-N // 128)  # one int32 counter per 128 x 128 output tile, in 256-byte units
    return [a, b, sfa, sfb], {"workspace": torch.zeros(-(-4 * tiles // 256) * 256, dtype=torch.uint8)}


def _e0m3(seed: int) -> tuple[list, dict]:
    a, sfa = flat_operand(_rand(M, K, seed=seed, dtype=torch.float16), ref.E0M3)
    b, sfb = flat_operand(_rand(N, K, seed=seed + 1, dtype=torch.float16), ref.E0M3)
    return [a, b, sfa, sfb], {"a_format": 0}


def make_call(name: str, device: str, seed: int = 0) -> tuple[list, dict]:
    args, kwargs = CASES[name](seed)
    return [_to(a, device) for a in args], {k: _to(v, device) for k, v in kwargs.items()}


HALOPS_GEMMS = ("dense_gemm", "batch_gemm", "group_contiguous_gemm", "group_masked_gemm")


def outcome(name: str, returned: object, args: list) -> object:
    """What a call produced: its return value, or the output tensor a halops GEMM wrote in place."""
    return args[-1] if name in HALOPS_GEMMS else returned
