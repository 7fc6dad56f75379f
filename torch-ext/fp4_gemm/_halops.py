"""The halops-style API: group_wise_quant, the dense/batched/grouped GEMMs, fused SwiGLU+quant and
the MoE permute. Modes: "w8a8-mxfp8" (E4M3 + UE8M0 per 32), "w4a4-mxfp4" (E2M1 + UE8M0 per 32),
"w4a4-nvfp4" (E2M1 + UE4M3 per 16); the GEMMs also take this package's weight-only modes
"w4a16-nvfp4" and "w4a16-mxfp4" (bf16 activations [..., K] as they are, sfa None, weights as in the
w4a4 modes). GEMM outputs are bfloat16 tensors written in place.

Scale buffers are CUTLASS SfAtom (docs/FORMATS.md) over the flattened rows of their tensor: sfa
covers the rows of input (B*M for batch_gemm), sfb the rows of weight (E*N for [E, N, K]); any shape
whose size is exactly ceil(rows/128) * ceil(K/g/4) * 512 bytes is accepted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _validate, reference
from ._gemm import GemmCall, op_entry
from ._ops import ops


def group_wise_quant(
    input: torch.Tensor, mode: str = "w8a8-mxfp8", use_swizzle: bool = True, use_pdl: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a bf16/fp16 matrix block by block along K.

    Parameters
    ----------
    input : torch.Tensor
        [m, k] bfloat16 or float16, contiguous, CPU or CUDA; k a multiple of the mode's block (32, 32, 16).
    mode : str
        "w8a8-mxfp8", "w4a4-mxfp4" or "w4a4-nvfp4".
    use_swizzle : bool
        True: SfAtom scales shown as uint8 [ceil(m/128)*128, ceil(k/g/4)*4] (padding bytes 0; element
        [i, j] is not the scale of row i, block j). False: plain row-major uint8 [m, k/g].
    use_pdl : bool
        Programmatic dependent launch on CUDA (no numeric effect).

    Returns
    -------
    (values, scales): float8_e4m3fn [m, k] (mxfp8) or uint8 [m, k/2] packed E2M1 (element 2i in the
    low nibble); uint8 scales (UE8M0 for the MX modes, UE4M3 for nvfp4).
    """
    recipe, values_shape, dtype, scale_shape = _validate.group_wise_quant(input, mode, use_swizzle, use_pdl)
    device = input.device
    values = torch.empty(*values_shape, dtype=dtype, device=device)
    scales = torch.empty(*scale_shape, dtype=torch.uint8, device=device)
    ops.quantize(input, recipe, use_swizzle, use_pdl, values, scales)
    return values, scales


def _halops_gemm(
    grouping: str,
    mode: str,
    input: torch.Tensor,
    weight: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    output: torch.Tensor,
    bias: torch.Tensor | None,
    alpha: torch.Tensor | None,
    sm_count: int,
    group_index: torch.Tensor | None = None,
    group_rows: int = 0,
    use_pdl: bool = True,
) -> None:
    groups, codes, run = _validate.checked(
        _remembered, grouping, mode, input, weight, sfa, sfb, output, bias, alpha, sm_count, group_index, group_rows,
        use_pdl,
    )  # fmt: skip
    _validate.halops_gemm_data(grouping, groups, input, weight, sfa, sfb, output, bias, alpha, group_index, group_rows)
    if codes is not None:
        run(input, weight, sfa, sfb, group_index, alpha, bias, None, output, None, codes[0], 1.0, codes[1])


def _remembered(*parts: object) -> tuple[int, tuple[int, int] | None, Callable[..., None]]:
    """What a halops GEMM remembers for its metadata (_validate.checked, on _halops_gemm's arguments):
    the number of weight matrices, the op's packed fields of its GemmCall (GemmCall.codes), None for
    a call without rows of A or of B, which launches nothing (GemmCall.run), and the op's entry
    (op_entry)."""
    grouping, mode, input, weight, sfa, sfb, output, bias, alpha, sm_count, group_index, max_m, use_pdl = parts
    a_format, b_format, groups, group_rows = _validate.halops_gemm_rules(*parts)
    call = GemmCall(
        input, weight, sfa, sfb, a_format, b_format, grouping=grouping, group_index=group_index,
        group_rows=group_rows, alpha=alpha, bias=bias, out=output, sm_count=sm_count, pdl=use_pdl,
    )  # fmt: skip
    empty = input.numel() == 0 or weight.numel() == 0
    return groups, None if empty else call.codes(), op_entry()


def dense_gemm(
    input: torch.Tensor,
    weight: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    output: torch.Tensor,
    bias: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    sm_count: int = -1,
    mode: str = "w8a8-mxfp8",
    use_pdl: bool = True,
) -> None:
    """output = alpha * (input @ weight^T) + bias, written in place.

    input [M, K] (float8_e4m3fn for mxfp8, uint8 [M, K/2] packed for the FP4 modes, bfloat16 [M, K] for
    the w4a16 modes), weight [N, K] stored as in the mode's format; sfa/sfb SfAtom scales of M and N
    rows (sfa None in the w4a16 modes); output bfloat16 [M, N]; bias bfloat16 [N] (any mode); alpha
    float32 [1] (required for w4a4-nvfp4, optional otherwise); sm_count -1 or > 0.
    """
    _halops_gemm("dense", mode, input, weight, sfa, sfb, output, bias, alpha, sm_count, use_pdl=use_pdl)


def batch_gemm(
    input: torch.Tensor,
    weight: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    output: torch.Tensor,
    bias: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    sm_count: int = -1,
    mode: str = "w8a8-mxfp8",
) -> None:
    """output[b] = alpha[b] * (input[b] @ weight[b]^T) + bias[b], written in place.

    input [B, M, K], weight [B, N, K] (packed as in dense_gemm); sfa over the B*M rows, sfb over the
    B*N rows; output bfloat16 [B, M, N]; bias bfloat16 [B, N]; alpha float32 [B].
    """
    _halops_gemm("batched", mode, input, weight, sfa, sfb, output, bias, alpha, sm_count)


def group_contiguous_gemm(
    input: torch.Tensor,
    weight: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    expert_ids: torch.Tensor,
    output: torch.Tensor,
    bias: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    sm_count: int = -1,
    mode: str = "w8a8-mxfp8",
) -> None:
    """output[m] = alpha[e] * (input[m] @ weight[e]^T) + bias[e] with e = expert_ids[m], in place.

    input [M, K] tokens packed contiguously; weight [E, N, K]; expert_ids int32 [M], non-decreasing,
    each expert's rows consecutive; -1 marks a padding row that is not written, before, between or
    after experts' rows (ids outside [-1, E) are skipped too); output bfloat16 [M, N]; bias bfloat16
    [E, N]; alpha float32 [E].
    """
    _halops_gemm("contiguous", mode, input, weight, sfa, sfb, output, bias, alpha, sm_count, expert_ids)


def group_masked_gemm(
    input: torch.Tensor,
    weight: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    masked_m: torch.Tensor,
    output: torch.Tensor,
    bias: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    max_m_per_expert: int = 0,
    sm_count: int = -1,
    mode: str = "w8a8-mxfp8",
) -> None:
    """For expert e and i < masked_m[e]: output[e*max_m + i] = alpha[e] * (input[e*max_m + i] @
    weight[e]^T) + bias[e], in place; other rows are not written (masked_m is clamped to [0, max_m]).

    input [E * max_m, K]; weight [E, N, K]; masked_m int32 [E]; output bfloat16 [E * max_m, N];
    max_m_per_expert > 0.
    """
    _halops_gemm("masked", mode, input, weight, sfa, sfb, output, bias, alpha, sm_count, masked_m, max_m_per_expert)


def swiglu_quant_outputs(rows: int, hidden: int, is_fp4: bool, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Zero-filled outputs of fused_swiglu_quant: rows a group does not own stay zero."""
    fmt = reference.NVFP4 if is_fp4 else reference.MXFP8
    dtype = torch.uint8 if is_fp4 else torch.float8_e4m3fn
    values = torch.zeros(rows, fmt.stored_cols(hidden), dtype=dtype, device=device)
    scales = torch.zeros(*reference.swizzled_scale_shape(rows, hidden // fmt.group), dtype=torch.uint8, device=device)
    return values, scales


def fused_swiglu_quant(
    input: torch.Tensor, token_nums_per_expert: torch.Tensor, is_fp4: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = up * silu(gate) for input = [gate | up], quantized: FP8 (MXFP8, blocks of 32) or FP4 (NVFP4,
    blocks of 16).

    input bfloat16 [E * M, 2 * hidden]; token_nums_per_expert int32 [E]: expert e owns its first
    clamp(count, 0, M) rows. Returns (values, scales): float8_e4m3fn [E*M, hidden] or uint8
    [E*M, hidden/2]; SfAtom scales uint8 [ceil(E*M/128)*128, ceil(hidden/g/4)*4]. Rows an expert does
    not own are zero (values and scales).
    """
    _validate.swiglu_quant(input, token_nums_per_expert, is_fp4)
    values, scales = swiglu_quant_outputs(input.shape[0], input.shape[1] // 2, is_fp4, input.device)
    ops.swiglu_quant(input, token_nums_per_expert, "nvfp4" if is_fp4 else "mxfp8", values, scales)
    return values, scales


def permute_outputs(
    x: torch.Tensor, topk_ids: torch.Tensor, num_local_experts: int, max_token_num: int
) -> tuple[torch.Tensor, ...]:
    """Outputs of prefill_permute_to_masked_gemm, uninitialized: the op writes every byte."""
    rows, hidden = num_local_experts * max_token_num, x.shape[1]
    return (
        torch.empty(rows, hidden, dtype=x.dtype, device=x.device),
        torch.empty(num_local_experts, max_token_num, hidden // 32, dtype=torch.uint8, device=x.device),
        torch.empty(*topk_ids.shape, dtype=torch.int32, device=x.device),
        torch.empty(num_local_experts, 1, dtype=torch.int32, device=x.device),
    )


def prefill_permute_to_masked_gemm(
    x: torch.Tensor, scale: torch.Tensor, topk_ids: torch.Tensor, num_local_experts: int, max_token_num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Route tokens into the padded [E * max_token_num] layout of group_masked_gemm.

    x [T, hidden] float8_e4m3fn or bfloat16; scale int32 [T, hidden/512] (broadcast: byte j of column
    i is the UE8M0 scale of 128-element group 4i+j) or uint8 [T, hidden/32] (direct); topk_ids int64
    [T, topk], ids outside [0, E) unassigned. Tokens keep (token, slot) order within an expert.
    Returns (permute_x [E*max_token_num, hidden], output_scale uint8 [E, max_token_num, hidden/32]
    SfAtom, permuted_indice_map int32 [T, topk] (expert-local row, -1 if unassigned or beyond
    max_token_num), token_nums_per_expert int32 [E, 1] (the true count, so overflow is visible)).
    Rows no token lands on are zero; nothing is written beyond max_token_num.
    """
    _validate.permute(x, scale, topk_ids, num_local_experts, max_token_num)
    outputs = permute_outputs(x, topk_ids, num_local_experts, max_token_num)
    ops.permute_to_masked(x, scale, topk_ids, num_local_experts, max_token_num, *outputs)
    return outputs
