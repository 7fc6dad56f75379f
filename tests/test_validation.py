"""Bad input raises ValueError naming the rule, before anything runs.

Every rule of _validate.py that a public function reaches has a case here: the valid CPU call of
api_cases.make_call (which test_api.py runs), broken in one place, and a fragment of the message
that states the rule. One place is one argument, except where the rule ties two arguments together
(K of both operands, a caller buffer pair): then both change and only that rule breaks.

"Before anything runs": the call dispatches none of the package's ops and leaves caller buffers as
they were.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from api_cases import make_call
from checks import OpRecorder
from conftest import DEVICES
from torch._subclasses.fake_tensor import FakeTensorMode

pytestmark = pytest.mark.kernels_ci

Mutation = Callable[[list, dict], None]


# ---- how a call is broken ---------------------------------------------------------------------


def arg(index: int, change: object) -> Mutation:
    """Replace positional argument `index` by `change(old)` if change is callable, else by `change`."""

    def mutate(args: list, kwargs: dict) -> None:
        args[index] = change(args[index]) if callable(change) else change

    return mutate


def kwarg(key: str, change: object) -> Mutation:
    """Set keyword argument `key` to `change(old)` if change is callable, else to `change`."""

    def mutate(args: list, kwargs: dict) -> None:
        kwargs[key] = change(kwargs.get(key)) if callable(change) else change

    return mutate


def both(*mutations: Mutation) -> Mutation:
    """Several arguments changed together to break one rule that ties them."""

    def mutate(args: list, kwargs: dict) -> None:
        for m in mutations:
            m(args, kwargs)

    return mutate


def retyped(dtype: torch.dtype) -> Callable:
    return lambda t: torch.zeros(t.shape, dtype=dtype)


def rows(n: int) -> Callable:
    return lambda t: torch.zeros((n, *t.shape[1:]), dtype=t.dtype)


def cols(n: int) -> Callable:
    return lambda t: torch.zeros((*t.shape[:-1], n), dtype=t.dtype)


def zeros(*shape: int, dtype: torch.dtype) -> Callable:
    return lambda _: torch.zeros(shape, dtype=dtype)


def ints(*values: int, dtype: torch.dtype = torch.int32) -> Callable:
    return lambda _: torch.tensor(values, dtype=dtype)


def one_byte_short(t: torch.Tensor) -> torch.Tensor:
    return t.flatten()[:-1].clone()


def one_byte_long(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.flatten(), t.new_zeros(1)])


def flat(t: torch.Tensor) -> torch.Tensor:
    return t.flatten()


def batched(t: torch.Tensor) -> torch.Tensor:
    return t[None]


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values and shape, every other element of a wider buffer: not contiguous."""
    out = t.new_empty(*t.shape, 2)[..., 0]
    out.copy_(t)
    return out


def on_meta(t: torch.Tensor) -> torch.Tensor:
    return t.to("meta")


def on_cuda(t: torch.Tensor) -> torch.Tensor:
    """A tensor that says it is on cuda:0 (a FakeTensor: no GPU needed); only metadata is read."""
    with FakeTensorMode():
        return torch.empty(t.shape, dtype=t.dtype, device="cuda")


def case(function: str, what: str, mutation: Mutation, rule: str, *marks: pytest.MarkDecorator) -> object:
    return pytest.param(function, mutation, rule, id=f"{function}-{what}", marks=marks)


# ---- the rules --------------------------------------------------------------------------------

U8, I32, I64, BF16, FP16, FP32, FP8 = (
    torch.uint8, torch.int32, torch.int64, torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn,
)  # fmt: skip
SAME_DEVICE = "all tensors must be on one device"
NOT_CPU_OR_CUDA = "must be a CPU or CUDA tensor, got device meta"
SM_COUNT = "sm_count must be -1 (all SMs) or a positive integer"
ALIGNMENT = "alignment must be a positive multiple of 16"
A_FORMAT = "a_format must be 1 (E2M1 activations) or 0 (E0M3 activations)"
WARPS = "warps must be one of (2, 4, 8)"
STAGES = "stages must be an integer in [1, 8]"
PASS_BOTH_OUT = "pass both out_packed and out_sfa, or neither"
PASS_BOTH_QUANT = "pass both packed and sfa, or neither"

# group_wise_quant: input bf16 [40, 128], mode "w4a4-nvfp4" (test_group_wise_quant_rejects_bad_input has more)
GROUP_WISE_QUANT = [
    case(
        "group_wise_quant",
        "input-dtype",
        arg(0, retyped(FP32)),
        "input must have dtype torch.bfloat16 or torch.float16",
    ),
    case("group_wise_quant", "input-rank", arg(0, batched), "input must be 2-D"),
    case(
        "group_wise_quant",
        "k-not-block-multiple",
        arg(0, cols(40)),
        "input.shape[1] (K) (40) must be a positive multiple of 16 (blocks of 16 in mode 'w4a4-nvfp4')",
    ),
    case("group_wise_quant", "mode-unknown", kwarg("mode", "nvfp4"), "mode must be one of"),
]

# dense_gemm: mxfp8, input [40, 128] fp8, weight [64, 128] fp8, output bf16 [40, 64], bias [64]
DENSE = [
    case("dense_gemm", "input-not-a-tensor", arg(0, [[0]]), "input must be a torch.Tensor, got list"),
    case("dense_gemm", "input-dtype", arg(0, retyped(BF16)), "input must have dtype torch.float8_e4m3fn"),
    case("dense_gemm", "weight-dtype", arg(1, retyped(U8)), "weight must have dtype torch.float8_e4m3fn"),
    case("dense_gemm", "input-rank", arg(0, batched), "input must be 2-D"),
    case("dense_gemm", "weight-rank", arg(1, flat), "weight must be 2-D"),
    case("dense_gemm", "input-non-contiguous", arg(0, strided), "input must be contiguous"),
    case("dense_gemm", "weight-non-contiguous", arg(1, strided), "weight must be contiguous"),
    case("dense_gemm", "input-on-meta", arg(0, on_meta), "input " + NOT_CPU_OR_CUDA),
    case("dense_gemm", "k-mismatch", arg(1, cols(96)), "input and weight must have the same K"),
    case(
        "dense_gemm",
        "k-not-block-multiple",
        both(arg(0, cols(48)), arg(1, cols(48))),
        "K (48) must be a positive multiple of 32",
    ),
    case("dense_gemm", "sfa-size", arg(2, one_byte_short), "sfa must hold the swizzled scales of 40 rows x 4 blocks"),
    case("dense_gemm", "sfb-size", arg(3, one_byte_long), "sfb must hold the swizzled scales of 64 rows x 4 blocks"),
    case("dense_gemm", "sfa-dtype", arg(2, retyped(torch.int8)), "sfa must have dtype torch.uint8"),
    case("dense_gemm", "sfb-non-contiguous", arg(3, strided), "sfb must be contiguous"),
    case("dense_gemm", "output-missing", arg(4, None), "output must be a torch.Tensor, got NoneType"),
    case("dense_gemm", "output-dtype", arg(4, retyped(FP32)), "output must have dtype torch.bfloat16"),
    case("dense_gemm", "output-shape", arg(4, cols(32)), "output must have shape (40, 64), got (40, 32)"),
    case("dense_gemm", "output-on-meta", arg(4, on_meta), "output " + NOT_CPU_OR_CUDA),
    case("dense_gemm", "output-on-cuda", arg(4, on_cuda), SAME_DEVICE),
    case("dense_gemm", "bias-dtype", kwarg("bias", retyped(FP32)), "bias must have dtype torch.bfloat16, got"),
    case("dense_gemm", "bias-shape", kwarg("bias", zeros(32, dtype=BF16)), "bias must have shape (64,), got (32,)"),
    case("dense_gemm", "bias-on-meta", kwarg("bias", on_meta), "bias " + NOT_CPU_OR_CUDA),
    case("dense_gemm", "bias-on-cuda", kwarg("bias", on_cuda), SAME_DEVICE),
    case("dense_gemm", "alpha-shape", kwarg("alpha", zeros(2, dtype=FP32)), "alpha must have shape (1,), got (2,)"),
    case("dense_gemm", "alpha-dtype", kwarg("alpha", zeros(1, dtype=BF16)), "alpha must have dtype torch.float32"),
    case("dense_gemm", "alpha-python-float", kwarg("alpha", 0.5), "alpha must be a torch.Tensor, got float"),
    case("dense_gemm", "mode-unknown", kwarg("mode", "w4a8-int4"), "mode must be one of"),
    case("dense_gemm", "sm-count-0", kwarg("sm_count", 0), SM_COUNT),
    case("dense_gemm", "sm-count-minus-2", kwarg("sm_count", -2), SM_COUNT),
    case("dense_gemm", "sm-count-bool", kwarg("sm_count", True), SM_COUNT),
    case("dense_gemm", "sm-count-float", kwarg("sm_count", 8.0), SM_COUNT),
]

# batch_gemm: mxfp4, input [3, 40, 64] packed, weight [3, 64, 64] packed, output [3, 40, 64]
BATCH = [
    case("batch_gemm", "weight-batch", arg(1, lambda t: t[:2]), "weight must have one matrix per batch item: 2 != 3"),
    case("batch_gemm", "input-rank", arg(0, lambda t: t.reshape(120, 64)), "input must be 3-D"),
    case("batch_gemm", "weight-rank", arg(1, lambda t: t.reshape(192, 64)), "weight must be 3-D"),
    case("batch_gemm", "input-dtype", arg(0, retyped(FP8)), "input must have dtype torch.uint8"),
    case("batch_gemm", "k-mismatch", arg(1, cols(32)), "input and weight must have the same K"),
    case(
        "batch_gemm",
        "k-not-block-multiple",
        both(arg(0, cols(8)), arg(1, cols(8))),
        "K (16) must be a positive multiple of 32",
    ),
    case("batch_gemm", "sfa-size", arg(2, one_byte_short), "sfa must hold the swizzled scales of 120 rows"),
    case("batch_gemm", "sfb-size", arg(3, one_byte_short), "sfb must hold the swizzled scales of 192 rows"),
    case("batch_gemm", "output-shape", arg(4, lambda t: t.reshape(120, 64)), "output must have shape (3, 40, 64)"),
    case("batch_gemm", "bias-shape", kwarg("bias", zeros(64, dtype=BF16)), "bias must have shape (3, 64), got (64,)"),
    case("batch_gemm", "alpha-shape", kwarg("alpha", zeros(1, dtype=FP32)), "alpha must have shape (3,), got (1,)"),
    case("batch_gemm", "mode-unknown", kwarg("mode", "mxfp4"), "mode must be one of"),
    case("batch_gemm", "sm-count-0", kwarg("sm_count", 0), SM_COUNT),
]

# group_contiguous_gemm: nvfp4, input [144, 64], weight [3, 64, 64], expert_ids int32 [144],
# output [144, 64], alpha float32 [3], bias bf16 [3, 64]
CONTIGUOUS = [
    case(
        "group_contiguous_gemm",
        "alpha-missing-nvfp4",
        kwarg("alpha", None),
        "alpha (float32 tensor) is required in mode 'w4a4-nvfp4'",
    ),
    case("group_contiguous_gemm", "alpha-shape", kwarg("alpha", zeros(1, dtype=FP32)), "alpha must have shape (3,)"),
    case("group_contiguous_gemm", "alpha-rank", kwarg("alpha", zeros(3, 1, dtype=FP32)), "alpha must have shape (3,)"),
    case("group_contiguous_gemm", "expert-ids-unsorted", arg(4, lambda t: t.flip(0)), "expert_ids must be sorted"),
    case(
        "group_contiguous_gemm",
        "expert-ids-padding-inside-an-expert",
        arg(4, lambda t: torch.where(torch.arange(t.numel()) == 100, -1, t)),
        "each expert's rows must be consecutive",
    ),
    case(
        "group_contiguous_gemm",
        "expert-ids-above-range",
        arg(4, lambda t: torch.where(t == 2, 3, t)),
        "expert_ids must lie in [0, 3) or be -1",
    ),
    case(
        "group_contiguous_gemm",
        "expert-ids-below-minus-1",
        arg(4, lambda t: torch.where(t == -1, -2, t)),
        "expert_ids must lie in [0, 3) or be -1",
    ),
    case(
        "group_contiguous_gemm",
        "expert-ids-int64",
        arg(4, lambda t: t.long()),
        "expert_ids must have dtype torch.int32",
    ),
    case("group_contiguous_gemm", "expert-ids-length", arg(4, lambda t: t[:-1]), "expert_ids must have shape (144,)"),
    case("group_contiguous_gemm", "expert-ids-missing", arg(4, None), "expert_ids must be a torch.Tensor"),
    case("group_contiguous_gemm", "expert-ids-non-contiguous", arg(4, strided), "expert_ids must be contiguous"),
    case("group_contiguous_gemm", "expert-ids-on-cuda", arg(4, on_cuda), SAME_DEVICE),
    case("group_contiguous_gemm", "weight-rank", arg(1, lambda t: t.reshape(192, 64)), "weight must be 3-D"),
    case(
        "group_contiguous_gemm",
        "k-not-block-multiple",
        both(arg(0, cols(4)), arg(1, cols(4))),
        "K (8) must be a positive multiple of 16",
    ),
    case("group_contiguous_gemm", "sfb-size", arg(3, one_byte_short), "sfb must hold the swizzled scales of 192 rows"),
    case("group_contiguous_gemm", "bias-shape", kwarg("bias", zeros(64, dtype=BF16)), "bias must have shape (3, 64)"),
    case("group_contiguous_gemm", "output-shape", arg(5, rows(100)), "output must have shape (144, 64)"),
]

# group_masked_gemm: mxfp8, input [144, 128], weight [3, 64, 128], masked_m int32 [48, 5, 0],
# output [144, 64], bias [3, 64], max_m_per_expert 48
MASKED = [
    case("group_masked_gemm", "max-m-0", kwarg("max_m_per_expert", 0), "max_m_per_expert must be an integer >= 1"),
    case(
        "group_masked_gemm",
        "max-m-negative",
        kwarg("max_m_per_expert", -48),
        "max_m_per_expert must be an integer >= 1",
    ),
    case(
        "group_masked_gemm", "max-m-float", kwarg("max_m_per_expert", 48.0), "max_m_per_expert must be an integer >= 1"
    ),
    case(
        "group_masked_gemm",
        "input-rows-not-experts-times-max-m",
        kwarg("max_m_per_expert", 40),
        "input must have num_experts * max_m_per_expert = 3 * 40 rows, got 144",
    ),
    case("group_masked_gemm", "masked-m-above-max-m", arg(4, ints(49, 5, 0)), "masked_m must lie in [0, 48]"),
    case("group_masked_gemm", "masked-m-negative", arg(4, ints(48, -1, 0)), "masked_m must lie in [0, 48]"),
    case("group_masked_gemm", "masked-m-int64", arg(4, lambda t: t.long()), "masked_m must have dtype torch.int32"),
    case("group_masked_gemm", "masked-m-length", arg(4, ints(48, 5)), "masked_m must have shape (3,), got (2,)"),
    case("group_masked_gemm", "masked-m-on-cuda", arg(4, on_cuda), SAME_DEVICE),
    case("group_masked_gemm", "output-shape", arg(5, rows(48)), "output must have shape (144, 64)"),
    case("group_masked_gemm", "weight-dtype", arg(1, retyped(U8)), "weight must have dtype torch.float8_e4m3fn"),
    case("group_masked_gemm", "sfa-size", arg(2, one_byte_short), "sfa must hold the swizzled scales of 144 rows"),
    case("group_masked_gemm", "mode-unknown", kwarg("mode", "w8a8"), "mode must be one of"),
    case("group_masked_gemm", "sm-count-minus-2", kwarg("sm_count", -2), SM_COUNT),
]

# fused_swiglu_quant: input bf16 [144, 128], token_nums_per_expert int32 [48, 7, 0], is_fp4=True
SWIGLU = [
    case(
        "fused_swiglu_quant",
        "rows-not-multiple-of-experts",
        arg(1, ints(48, 7, 0, 0, 0)),
        "input rows (144) must be num_experts (5) * rows per expert",
    ),
    case("fused_swiglu_quant", "no-experts", arg(1, ints()), "input rows (144) must be num_experts (0)"),
    case("fused_swiglu_quant", "is-fp4-int", kwarg("is_fp4", 1), "is_fp4 must be a bool, got int"),
    case("fused_swiglu_quant", "is-fp4-none", kwarg("is_fp4", None), "is_fp4 must be a bool, got NoneType"),
    case(
        "fused_swiglu_quant",
        "token-count-above-rows-per-expert",
        arg(1, ints(49, 7, 0)),
        "token_nums_per_expert must lie in [0, 48]",
    ),
    case(
        "fused_swiglu_quant",
        "token-count-negative",
        arg(1, ints(48, -7, 0)),
        "token_nums_per_expert must lie in [0, 48]",
    ),
    case(
        "fused_swiglu_quant",
        "width-not-multiple-of-2-nvfp4-blocks",
        arg(0, cols(80)),
        "input.shape[1] (2 * hidden_size) (80) must be a positive multiple of 32",
    ),
    case(
        "fused_swiglu_quant",
        "width-not-multiple-of-2-mxfp8-blocks",
        both(arg(0, cols(96)), kwarg("is_fp4", False)),
        "input.shape[1] (2 * hidden_size) (96) must be a positive multiple of 64",
    ),
    case("fused_swiglu_quant", "input-dtype", arg(0, retyped(FP16)), "input must have dtype torch.bfloat16"),
    case("fused_swiglu_quant", "input-rank", arg(0, flat), "input must be 2-D"),
    case("fused_swiglu_quant", "input-non-contiguous", arg(0, strided), "input must be contiguous"),
    case(
        "fused_swiglu_quant",
        "token-counts-int64",
        arg(1, lambda t: t.long()),
        "token_nums_per_expert must have dtype torch.int32",
    ),
    case("fused_swiglu_quant", "token-counts-rank", arg(1, lambda t: t[:, None]), "token_nums_per_expert must be 1-D"),
    case("fused_swiglu_quant", "token-counts-on-cuda", arg(1, on_cuda), SAME_DEVICE),
]

# prefill_permute_to_masked_gemm: x bf16 [50, 512], scale int32 [50, 1], topk_ids int64 [50, 3], 3, 128
PERMUTE = [
    case(
        "prefill_permute_to_masked_gemm",
        "max-token-num-below-128",
        arg(4, 64),
        "max_token_num must be an integer >= 128, got 64",
    ),
    case("prefill_permute_to_masked_gemm", "max-token-num-0", arg(4, 0), "max_token_num must be an integer >= 128"),
    case(
        "prefill_permute_to_masked_gemm",
        "max-token-num-not-multiple-of-128",
        arg(4, 192),
        "max_token_num (192) must be a positive multiple of 128",
    ),
    case(
        "prefill_permute_to_masked_gemm",
        "hidden-not-multiple-of-512-int32-scales",
        arg(0, cols(256)),
        "hidden (256) must be a positive multiple of 512",
    ),
    case(
        "prefill_permute_to_masked_gemm",
        "hidden-not-multiple-of-128-uint8-scales",
        both(arg(0, cols(64)), arg(1, zeros(50, 2, dtype=U8))),
        "hidden (64) must be a positive multiple of 128",
    ),
    case(
        "prefill_permute_to_masked_gemm",
        "int32-scale-shape",
        arg(1, cols(2)),
        "scale must have shape (50, 1), got (50, 2)",
    ),
    case(
        "prefill_permute_to_masked_gemm",
        "uint8-scale-shape",
        arg(1, zeros(50, 8, dtype=U8)),
        "scale must have shape (50, 16), got (50, 8)",
    ),
    case(
        "prefill_permute_to_masked_gemm",
        "scale-dtype",
        arg(1, retyped(FP32)),
        "scale must have dtype torch.int32 or torch.uint8",
    ),
    case("prefill_permute_to_masked_gemm", "scale-rank", arg(1, flat), "scale must be 2-D"),
    case(
        "prefill_permute_to_masked_gemm",
        "topk-ids-int32",
        arg(2, lambda t: t.int()),
        "topk_ids must have dtype torch.int64",
    ),
    case("prefill_permute_to_masked_gemm", "topk-ids-rank", arg(2, lambda t: t[:, 0].clone()), "topk_ids must be 2-D"),
    case(
        "prefill_permute_to_masked_gemm",
        "topk-ids-rows",
        arg(2, lambda t: t[:49]),
        "topk_ids must have one row per token (50), got (49, 3)",
    ),
    case("prefill_permute_to_masked_gemm", "topk-ids-on-cuda", arg(2, on_cuda), SAME_DEVICE),
    case("prefill_permute_to_masked_gemm", "experts-0", arg(3, 0), "num_local_experts must be an integer >= 1, got 0"),
    case("prefill_permute_to_masked_gemm", "experts-bool", arg(3, True), "num_local_experts must be an integer >= 1"),
    case(
        "prefill_permute_to_masked_gemm",
        "x-dtype",
        arg(0, retyped(FP16)),
        "x must have dtype torch.float8_e4m3fn or torch.bfloat16",
    ),
    case("prefill_permute_to_masked_gemm", "x-rank", arg(0, batched), "x must be 2-D"),
    case("prefill_permute_to_masked_gemm", "x-on-meta", arg(0, on_meta), "x " + NOT_CPU_OR_CUDA),
]


def buffers(packed: Callable, sfa: Callable) -> Mutation:
    """Caller buffers for a [40, 128] quantizer call (valid ones: packed [40, 64], sfa 1024 bytes)."""
    return both(kwarg("packed", packed), kwarg("sfa", sfa))


PACKED, SFA = zeros(40, 64, dtype=U8), zeros(1024, dtype=U8)

# quantize_fp4_sfa_* and quantize_e0m3_sfa_fp16: x [40, 128]
QUANTIZERS = [
    case("quantize_fp4_sfa_fp16", "x-dtype", arg(0, retyped(BF16)), "x must have dtype torch.float16"),
    case("quantize_fp4_sfa_bf16", "x-dtype", arg(0, retyped(FP16)), "x must have dtype torch.bfloat16"),
    case("quantize_fp4_sfa_mse_fp16", "x-dtype", arg(0, retyped(FP32)), "x must have dtype torch.float16"),
    case("quantize_fp4_sfa_mse_bf16", "x-dtype", arg(0, retyped(FP16)), "x must have dtype torch.bfloat16"),
    case("quantize_e0m3_sfa_fp16", "x-dtype", arg(0, retyped(BF16)), "x must have dtype torch.float16"),
    case("quantize_fp4_sfa_bf16", "x-not-a-tensor", arg(0, 1.0), "x must be a torch.Tensor, got float"),
    case("quantize_fp4_sfa_bf16", "x-rank", arg(0, flat), "x must be 2-D"),
    case("quantize_fp4_sfa_mse_fp16", "x-rank", arg(0, batched), "x must be 2-D"),
    case("quantize_fp4_sfa_bf16", "x-non-contiguous", arg(0, strided), "x must be contiguous"),
    case("quantize_fp4_sfa_fp16", "x-on-meta", arg(0, on_meta), "x " + NOT_CPU_OR_CUDA),
    case(
        "quantize_fp4_sfa_fp16",
        "k-not-multiple-of-16",
        arg(0, cols(24)),
        "x.shape[1] (K) (24) must be a positive multiple of 16",
    ),
    case(
        "quantize_e0m3_sfa_fp16",
        "k-not-multiple-of-16",
        arg(0, cols(40)),
        "x.shape[1] (K) (40) must be a positive multiple of 16",
    ),
    case("quantize_fp4_sfa_bf16", "packed-without-sfa", kwarg("packed", PACKED), PASS_BOTH_QUANT),
    case("quantize_fp4_sfa_mse_bf16", "sfa-without-packed", kwarg("sfa", SFA), PASS_BOTH_QUANT),
    case("quantize_e0m3_sfa_fp16", "packed-without-sfa", kwarg("packed", PACKED), PASS_BOTH_QUANT),
    case(
        "quantize_fp4_sfa_bf16",
        "packed-shape",
        buffers(zeros(40, 128, dtype=U8), SFA),
        "packed must have shape (40, 64), got (40, 128)",
    ),
    case(
        "quantize_fp4_sfa_fp16", "packed-dtype", buffers(zeros(40, 64, dtype=torch.int8), SFA), "packed must have dtype"
    ),
    case(
        "quantize_fp4_sfa_bf16",
        "sfa-size",
        buffers(PACKED, zeros(512, dtype=U8)),
        "sfa must hold the swizzled scales of 40 rows x 8 blocks: ceil(40/128) * ceil(8/4) * 512 = 1024 bytes, got 512",
    ),
    case(
        "quantize_fp4_sfa_mse_fp16",
        "sfa-dtype",
        buffers(PACKED, zeros(1024, dtype=I32)),
        "sfa must have dtype torch.uint8",
    ),
    case("quantize_fp4_sfa_bf16", "sfa-on-cuda", buffers(PACKED, lambda _: on_cuda(SFA(None))), SAME_DEVICE),
    case(
        "quantize_fp4_sfa_bf16",
        "packed-on-meta",
        buffers(lambda _: on_meta(PACKED(None)), SFA),
        "packed " + NOT_CPU_OR_CUDA,
    ),
]

# quantize_fp4_sfa_padded_bf16: x [40, 100]; pack_nvfp4_weight_bf16: weight [50, 100], bias [50]
PADDING = [
    case("quantize_fp4_sfa_padded_bf16", "x-dtype", arg(0, retyped(FP16)), "x must have dtype torch.bfloat16"),
    case("quantize_fp4_sfa_padded_bf16", "x-rank", arg(0, flat), "x must be 2-D"),
    case("quantize_fp4_sfa_padded_bf16", "alignment-0", kwarg("alignment", 0), ALIGNMENT),
    case("quantize_fp4_sfa_padded_bf16", "alignment-24", kwarg("alignment", 24), ALIGNMENT),
    case("quantize_fp4_sfa_padded_bf16", "alignment-8", kwarg("alignment", 8), ALIGNMENT),
    case("quantize_fp4_sfa_padded_bf16", "alignment-negative", kwarg("alignment", -32), ALIGNMENT),
    case("quantize_fp4_sfa_padded_bf16", "alignment-float", kwarg("alignment", 32.0), ALIGNMENT),
    case("quantize_fp4_sfa_padded_bf16", "alignment-bool", kwarg("alignment", True), ALIGNMENT),
    case("pack_nvfp4_weight_bf16", "weight-dtype", arg(0, retyped(FP16)), "weight must have dtype torch.bfloat16"),
    case("pack_nvfp4_weight_bf16", "weight-rank", arg(0, flat), "weight must be 2-D"),
    case("pack_nvfp4_weight_bf16", "weight-non-contiguous", arg(0, strided), "weight must be contiguous"),
    case("pack_nvfp4_weight_bf16", "alignment-24", kwarg("alignment", 24), ALIGNMENT),
    case("pack_nvfp4_weight_bf16", "bias-length", arg(1, lambda t: t[:49]), "bias must have shape (50,), got (49,)"),
    case("pack_nvfp4_weight_bf16", "bias-padded-length", arg(1, rows(64)), "bias must have shape (50,), got (64,)"),
    case("pack_nvfp4_weight_bf16", "bias-dtype", arg(1, retyped(FP16)), "bias must have dtype torch.bfloat16"),
    case("pack_nvfp4_weight_bf16", "bias-on-cuda", arg(1, on_cuda), SAME_DEVICE),
]

# dequantize_fp4_sfa_fp16: packed [40, 64], sfa 1024 bytes
DEQUANTIZE = [
    case("dequantize_fp4_sfa_fp16", "packed-dtype", arg(0, retyped(torch.int8)), "packed must have dtype torch.uint8"),
    case("dequantize_fp4_sfa_fp16", "packed-rank", arg(0, flat), "packed must be 2-D"),
    case("dequantize_fp4_sfa_fp16", "packed-non-contiguous", arg(0, strided), "packed must be contiguous"),
    case(
        "dequantize_fp4_sfa_fp16",
        "sfa-size",
        arg(1, one_byte_short),
        "sfa must hold the swizzled scales of 40 rows x 8 blocks",
    ),
    case("dequantize_fp4_sfa_fp16", "sfa-dtype", arg(1, retyped(torch.int8)), "sfa must have dtype torch.uint8"),
    case("dequantize_fp4_sfa_fp16", "sfa-on-meta", arg(1, on_meta), "sfa " + NOT_CPU_OR_CUDA),
    case(
        "dequantize_fp4_sfa_fp16",
        "out-dtype",
        kwarg("out", zeros(40, 128, dtype=BF16)),
        "out must have dtype torch.float16",
    ),
    case(
        "dequantize_fp4_sfa_fp16",
        "out-shape",
        kwarg("out", zeros(40, 64, dtype=FP16)),
        "out must have shape (40, 128), got (40, 64)",
    ),
    case(
        "dequantize_fp4_sfa_fp16",
        "out-on-cuda",
        kwarg("out", lambda _: on_cuda(torch.zeros(40, 128, dtype=FP16))),
        SAME_DEVICE,
    ),
]

# flashrt-style GEMMs: a [40, 64] (M = 40, K = 128), b [64, 64] (N = 64), sfa and sfb 1024 bytes
GEMMS = [
    case("nvfp4_gemm_bf16", "a-not-a-tensor", arg(0, None), "a_packed must be a torch.Tensor, got NoneType"),
    case("nvfp4_gemm_bf16", "a-dtype", arg(0, retyped(torch.int8)), "a_packed must have dtype torch.uint8"),
    case("nvfp4_gemm_bf16", "b-dtype", arg(1, retyped(BF16)), "b_packed must have dtype torch.uint8"),
    case("nvfp4_gemm_bf16", "a-rank", arg(0, flat), "a_packed must be 2-D"),
    case("nvfp4_gemm_bf16", "b-rank", arg(1, batched), "b_packed must be 2-D"),
    case("nvfp4_gemm_bf16", "a-non-contiguous", arg(0, strided), "a_packed must be contiguous"),
    case("nvfp4_gemm_bf16", "a-on-meta", arg(0, on_meta), "a_packed " + NOT_CPU_OR_CUDA),
    case(
        "nvfp4_gemm_bf16",
        "k-mismatch",
        arg(1, cols(32)),
        "a_packed and b_packed must have the same K: a gives 128, b gives 64",
    ),
    case(
        "nvfp4_gemm_bf16",
        "k-not-multiple-of-16",
        both(arg(0, cols(4)), arg(1, cols(4))),
        "K (8) must be a positive multiple of 16",
    ),
    case("nvfp4_gemm_bf16", "m-0", arg(0, rows(0)), "M and N must be >= 1, got M=0, N=64"),
    case("nvfp4_gemm_bf16", "n-0", arg(1, rows(0)), "M and N must be >= 1, got M=40, N=0"),
    case(
        "nvfp4_gemm_bf16",
        "sfa-size",
        arg(2, one_byte_short),
        "sfa must hold the swizzled scales of 40 rows x 8 blocks: ceil(40/128) * ceil(8/4) * 512 = 1024 bytes"
        ", got 1023",
    ),
    case(
        "nvfp4_gemm_bf16", "sfb-size", arg(3, one_byte_long), "sfb must hold the swizzled scales of 64 rows x 8 blocks"
    ),
    case("nvfp4_gemm_bf16", "sfb-dtype", arg(3, retyped(torch.int8)), "sfb must have dtype torch.uint8"),
    case("nvfp4_gemm_bf16", "sfa-on-cuda", arg(2, on_cuda), SAME_DEVICE),
    case(
        "nvfp4_gemm_bf16",
        "alpha-tensor",
        kwarg("alpha", zeros(1, dtype=FP32)),
        "alpha must be a Python float, got Tensor",
    ),
    case("nvfp4_gemm_bf16", "alpha-none", kwarg("alpha", None), "alpha must be a Python float, got NoneType"),
    case("nvfp4_gemm_bf16", "alpha-bool", kwarg("alpha", True), "alpha must be a Python float, got bool"),
    case("nvfp4_gemm_bf16", "out-dtype", kwarg("out", zeros(40, 64, dtype=FP16)), "out must have dtype torch.bfloat16"),
    case(
        "nvfp4_gemm_bf16",
        "out-shape",
        kwarg("out", zeros(40, 32, dtype=BF16)),
        "out must have shape (40, 64), got (40, 32)",
    ),
    case(
        "nvfp4_gemm_bf16",
        "out-non-contiguous",
        kwarg("out", lambda _: strided(torch.zeros(40, 64, dtype=BF16))),
        "out must be contiguous",
    ),
    case(
        "nvfp4_gemm_bf16", "out-on-cuda", kwarg("out", lambda _: on_cuda(torch.zeros(40, 64, dtype=BF16))), SAME_DEVICE
    ),
    case("nvfp4_gemm_bf16", "variant-3", kwarg("variant", 3), "variant must be one of (-1, 0, 1, 2)"),
    case("nvfp4_gemm_bf16", "variant-minus-2", kwarg("variant", -2), "variant must be one of (-1, 0, 1, 2)"),
    case("nvfp4_gemm_bf16", "variant-name", kwarg("variant", "auto"), "variant must be one of (-1, 0, 1, 2)"),
    case("nvfp4_gemm_fp16", "out-dtype", kwarg("out", zeros(40, 64, dtype=BF16)), "out must have dtype torch.float16"),
    case("nvfp4_gemm_fp16", "variant-5", kwarg("variant", 5), "variant must be one of (-1, 0, 1, 2)"),
    case("fp4_w4a16_linear_bf16", "variant-3", kwarg("variant", 3), "variant must be one of (-1, 0, 1, 2)"),
    case("fp4_w4a16_linear_bf16", "k-mismatch", arg(0, cols(32)), "a_packed and b_packed must have the same K"),
    case("nvfp4_gemm_variant_bf16", "variant-auto", kwarg("variant", -1), "variant must be one of (0, 1, 2)"),
    case("nvfp4_gemm_variant_bf16", "variant-3", kwarg("variant", 3), "variant must be one of (0, 1, 2)"),
    case("nvfp4_gemm_streamk_bf16", "k-mismatch", arg(1, cols(128)), "a_packed and b_packed must have the same K"),
    case(
        "nvfp4_gemm_streamk_bf16", "alpha-tensor", kwarg("alpha", zeros(1, dtype=FP32)), "alpha must be a Python float"
    ),
    # bias [64] (bf16, fp16 or fp32) at position 4
    case(
        "nvfp4_gemm_bias_bf16",
        "bias-dtype",
        arg(4, retyped(I32)),
        "bias must have dtype torch.bfloat16 or torch.float16 or torch.float32, got torch.int32",
    ),
    case("nvfp4_gemm_bias_bf16", "bias-shape", arg(4, rows(32)), "bias must have shape (64,), got (32,)"),
    case("nvfp4_gemm_bias_bf16", "bias-rank", arg(4, batched), "bias must have shape (64,), got (1, 64)"),
    case("nvfp4_gemm_bias_bf16", "bias-not-a-tensor", arg(4, 0.0), "bias must be a torch.Tensor, got float"),
    case("nvfp4_gemm_bias_bf16", "bias-on-cuda", arg(4, on_cuda), SAME_DEVICE),
    # a function named for its bias or residual requires it (a rule of its kind: checked once per key)
    *[
        case(name, "bias-none", arg(4, None), "bias is required by this function (got None)")
        for name in (
            "nvfp4_gemm_bias_bf16",
            "nvfp4_gemm_streamk_bias_bf16",
            "nvfp4_gemm_bias_gelu_bf16",
            "nvfp4_gemm_bias_gelu_nvfp4",
            "nvfp4_gemm_bias_gelu_nvfp4_fp16",
            "nvfp4_gemm_bias_residual_bf16",
        )
    ],
    case("nvfp4_gemm_residual_bf16", "residual-none", arg(4, None), "residual is required by this function"),
    case("nvfp4_gemm_bias_residual_fp16", "residual-none", arg(5, None), "residual is required by this function"),
    case("nvfp4_gemm_streamk_bias_bf16", "bias-shape", arg(4, rows(40)), "bias must have shape (64,), got (40,)"),
    case("nvfp4_gemm_bias_gelu_bf16", "bias-dtype", arg(4, retyped(FP8)), "bias must have dtype"),
    case("nvfp4_gemm_bias_gelu_nvfp4", "bias-shape", arg(4, rows(16)), "bias must have shape (64,), got (16,)"),
    case("nvfp4_gemm_bias_gelu_nvfp4_fp16", "bias-dtype", arg(4, retyped(I64)), "bias must have dtype"),
    # residual [40, 64] at position 4 (5 after a bias)
    case(
        "nvfp4_gemm_residual_bf16", "residual-dtype", arg(4, retyped(FP16)), "residual must have dtype torch.bfloat16"
    ),
    case(
        "nvfp4_gemm_residual_bf16",
        "residual-shape",
        arg(4, cols(32)),
        "residual must have shape (40, 64), got (40, 32)",
    ),
    case("nvfp4_gemm_residual_bf16", "residual-non-contiguous", arg(4, strided), "residual must be contiguous"),
    case("nvfp4_gemm_residual_bf16", "residual-on-cuda", arg(4, on_cuda), SAME_DEVICE),
    case("nvfp4_gemm_bias_residual_bf16", "residual-shape", arg(5, rows(64)), "residual must have shape (40, 64)"),
    case("nvfp4_gemm_bias_residual_bf16", "bias-shape", arg(4, rows(63)), "bias must have shape (64,)"),
    case(
        "nvfp4_gemm_bias_residual_fp16",
        "residual-dtype",
        arg(5, retyped(BF16)),
        "residual must have dtype torch.float16",
    ),
    case(
        "nvfp4_gemm_bias_residual_fp16",
        "out-dtype",
        kwarg("out", zeros(40, 64, dtype=BF16)),
        "out must have dtype torch.float16",
    ),
    # NVFP4 outputs: out_packed [40, N_out / 2], out_sfa sfa_size_bytes(40, N_out)
    case("nvfp4_gemm_nvfp4", "out-packed-without-out-sfa", kwarg("out_packed", zeros(40, 32, dtype=U8)), PASS_BOTH_OUT),
    case("nvfp4_gemm_nvfp4", "out-sfa-without-out-packed", kwarg("out_sfa", zeros(512, dtype=U8)), PASS_BOTH_OUT),
    case(
        "nvfp4_gemm_nvfp4",
        "out-packed-shape",
        both(kwarg("out_packed", zeros(40, 64, dtype=U8)), kwarg("out_sfa", zeros(512, dtype=U8))),
        "out_packed must have shape (40, 32), got (40, 64)",
    ),
    case(
        "nvfp4_gemm_nvfp4",
        "out-packed-dtype",
        both(kwarg("out_packed", zeros(40, 32, dtype=BF16)), kwarg("out_sfa", zeros(512, dtype=U8))),
        "out_packed must have dtype torch.uint8",
    ),
    case(
        "nvfp4_gemm_nvfp4",
        "out-sfa-size",
        both(kwarg("out_packed", zeros(40, 32, dtype=U8)), kwarg("out_sfa", zeros(1024, dtype=U8))),
        "out_sfa must hold the swizzled scales of 40 rows x 4 blocks",
    ),
    case(
        "nvfp4_gemm_nvfp4",
        "out-sfa-on-cuda",
        both(
            kwarg("out_packed", zeros(40, 32, dtype=U8)),
            kwarg("out_sfa", lambda _: on_cuda(torch.zeros(512, dtype=U8))),
        ),
        SAME_DEVICE,
    ),
    case(
        "nvfp4_gemm_nvfp4",
        "output-width-not-multiple-of-16",
        arg(1, rows(40)),
        "the output width (40) must be a positive multiple of 16",
    ),
    case(
        "nvfp4_gemm_relu2_nvfp4",
        "out-packed-without-out-sfa",
        kwarg("out_packed", zeros(40, 32, dtype=U8)),
        PASS_BOTH_OUT,
    ),
    case(
        "nvfp4_gemm_relu2_nvfp4",
        "output-width-not-multiple-of-16",
        arg(1, rows(72)),
        "the output width (72) must be a positive multiple of 16",
    ),
    case(
        "nvfp4_gemm_bias_gelu_nvfp4",
        "out-sfa-without-out-packed",
        kwarg("out_sfa", zeros(512, dtype=U8)),
        PASS_BOTH_OUT,
    ),
    case(
        "nvfp4_gemm_bias_gelu_nvfp4_fp16",
        "out-packed-without-out-sfa",
        kwarg("out_packed", zeros(40, 32, dtype=U8)),
        PASS_BOTH_OUT,
    ),
    # GeGLU over an interleaved weight: N_out = N / 2
    case(
        "nvfp4_gemm_geglu_nvfp4_fp16",
        "n-odd",
        arg(1, rows(63)),
        "N of the interleaved GeGLU weight (63) must be a positive multiple of 2",
    ),
    case(
        "nvfp4_gemm_geglu_nvfp4_fp16",
        "output-width-not-multiple-of-16",
        arg(1, rows(48)),
        "the output width (24) must be a positive multiple of 16",
    ),
    case(
        "nvfp4_gemm_geglu_nvfp4_fp16",
        "out-packed-shape",
        both(kwarg("out_packed", zeros(40, 32, dtype=U8)), kwarg("out_sfa", zeros(512, dtype=U8))),
        "out_packed must have shape (40, 16), got (40, 32)",
    ),
    case(
        "nvfp4_gemm_geglu_nvfp4_fp16",
        "out-sfa-without-out-packed",
        kwarg("out_sfa", zeros(512, dtype=U8)),
        PASS_BOTH_OUT,
    ),
    case(
        "cutlass_fp4_gemm_geglu_il_hw_v10",
        "n-odd",
        arg(1, rows(31)),
        "N of the interleaved GeGLU weight (31) must be a positive multiple of 2",
    ),
    case(
        "cutlass_fp4_gemm_geglu_il_hw_v10",
        "out-packed-without-out-sfa",
        kwarg("out_packed", zeros(40, 16, dtype=U8)),
        PASS_BOTH_OUT,
    ),
    # e0m3_weight_gemm_fp16
    case("e0m3_weight_gemm_fp16", "a-format-2", kwarg("a_format", 2), A_FORMAT),
    case("e0m3_weight_gemm_fp16", "a-format-minus-1", kwarg("a_format", -1), A_FORMAT),
    case("e0m3_weight_gemm_fp16", "a-format-name", kwarg("a_format", "e0m3"), A_FORMAT),
    case(
        "e0m3_weight_gemm_fp16",
        "out-dtype",
        kwarg("out", zeros(40, 64, dtype=BF16)),
        "out must have dtype torch.float16",
    ),
    case("e0m3_weight_gemm_fp16", "k-mismatch", arg(1, cols(32)), "a_packed and b_packed must have the same K"),
]

# decode and large-M tiers
TIERS = [
    # fp4_repack_b_interleaved_sm120: b [64, 64] (N = 64, K = 128)
    case(
        "fp4_repack_b_interleaved_sm120",
        "n-not-multiple-of-8",
        arg(0, rows(60)),
        "N (60) must be a positive multiple of 8 (the streaming layout tiles 8 rows)",
    ),
    case(
        "fp4_repack_b_interleaved_sm120",
        "k-not-multiple-of-64",
        arg(0, cols(16)),
        "K (32) must be a positive multiple of 64 (the streaming layout tiles 64 elements)",
    ),
    case("fp4_repack_b_interleaved_sm120", "b-dtype", arg(0, retyped(BF16)), "b_packed must have dtype torch.uint8"),
    case("fp4_repack_b_interleaved_sm120", "b-rank", arg(0, batched), "b_packed must be 2-D"),
    case("fp4_repack_b_interleaved_sm120", "b-non-contiguous", arg(0, strided), "b_packed must be contiguous"),
    case(
        "fp4_repack_b_interleaved_sm120",
        "out-shape",
        kwarg("out", zeros(64, 32, dtype=U8)),
        "out must have shape (64, 64), got (64, 32)",
    ),
    case(
        "fp4_repack_b_interleaved_sm120",
        "out-dtype",
        kwarg("out", zeros(64, 64, dtype=torch.int8)),
        "out must have dtype torch.uint8",
    ),
    case(
        "fp4_repack_b_interleaved_sm120",
        "out-on-cuda",
        kwarg("out", lambda _: on_cuda(torch.zeros(64, 64, dtype=U8))),
        SAME_DEVICE,
    ),
    # fp4_w4a4_gemv_warpsplit_interleaved_bf16: a [1, 64], b [64, 64] repacked, warps 2, stages 2
    case(
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
        "m-2",
        arg(0, rows(2)),
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16 serves M = 1 only, got M=2",
    ),
    case(
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
        "n-not-multiple-of-8",
        arg(1, rows(60)),
        "N (60) must be a positive multiple of 8",
    ),
    case(
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
        "k-not-multiple-of-64",
        both(arg(0, cols(16)), arg(1, cols(16))),
        "K (32) must be a positive multiple of 64",
    ),
    case("fp4_w4a4_gemv_warpsplit_interleaved_bf16", "warps-16", kwarg("warps", 16), WARPS),
    case("fp4_w4a4_gemv_warpsplit_interleaved_bf16", "warps-3", kwarg("warps", 3), WARPS),
    case("fp4_w4a4_gemv_warpsplit_interleaved_bf16", "stages-0", kwarg("stages", 0), STAGES),
    case("fp4_w4a4_gemv_warpsplit_interleaved_bf16", "stages-9", kwarg("stages", 9), STAGES),
    case("fp4_w4a4_gemv_warpsplit_interleaved_bf16", "stages-bool", kwarg("stages", True), STAGES),
    case(
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
        "sfb-size",
        arg(3, one_byte_short),
        "sfb must hold the swizzled scales",
    ),
    # fp4_w4a4_gemm_warpsplit_mrows_bf16: a [16, 64] (M = 16), b [64, 64], warps 2, stages 6
    case(
        "fp4_w4a4_gemm_warpsplit_mrows_bf16",
        "m-17",
        arg(0, rows(17)),
        "fp4_w4a4_gemm_warpsplit_mrows_bf16 needs 1 <= M <= 16, got M=17",
    ),
    case("fp4_w4a4_gemm_warpsplit_mrows_bf16", "m-0", arg(0, rows(0)), "needs 1 <= M <= 16, got M=0"),
    case(
        "fp4_w4a4_gemm_warpsplit_mrows_bf16",
        "n-not-multiple-of-8",
        arg(1, rows(60)),
        "N (60) must be a positive multiple of 8 (the multi-row tier reads 8 weight rows at a time)",
    ),
    case(
        "fp4_w4a4_gemm_warpsplit_mrows_bf16",
        "k-not-multiple-of-64-warps",
        kwarg("warps", 4),
        "K (128) must be a positive multiple of 256 (64 * warps",
    ),
    case("fp4_w4a4_gemm_warpsplit_mrows_bf16", "warps-1", kwarg("warps", 1), WARPS),
    case("fp4_w4a4_gemm_warpsplit_mrows_bf16", "warps-none", kwarg("warps", None), WARPS),
    case("fp4_w4a4_gemm_warpsplit_mrows_bf16", "stages-0", kwarg("stages", 0), STAGES),
    case("fp4_w4a4_gemm_warpsplit_mrows_bf16", "stages-9", kwarg("stages", 9), STAGES),
    case("fp4_w4a4_gemm_warpsplit_mrows_bf16", "stages-float", kwarg("stages", 2.0), STAGES),
    case(
        "fp4_w4a4_gemm_warpsplit_mrows_bf16",
        "alpha-tensor",
        kwarg("alpha", zeros(1, dtype=FP32)),
        "alpha must be a Python float",
    ),
    # nvfp4_gemm_m256_bf16: a [512, 64] (M = 512), b [64, 64], workspace of the required size
    case("nvfp4_gemm_m256_bf16", "m-511", arg(0, rows(511)), "nvfp4_gemm_m256_bf16 needs M >= 512, got M=511"),
    case(
        "nvfp4_gemm_m256_bf16",
        "workspace-missing",
        kwarg("workspace", None),
        "nvfp4_gemm_m256_bf16 needs a caller workspace of nvfp4_gemm_m256_workspace_size(...) bytes",
    ),
    case(
        "nvfp4_gemm_m256_bf16",
        "workspace-too-small",
        kwarg("workspace", lambda t: t[:-1]),
        "workspace must hold at least",
    ),
    case(
        "nvfp4_gemm_m256_bf16", "workspace-empty", kwarg("workspace", lambda t: t[:0]), "workspace must hold at least"
    ),
    case(
        "nvfp4_gemm_m256_bf16",
        "workspace-dtype",
        kwarg("workspace", retyped(FP32)),
        "workspace must have dtype torch.uint8",
    ),
    case(
        "nvfp4_gemm_m256_bf16", "workspace-non-contiguous", kwarg("workspace", strided), "workspace must be contiguous"
    ),
    case("nvfp4_gemm_m256_bf16", "workspace-on-meta", kwarg("workspace", on_meta), "workspace " + NOT_CPU_OR_CUDA),
    case("nvfp4_gemm_m256_bf16", "workspace-on-cuda", kwarg("workspace", on_cuda), SAME_DEVICE),
    case("nvfp4_gemm_m256_bf16", "k-mismatch", arg(1, cols(32)), "a_packed and b_packed must have the same K"),
    case("nvfp4_gemm_m256_bf16", "alpha-tensor", kwarg("alpha", zeros(1, dtype=FP32)), "alpha must be a Python float"),
    case(
        "nvfp4_gemm_m256_workspace_size", "k-mismatch", arg(1, cols(32)), "a_packed and b_packed must have the same K"
    ),
    case(
        "nvfp4_gemm_m256_workspace_size",
        "sfa-size",
        arg(2, one_byte_short),
        "sfa must hold the swizzled scales of 512 rows",
    ),
    case("nvfp4_gemm_m256_workspace_size", "b-dtype", arg(1, retyped(FP8)), "b_packed must have dtype torch.uint8"),
]

# sfa_size_bytes(300, 5120)
SIZES = [
    case("sfa_size_bytes", "rows-0", arg(0, 0), "rows must be an integer >= 1, got 0"),
    case("sfa_size_bytes", "rows-negative", arg(0, -128), "rows must be an integer >= 1, got -128"),
    case("sfa_size_bytes", "rows-float", arg(0, 300.0), "rows must be an integer >= 1, got 300.0"),
    case("sfa_size_bytes", "dim-0", arg(1, 0), "dim must be an integer >= 1, got 0"),
    case("sfa_size_bytes", "dim-not-multiple-of-16", arg(1, 5128), "dim (5128) must be a positive multiple of 16"),
    case("sfa_size_bytes", "dim-8", arg(1, 8), "dim (8) must be a positive multiple of 16"),
]


# ---- buffers that share memory, sizes beyond the device, numbers beyond what the kernels take -----


def carved(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A contiguous view of `buffer`'s bytes from `offset` with like's shape and dtype, holding like's values."""
    view = buffer[offset : offset + like.nbytes].view(like.dtype).view(like.shape)
    view.copy_(like)
    return view


def sharing(first: int | str, second: int | str, offset: int) -> Mutation:
    """Arguments `first` and `second` (positions or keywords) carved from one buffer, the second
    `offset` bytes in: they overlap where offset < first's bytes."""

    def mutate(args: list, kwargs: dict) -> None:
        def get(where: int | str) -> torch.Tensor:
            return args[where] if isinstance(where, int) else kwargs[where]

        def put(where: int | str, value: torch.Tensor) -> None:
            if isinstance(where, int):
                args[where] = value
            else:
                kwargs[where] = value

        a, b = get(first), get(second)
        buffer = torch.zeros(max(a.nbytes, offset + b.nbytes), dtype=torch.uint8)
        put(first, carved(buffer, 0, a))
        put(second, carved(buffer, offset, b))

    return mutate


def given(key: str, make: Callable[[], torch.Tensor]) -> Mutation:
    """A keyword buffer the valid call leaves out, made valid here (so that another mutation can use it)."""
    return kwarg(key, lambda _: make())


HUGE = 2**20  # rows of M and N whose bf16 output (2 TiB) exceeds any machine here


def huge_operands(args: list, kwargs: dict) -> None:
    """A [HUGE, 16] and B [HUGE, 16], small themselves (8 MiB with scales) but with a 2 TiB output."""
    args[:4] = [torch.zeros(HUGE, 8, dtype=U8), torch.zeros(HUGE, 8, dtype=U8)] + [
        torch.zeros(HUGE // 128 * 512, dtype=U8)
    ] * 2


SHARED = "must not share memory with"
FLOAT32_RANGE = "alpha must be within the float32 range (|alpha| <= 3.4028235e+38)"
MEMORY = "bytes, more than the memory of cpu"
RELIABILITY = [
    case(
        "dense_gemm",
        "bias-inside-output",
        lambda args, kwargs: kwargs.update(bias=args[4][0]),
        "output " + SHARED + " bias",
    ),
    case("dense_gemm", "sfa-inside-output", sharing(4, 2, 64), "output " + SHARED + " sfa"),
    case(
        "nvfp4_gemm_bias_bf16",
        "out-over-a",
        both(given("out", lambda: torch.zeros(40, 64, dtype=BF16)), sharing("out", 0, 0)),
        "out " + SHARED + " a_packed",
    ),
    case(
        "nvfp4_gemm_nvfp4",
        "out-packed-over-out-sfa",
        both(
            given("out_packed", lambda: torch.zeros(40, 32, dtype=U8)),
            given("out_sfa", lambda: torch.zeros(512, dtype=U8)),
            sharing("out_packed", "out_sfa", 1024),
        ),
        "out_packed " + SHARED + " out_sfa",
    ),
    case(
        "nvfp4_gemm_residual_bf16",
        "out-one-row-into-residual",
        both(given("out", lambda: torch.zeros(40, 64, dtype=BF16)), sharing(4, "out", 128)),
        "out " + SHARED + " residual (outputs overlap no input and no other output; out may be residual itself)",
    ),
    case(
        "nvfp4_gemm_bias_gelu_nvfp4",
        "out-sfa-over-bias",
        both(
            given("out_packed", lambda: torch.zeros(40, 32, dtype=U8)),
            given("out_sfa", lambda: torch.zeros(512, dtype=U8)),
            sharing("out_sfa", 4, 0),
        ),
        "out_sfa " + SHARED + " bias",
    ),
    case("group_masked_gemm", "output-over-masked-m", sharing(5, 4, 0), "output " + SHARED + " masked_m"),
    case("group_contiguous_gemm", "output-over-expert-ids", sharing(5, 4, 0), "output " + SHARED + " expert_ids"),
    case(
        "quantize_fp4_sfa_bf16",
        "packed-over-sfa",
        both(buffers(PACKED, SFA), sharing("packed", "sfa", 2048)),
        "packed " + SHARED + " sfa",
    ),
    case(
        "quantize_fp4_sfa_bf16",
        "packed-inside-x",
        both(buffers(PACKED, SFA), sharing(0, "packed", 128)),
        "packed " + SHARED + " x",
    ),
    case(
        "dequantize_fp4_sfa_fp16",
        "out-over-packed",
        both(given("out", lambda: torch.zeros(40, 128, dtype=FP16)), sharing("out", 0, 0)),
        "out " + SHARED + " packed",
    ),
    case(
        "nvfp4_gemm_m256_bf16",
        "workspace-inside-out",
        both(given("out", lambda: torch.zeros(512, 64, dtype=BF16)), sharing("out", "workspace", 0)),
        "workspace " + SHARED + " out",
    ),
    case(
        "nvfp4_gemm_bf16",
        "alpha-int-beyond-float",
        kwarg("alpha", 10**400),
        FLOAT32_RANGE + ", got an int of 1329 bits",
    ),
    case("nvfp4_gemm_bf16", "alpha-beyond-float32", kwarg("alpha", 1e39), FLOAT32_RANGE + ", got 1e+39"),
    case(
        "dense_gemm", "sm-count-2-pow-63", kwarg("sm_count", 2**63), SM_COUNT + " below 2**31, got 9223372036854775808"
    ),
    case("dense_gemm", "sm-count-2-pow-31", kwarg("sm_count", 2**31), SM_COUNT + " below 2**31"),
    case("dense_gemm", "use-pdl-str", kwarg("use_pdl", "yes"), "use_pdl must be a bool, got str"),
    case(
        "quantize_fp4_sfa_padded_bf16",
        "alignment-beyond-memory",
        kwarg("alignment", 2**44),
        "the padded values and scales would need",
    ),
    case("pack_nvfp4_weight_bf16", "alignment-beyond-memory", kwarg("alignment", 2**44), MEMORY),
    case(
        "prefill_permute_to_masked_gemm",
        "max-token-num-beyond-memory",
        arg(4, 2**40),
        "the permuted rows (num_local_experts * max_token_num = 3298534883328) would need",
    ),
    case("nvfp4_gemm_bf16", "output-beyond-memory", huge_operands, "the output would need 2199023255552 " + MEMORY),
]

# aligned_fp4_dim(4304, alignment=32)
ALIGNED = [
    case("aligned_fp4_dim", "dim-0", arg(0, 0), "dim must be an integer >= 1, got 0"),
    case("aligned_fp4_dim", "dim-float", arg(0, 4304.0), "dim must be an integer >= 1, got 4304.0"),
    case("aligned_fp4_dim", "alignment-24", kwarg("alignment", 24), ALIGNMENT),
    case("aligned_fp4_dim", "alignment-0", kwarg("alignment", 0), ALIGNMENT),
]

# the PDL twins, the standard-layout GEMV and the W4A16 tier (flashrt HEAD); api_cases gives their valid calls
ADOPT, MARLIN = "adopt_nvfp4_w4a16_marlin", "nvfp4_w4a16_marlin_bf16"
FLASHRT_HEAD_TIERS = [
    case("quantize_fp4_sfa_bf16_pdl", "fp16-input", arg(0, lambda x: x.half()), "x must have dtype"),
    case("fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16", "m-17", arg(0, lambda a: torch.cat([a, a[:1]])), "1 <= M <= 16"),
    case("fp4_w4a4_gemv_warpsplit_bf16", "m-2", arg(0, lambda a: torch.cat([a, a])), "serves M = 1 only, got M=2"),
    case("fp4_w4a4_gemv_warpsplit_bf16", "warps-3", kwarg("warps", 3), "warps must be one of (2, 4, 8)"),
    case("allocate_w4a16_marlin_workspace", "not-a-device", arg(0, "gpu0"), "device"),
    case(ADOPT, "weight-int8", arg(0, lambda w: w.view(torch.int8)), "weight_packed must have dtype"),
    case(ADOPT, "k-16", arg(0, lambda w: w[:, :8].contiguous()), "K (16) must be a positive multiple of 32"),
    case(ADOPT, "scale-shape", arg(1, lambda s: s[:, :-1].contiguous()), "weight_scale must have shape"),
    case(ADOPT, "scale-2-two-values", arg(2, torch.ones(2)), "weight_scale_2 must hold one float32"),
    case(MARLIN, "x-packed", arg(0, lambda x: x.view(torch.uint8)), "x must have dtype"),
    case(MARLIN, "k-mismatch", arg(0, lambda x: x[:, :64].contiguous()), "x and weight must have the same K"),
    case(MARLIN, "no-workspace", kwarg("workspace", None), "workspace is required"),
    case(MARLIN, "global-scale-two", arg(3, torch.ones(2)), "global_scale must have shape (1,)"),
    case(MARLIN, "out-fp16", given("out", lambda: torch.zeros(40, 64, dtype=FP16)), "out must have dtype"),
]

RULES = [
    *GROUP_WISE_QUANT, *DENSE, *BATCH, *CONTIGUOUS, *MASKED, *SWIGLU, *PERMUTE,
    *QUANTIZERS, *PADDING, *DEQUANTIZE, *GEMMS, *TIERS, *SIZES, *RELIABILITY, *ALIGNED, *FLASHRT_HEAD_TIERS,
]  # fmt: skip


def broken_call(name: str, mutation: Mutation) -> tuple[list, dict]:
    args, kwargs = make_call(name, "cpu")
    mutation(args, kwargs)
    return args, kwargs


@pytest.mark.parametrize("name,mutation,rule", RULES)
def test_broken_call_raises_value_error_naming_the_rule_before_any_op(fp4, name, mutation, rule):
    """The valid call runs first, so that its verdict is remembered (_validate.checked): a broken call
    is checked in full whatever calls came before."""
    valid_args, valid_kwargs = make_call(name, "cpu")
    getattr(fp4, name)(*valid_args, **valid_kwargs)
    args, kwargs = broken_call(name, mutation)
    with OpRecorder(fp4.ops.name) as recorder, pytest.raises(ValueError, match=re.escape(rule)):
        getattr(fp4, name)(*args, **kwargs)
    assert recorder.called == [], f"{name} dispatched {recorder.called} before raising"


def test_every_function_that_takes_arguments_has_rule_cases(fp4):
    covered = {param.values[0] for param in RULES}
    assert covered == {name for name in fp4.__all__ if not name.isupper()} - {"capabilities", "layers"}


@pytest.mark.parametrize(
    "make_input,mode,rule",
    [
        (lambda: torch.zeros(4, 64, dtype=torch.float32), "w8a8-mxfp8", "input must have dtype"),
        (lambda: torch.zeros(4, 64, dtype=torch.uint8), "w4a4-nvfp4", "input must have dtype"),
        (lambda: torch.zeros(64, dtype=torch.bfloat16), "w8a8-mxfp8", "input must be 2-D"),
        (lambda: torch.zeros(2, 4, 64, dtype=torch.bfloat16), "w8a8-mxfp8", "input must be 2-D"),
        (lambda: torch.zeros(4, 48, dtype=torch.bfloat16), "w8a8-mxfp8", "must be a positive multiple of 32"),
        (lambda: torch.zeros(4, 48, dtype=torch.bfloat16), "w4a4-mxfp4", "must be a positive multiple of 32"),
        (lambda: torch.zeros(4, 24, dtype=torch.bfloat16), "w4a4-nvfp4", "must be a positive multiple of 16"),
        (lambda: torch.zeros(64, 4, dtype=torch.bfloat16).t(), "w4a4-nvfp4", "input must be contiguous"),
        (lambda: torch.zeros(4, 64, dtype=torch.bfloat16, device="meta"), "w4a4-nvfp4", "CPU or CUDA tensor"),
        (lambda: [[0.0] * 32], "w8a8-mxfp8", "input must be a torch.Tensor"),
        (lambda: torch.zeros(4, 64, dtype=torch.bfloat16), "w4a4-int4", "mode must be one of"),
    ],
)
def test_group_wise_quant_rejects_bad_input(fp4, make_input, mode, rule):
    with pytest.raises(ValueError, match=rule):
        fp4.group_wise_quant(make_input(), mode)


# ---- device-side data: checked on the host copy in debug mode ----------------------------------

DATA_RULES = [
    case("group_contiguous_gemm", "expert-ids-unsorted", arg(4, lambda t: t.flip(0)), "expert_ids must be sorted"),
    case(
        "group_contiguous_gemm",
        "expert-ids-padding-inside-an-expert",
        arg(4, lambda t: torch.where(torch.arange(t.numel()) == 100, -1, t)),
        "each expert's rows must be consecutive",
    ),
    case(
        "group_contiguous_gemm",
        "expert-ids-out-of-range",
        arg(4, lambda t: torch.where(t == 2, 3, t)),
        "expert_ids must lie in [0, 3)",
    ),
    case("group_masked_gemm", "masked-m-above-max-m", arg(4, ints(49, 5, 0)), "masked_m must lie in [0, 48]"),
    case(
        "fused_swiglu_quant",
        "token-count-above-rows",
        arg(1, ints(48, 49, 0)),
        "token_nums_per_expert must lie in [0, 48]",
    ),
    case(
        "prefill_permute_to_masked_gemm",
        "expert-overflow",
        arg(2, zeros(50, 3, dtype=I64)),
        "an expert receives 150 tokens, more than max_token_num = 128",
    ),
]


@pytest.mark.parametrize("name,mutation,rule", DATA_RULES)
def test_debug_mode_checks_device_side_data(fp4, monkeypatch, name, mutation, rule):
    monkeypatch.setenv("FP4_GEMM_DEBUG", "1")
    args, kwargs = broken_call(name, mutation)
    with pytest.raises(ValueError, match=re.escape(rule)):
        getattr(fp4, name)(*args, **kwargs)


def test_prefill_permute_overflow_is_reported_not_rejected_without_debug(fp4, monkeypatch):
    monkeypatch.delenv("FP4_GEMM_DEBUG", raising=False)
    args, kwargs = broken_call("prefill_permute_to_masked_gemm", arg(2, zeros(50, 3, dtype=I64)))
    *_, index_map, counts = fp4.prefill_permute_to_masked_gemm(*args, **kwargs)
    assert counts.flatten().tolist() == [150, 0, 0]
    assert (index_map >= 0).sum() == 128


# ---- an invalid call writes nothing -----------------------------------------------------------


def test_dense_gemm_invalid_call_leaves_output_untouched(fp4):
    args, kwargs = broken_call("dense_gemm", kwarg("bias", retyped(FP32)))
    output = args[4]
    before = output.clone()
    with pytest.raises(ValueError, match="bias must have dtype"):
        fp4.dense_gemm(*args, **kwargs)
    assert torch.equal(output, before)


def test_group_masked_gemm_invalid_masked_m_leaves_output_untouched(fp4):
    args, kwargs = broken_call("group_masked_gemm", arg(4, ints(49, 5, 0)))
    output = args[5]
    before = output.clone()
    with pytest.raises(ValueError, match=re.escape("masked_m must lie in [0, 48]")):
        fp4.group_masked_gemm(*args, **kwargs)
    assert torch.equal(output, before)


def test_nvfp4_gemm_invalid_call_leaves_out_untouched(fp4):
    out = torch.full((40, 64), 7.0, dtype=BF16)
    args, kwargs = broken_call("nvfp4_gemm_bias_bf16", both(arg(4, rows(32)), kwarg("out", out)))
    with pytest.raises(ValueError, match=re.escape("bias must have shape (64,)")):
        fp4.nvfp4_gemm_bias_bf16(*args, **kwargs)
    assert (out == 7.0).all()


def test_quantizer_invalid_call_leaves_packed_untouched(fp4):
    packed = torch.full((40, 64), 0xA5, dtype=U8)
    args, kwargs = broken_call("quantize_fp4_sfa_bf16", buffers(lambda _: packed, zeros(1023, dtype=U8)))
    with pytest.raises(ValueError, match="sfa must hold the swizzled scales"):
        fp4.quantize_fp4_sfa_bf16(*args, **kwargs)
    assert (packed == 0xA5).all()


# ---- rules that once crashed or were accepted instead of raising ValueError ------------------------


REGRESSIONS = [
    case(
        "batch_gemm",
        "input-rank-1",
        arg(0, flat),
        "input must be 3-D",
    ),
    case(
        "batch_gemm",
        "input-not-a-tensor",
        arg(0, [[0]]),
        "input must be a torch.Tensor",
    ),
    case(
        "fp4_w4a4_gemm_warpsplit_mrows_bf16",
        "a-rank-1",
        arg(0, flat),
        "a_packed must be 2-D",
    ),
    case(
        "fp4_w4a4_gemm_warpsplit_mrows_bf16",
        "a-not-a-tensor",
        arg(0, None),
        "a_packed must be a torch.Tensor",
    ),
    case(
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
        "a-rank-1",
        arg(0, flat),
        "a_packed must be 2-D",
    ),
    case(
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
        "b-not-a-tensor",
        arg(1, None),
        "b_packed must be a torch.Tensor",
    ),
    case(
        "fp4_w4a4_gemm_warpsplit_mrows_bf16",
        "warps-float",
        kwarg("warps", 2.0),
        WARPS,
    ),
    case(
        "nvfp4_gemm_variant_bf16",
        "variant-float",
        kwarg("variant", 1.0),
        "variant must be one of",
    ),
    case(
        "nvfp4_gemm_variant_bf16",
        "variant-bool",
        kwarg("variant", True),
        "variant must be one of",
    ),
    case(
        "e0m3_weight_gemm_fp16",
        "a-format-bool",
        kwarg("a_format", True),
        A_FORMAT,
    ),
    case(
        "dense_gemm",
        "mode-unhashable",
        kwarg("mode", ["w8a8-mxfp8"]),
        "mode must be one of",
    ),
]


@pytest.mark.parametrize("name,mutation,rule", REGRESSIONS)
def test_regression_broken_call_raises_value_error(fp4, name, mutation, rule):
    args, kwargs = broken_call(name, mutation)
    with pytest.raises(ValueError, match=re.escape(rule)):
        getattr(fp4, name)(*args, **kwargs)


# ---- empty problems and in-place calls: accepted, and what they compute --------------------------


def test_batch_gemm_without_batch_items_launches_nothing(fp4):
    args, kwargs = make_call("batch_gemm", "cpu")  # mxfp4: input [3, 40, 64], weight [3, 64, 64]
    args[:5] = [t[:0] for t in args[:2]] + [torch.zeros(0, dtype=U8)] * 2 + [args[4][:0]]
    with OpRecorder(fp4.ops.name) as recorder:
        fp4.batch_gemm(*args, **kwargs)
    assert recorder.called == []


@pytest.mark.parametrize("name", ["group_contiguous_gemm", "group_masked_gemm"])
def test_grouped_gemms_without_experts_write_nothing(fp4, name):
    args, kwargs = make_call(name, "cpu")
    args[1], args[3] = args[1][:0], torch.zeros(0, dtype=U8)  # weight [0, N, K], its scales
    kwargs |= {key: kwargs[key][:0] for key in ("alpha", "bias") if key in kwargs}  # one per expert: none
    if name == "group_contiguous_gemm":
        args[4] = torch.full_like(args[4], -1)  # no expert: every row is padding
    else:
        args[0], args[2], args[4], args[5] = args[0][:0], torch.zeros(0, dtype=U8), args[4][:0], args[5][:0]
    output = args[-1]
    before = output.clone()
    with OpRecorder(fp4.ops.name) as recorder:
        getattr(fp4, name)(*args, **kwargs)
    assert recorder.called == [] and torch.equal(output, before), name


@pytest.mark.parametrize("where", DEVICES)
def test_prefill_permute_with_topk_0_routes_nothing(fp4, where):
    args, _ = make_call("prefill_permute_to_masked_gemm", where)
    args[2] = args[2][:, :0].contiguous()  # topk_ids [50, 0]
    permute_x, scales, index_map, counts = fp4.prefill_permute_to_masked_gemm(*args)
    assert tuple(index_map.shape) == (50, 0)
    assert not permute_x.view(U8).any() and not scales.any() and not counts.any(), where


@pytest.mark.parametrize("where", DEVICES)
def test_gemm_out_may_be_its_own_residual(fp4, ref, where):
    """out = residual: each element's residual is read before its output is written (in-place add)."""
    args, kwargs = make_call("nvfp4_gemm_residual_bf16", where)  # residual is args[4]
    separate = fp4.nvfp4_gemm_residual_bf16(*args, **kwargs)
    residual = args[4].clone()
    args[4] = residual
    assert fp4.nvfp4_gemm_residual_bf16(*args, out=residual, **kwargs) is residual
    assert torch.equal(residual, separate), where


def test_alpha_inf_and_nan_are_numbers_the_kernels_take(fp4):
    args, _ = make_call("nvfp4_gemm_bf16", "cpu")
    assert fp4.nvfp4_gemm_bf16(*args, alpha=float("nan")).isnan().all()
    assert fp4.nvfp4_gemm_bf16(*args, alpha=float("inf")).isinf().any()


# ---- remembered verdicts (_validate.checked): what they key on ----------------------------------


def test_a_verdict_is_keyed_on_contiguity_and_value_types(fp4):
    args, kwargs = make_call("dense_gemm", "cpu")
    fp4.dense_gemm(*args, **kwargs, sm_count=1)
    with pytest.raises(ValueError, match=re.escape(SM_COUNT)):
        fp4.dense_gemm(*args, **kwargs, sm_count=True)  # True == 1, but not an int
    broken = list(args)
    broken[0] = strided(args[0])  # the same shape and dtype, not contiguous
    with pytest.raises(ValueError, match="input must be contiguous"):
        fp4.dense_gemm(*broken, **kwargs)


def test_a_decode_tier_verdict_is_keyed_on_its_knobs_types(fp4):
    """The tiers' warps and stages share the GEMM's verdict: stages=True (== 1) is still no integer."""
    args, kwargs = make_call("fp4_w4a4_gemm_warpsplit_mrows_bf16", "cpu")
    fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*args, **kwargs | {"stages": 1})
    with pytest.raises(ValueError, match="stages must be an integer"):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*args, **kwargs | {"stages": True})


def test_verdicts_are_forgotten_beyond_their_bound(fp4):
    validate = fp4._validate
    for k in range(validate.MAX_VERDICTS + 10):
        validate.checked(lambda k: None, k)
    assert len(validate._VERDICTS) <= validate.MAX_VERDICTS
