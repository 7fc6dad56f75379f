"""The whole public surface: forty functions, the specs' signatures, every GEMM on the CPU against
its documented formula written out here, CUDA == CPU (bit for bit; GEMM float outputs within a
float32-accumulation tolerance and NVFP4 outputs within one code step, since native GEMMs sum in a
different order: tests/test_gemm_*.py hold them to the exact docs/FORMATS.md bound), and every
function traces under torch.compile(fullgraph=True)."""

from __future__ import annotations

import inspect

import pytest
import torch
from api_cases import CASES, make_call, outcome
from checks import (
    assert_nvfp4_output_within_bound,
    assert_nvfp4_outputs_close,
    assert_same_results,
    assert_within_bound,
    gelu64,
    ulp,
)
from conftest import requires_arch

HALOPS = [
    "group_wise_quant",
    "dense_gemm",
    "batch_gemm",
    "group_contiguous_gemm",
    "group_masked_gemm",
    "fused_swiglu_quant",
    "prefill_permute_to_masked_gemm",
]
FLASHRT = [
    "sfa_size_bytes", "capabilities", "quantize_fp4_sfa_fp16", "quantize_fp4_sfa_bf16", "quantize_fp4_sfa_mse_fp16",
    "quantize_fp4_sfa_mse_bf16", "quantize_fp4_sfa_padded_bf16", "pack_nvfp4_weight_bf16", "quantize_e0m3_sfa_fp16",
    "dequantize_fp4_sfa_fp16", "nvfp4_gemm_bf16", "nvfp4_gemm_fp16", "nvfp4_gemm_variant_bf16", "nvfp4_gemm_nvfp4",
    "nvfp4_gemm_geglu_nvfp4_fp16", "cutlass_fp4_gemm_geglu_il_hw_v10", "nvfp4_gemm_bias_gelu_nvfp4_fp16",
    "nvfp4_gemm_bias_residual_fp16", "nvfp4_gemm_bias_bf16", "nvfp4_gemm_bias_residual_bf16",
    "nvfp4_gemm_residual_bf16", "nvfp4_gemm_bias_gelu_bf16", "nvfp4_gemm_bias_gelu_nvfp4", "nvfp4_gemm_streamk_bf16",
    "nvfp4_gemm_streamk_bias_bf16", "fp4_w4a16_linear_bf16", "fp4_repack_b_interleaved_sm120",
    "fp4_w4a4_gemv_warpsplit_interleaved_bf16", "fp4_w4a4_gemm_warpsplit_mrows_bf16",
    "nvfp4_gemm_m256_workspace_size", "nvfp4_gemm_m256_bf16", "e0m3_weight_gemm_fp16", "nvfp4_gemm_relu2_nvfp4",
]  # fmt: skip
# what the flashrt package added since its seed card (shared/spec/flashrt-head.md) and this package has
FLASHRT_HEAD = [
    "aligned_fp4_dim",
    "quantize_fp4_sfa_bf16_pdl",
    "fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16",
    "fp4_w4a4_gemv_warpsplit_bf16",
    "allocate_w4a16_marlin_workspace",
    "adopt_nvfp4_w4a16_marlin",
    "nvfp4_w4a16_marlin_bf16",
]
FLASHRT_CONSTANTS = [
    "NVFP4_BLOCK_SIZE",
    "NVFP4_SCALE_TILE_ROWS",
    "NVFP4_SCALE_TILE_BLOCKS",
    "SUPPORTED_LAYOUTS",
    "SUPPORTED_CUDA_CAPABILITIES",
]
CALLABLE = sorted(CASES)
HOST_ONLY = ("sfa_size_bytes", "nvfp4_gemm_m256_workspace_size", "aligned_fp4_dim", "allocate_w4a16_marlin_workspace")
TRACEABLE = [name for name in CALLABLE if name not in HOST_ONLY]


@pytest.mark.kernels_ci
def test_public_api_is_the_forty_functions_of_both_specs_and_flashrts_additions(fp4):
    specs = HALOPS + FLASHRT
    repeated = sorted({name for name in specs if specs.count(name) > 1})
    assert len(set(specs)) == 40, f"the specs name forty distinct functions; repeated: {repeated}"
    public = list(fp4.__all__)
    assert len(set(public)) == len(public), f"__all__ repeats {sorted({n for n in public if public.count(n) > 1})}"
    functions = specs + FLASHRT_HEAD
    missing = [name for name in functions + FLASHRT_CONSTANTS + ["layers"] if name not in public]
    assert not missing, f"not in fp4.__all__: {missing}"
    unlisted = sorted(set(public) - {*functions, *FLASHRT_CONSTANTS, "layers"})
    assert not unlisted, f"fp4.__all__ has names no spec or flashrt addition lists: {unlisted}"
    not_callable = [name for name in functions if not callable(getattr(fp4, name, None))]
    assert not not_callable, f"not functions of the package: {not_callable}"
    assert inspect.ismodule(getattr(fp4, "layers", None)), "fp4.layers is not the layers module"
    assert set(CASES) == set(public) - {"layers", "capabilities", *FLASHRT_CONSTANTS}


@pytest.mark.kernels_ci
def test_flashrt_constants_are_this_packages_values(fp4):
    caps = fp4.capabilities()
    assert fp4.NVFP4_BLOCK_SIZE == caps["block_size"] == 16
    layout = caps["swizzled_scale_layout"]
    assert (fp4.NVFP4_SCALE_TILE_ROWS, fp4.NVFP4_SCALE_TILE_BLOCKS) == (layout["tile_rows"], layout["tile_blocks"])
    assert fp4.SUPPORTED_LAYOUTS == caps["layouts"]
    assert fp4.SUPPORTED_CUDA_CAPABILITIES == caps["cuda_capabilities"]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dim, alignment, physical", [(4304, 32, 4320), (4320, 32, 4320), (1, 16, 16), (100, 48, 144)])
def test_aligned_fp4_dim_rounds_up_to_the_alignment(fp4, dim, alignment, physical):
    assert fp4.aligned_fp4_dim(dim, alignment) == physical
    x = torch.zeros(2, dim, dtype=torch.bfloat16)
    assert fp4.quantize_fp4_sfa_padded_bf16(x, alignment=alignment)[0].shape[1] * 2 == physical


# ---- every GEMM on the CPU is its documented formula ------------------------------------------

# public GEMM -> (activation, output) of docs/API.md's tables; bias, residual and alpha are applied
# when the call passes them
GEMM_RESULTS = {
    "dense_gemm": ("none", "bf16"),
    "batch_gemm": ("none", "bf16"),
    "group_contiguous_gemm": ("none", "bf16"),
    "group_masked_gemm": ("none", "bf16"),
    "nvfp4_gemm_bf16": ("none", "bf16"),
    "nvfp4_gemm_fp16": ("none", "fp16"),
    "nvfp4_gemm_variant_bf16": ("none", "bf16"),
    "fp4_w4a16_linear_bf16": ("none", "bf16"),
    "nvfp4_gemm_streamk_bf16": ("none", "bf16"),
    "nvfp4_gemm_streamk_bias_bf16": ("none", "bf16"),
    "nvfp4_gemm_bias_bf16": ("none", "bf16"),
    "nvfp4_gemm_residual_bf16": ("none", "bf16"),
    "nvfp4_gemm_bias_residual_bf16": ("none", "bf16"),
    "nvfp4_gemm_bias_residual_fp16": ("none", "fp16"),
    "nvfp4_gemm_bias_gelu_bf16": ("gelu", "bf16"),
    "nvfp4_gemm_nvfp4": ("none", "nvfp4"),
    "nvfp4_gemm_relu2_nvfp4": ("relu2", "nvfp4"),
    "nvfp4_gemm_bias_gelu_nvfp4": ("gelu", "nvfp4"),
    "nvfp4_gemm_bias_gelu_nvfp4_fp16": ("gelu", "nvfp4_from_fp16"),
    "nvfp4_gemm_geglu_nvfp4_fp16": ("geglu", "nvfp4_from_fp16"),
    "cutlass_fp4_gemm_geglu_il_hw_v10": ("geglu", "nvfp4_from_fp16"),
    "e0m3_weight_gemm_fp16": ("none", "fp16"),
    "fp4_w4a4_gemv_warpsplit_interleaved_bf16": ("none", "bf16"),
    "fp4_w4a4_gemm_warpsplit_mrows_bf16": ("none", "bf16"),
    "nvfp4_gemm_m256_bf16": ("none", "bf16"),
}
HALOPS_FORMATS = {"w8a8-mxfp8": "mxfp8", "w4a4-mxfp4": "mxfp4", "w4a4-nvfp4": "nvfp4"}
# the largest slope of the erf GELU: an error of its input carries over at most that much
GELU_SLOPE = 1.13


def dequantized(ref, values: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """Exact float64 [rows, K] of stored values (all but the last dimension are rows)."""
    return ref.dequantize(values, scales, ref.FORMATS[fmt]).double()


def row_groups(args: dict, rows: int) -> tuple[list[int], list[bool]]:
    """The weight of each row of A and whether the function writes it (docs/API.md, grouped GEMMs)."""
    if "expert_ids" in args:
        experts = args["weight"].shape[0]
        ids = args["expert_ids"].tolist()
        return [max(i, 0) for i in ids], [0 <= i < experts for i in ids]
    if "masked_m" in args:
        max_m = args["max_m_per_expert"]
        return [r // max_m for r in range(rows)], [r % max_m < args["masked_m"][r // max_m] for r in range(rows)]
    if args.get("input") is not None and args["input"].dim() == 3:
        return [r // args["input"].shape[1] for r in range(rows)], [True] * rows
    return [0] * rows, [True] * rows


def documented_result(ref, name: str, args: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """(y after the epilogue in float64 [rows, N_out], |A| scaled as the bound needs, B per row, owned)."""
    activation, _ = GEMM_RESULTS[name]
    if "mode" in args:  # halops
        a_format = b_format = HALOPS_FORMATS[args["mode"]]
        a, b = args["input"], args["weight"]
    else:
        a_format, b_format = ("e0m3", "e0m3") if args.get("a_format") == 0 else ("nvfp4", "nvfp4")
        if name == "e0m3_weight_gemm_fp16":
            b_format = "e0m3"
        a = args["a_packed"]
        b = next(args[key] for key in ("b_packed", "b_interleaved_packed", "b_interleaved") if key in args)
        if name == "fp4_w4a4_gemv_warpsplit_interleaved_bf16":
            b = ref.deinterleave_rows(b)
    a_dq = dequantized(ref, a, args["sfa"], a_format)
    b_dq = dequantized(ref, b, args["sfb"], b_format).reshape(-1, b.shape[-2], a_dq.shape[1])
    groups, owned = row_groups(args, a_dq.shape[0])
    alpha = args.get("alpha")
    alphas = [1.0] if alpha is None else alpha.tolist() if torch.is_tensor(alpha) else [float(alpha)]
    rows, weights = [], []
    for r, g in enumerate(groups):
        y = alphas[g if len(alphas) > 1 else 0] * (a_dq[r] * b_dq[g]).sum(-1)
        bias = args.get("bias")
        if bias is not None:
            y = y + (bias[g] if bias.dim() == 2 else bias).double()
        if args.get("residual") is not None:
            y = y + args["residual"][r].double()
        rows.append({"none": y, "gelu": gelu64(y), "relu2": torch.relu(y) ** 2}.get(activation, None))
        if activation == "geglu":
            rows[-1] = gelu64(y[0::2]) * y[1::2]
        weights.append(b_dq[g])
    slope = GELU_SLOPE if activation in ("gelu", "geglu") else 1.0
    scale = slope * max(abs(a) for a in alphas)
    return torch.stack(rows), a_dq * scale, torch.stack(weights), owned


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", sorted(GEMM_RESULTS))
def test_cpu_gemm_computes_its_documented_formula(fp4, ref, name):
    args, kwargs = make_call(name, "cpu")
    bound = inspect.signature(getattr(fp4, name)).bind(*args, **kwargs)
    bound.apply_defaults()
    got = outcome(name, getattr(fp4, name)(*args, **kwargs), args)
    expected, a_scaled, b_rows, owned = documented_result(ref, name, dict(bound.arguments))
    _, output = GEMM_RESULTS[name]
    if output.startswith("nvfp4"):
        if output == "nvfp4_from_fp16":
            expected = expected.half().double()
        assert_nvfp4_output_within_bound(ref, *got, expected, name)
        return
    got = got.reshape(expected.shape[0], -1)
    for r, (is_owned, b) in enumerate(zip(owned, b_rows, strict=True)):
        if is_owned:
            assert_within_bound(got[r : r + 1], expected[r : r + 1], a_scaled[r : r + 1], b, f"{name} row {r}")
        else:
            assert (got[r] == 7.0).all(), f"{name}: row {r} is not the function's, and was written"


def assert_gemm_close(got: object, expected: object, what: str) -> None:
    """Float outputs within 2 ulp + 2^-12 * max |expected| (the K = 128 calls here accumulate far less
    error than that); NaN where and only where expected; anything else bit for bit."""
    if not (isinstance(expected, torch.Tensor) and expected.dtype in (torch.bfloat16, torch.float16)):
        assert_same_results(got, expected, what)
        return
    got, ref = got.cpu().double(), expected.double()
    assert torch.equal(got.isnan(), ref.isnan()), f"{what}: NaN positions differ"
    finite = ~ref.isnan()
    tolerance = 2 * ulp(ref, expected.dtype) + 2.0**-12 * ref[finite].abs().max()
    assert bool(((got - ref).abs() <= tolerance)[finite].all()), f"{what}: beyond the tolerance"


@requires_arch()
@pytest.mark.parametrize("name", CALLABLE)
def test_cuda_call_matches_cpu_call(fp4, device, name):
    gemm = fp4._capabilities.FUNCTION_OPS.get(name) == "gemm"
    compare = assert_gemm_close if gemm else assert_same_results
    for seed in (0, 1):
        args, kwargs = make_call(name, device, seed)
        got = outcome(name, getattr(fp4, name)(*args, **kwargs), args)
        args, kwargs = make_call(name, "cpu", seed)
        expected = outcome(name, getattr(fp4, name)(*args, **kwargs), args)
        if gemm and isinstance(expected, tuple):  # an NVFP4 output: (packed, scales)
            assert_nvfp4_outputs_close(fp4.reference, got, expected, f"{name} seed={seed}")
        elif isinstance(expected, tuple):
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                compare(g, e, f"{name} seed={seed} [{i}]")
        else:
            compare(got, expected, f"{name} seed={seed}")


@requires_arch()
@pytest.mark.parametrize("name", TRACEABLE)
def test_cuda_call_replays_in_a_cuda_graph(fp4, device, name):
    args, kwargs = make_call(name, device)
    expected = outcome(name, getattr(fp4, name)(*args, **kwargs), args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = outcome(name, getattr(fp4, name)(*args, **kwargs), args)
    graph.replay()
    torch.cuda.synchronize()
    assert_same_results(captured, expected, f"{name} graph replay")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", TRACEABLE)
def test_compiles_fullgraph(fp4, name):
    torch._dynamo.reset()
    args, kwargs = make_call(name, "cpu")
    compiled = torch.compile(getattr(fp4, name), fullgraph=True, backend="aot_eager")
    got = outcome(name, compiled(*args, **kwargs), args)
    args, kwargs = make_call(name, "cpu")
    expected = outcome(name, getattr(fp4, name)(*args, **kwargs), args)
    assert_same_results(got, expected, f"compiled {name}")
