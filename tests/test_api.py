"""The whole public surface: forty functions, the specs' signatures, CPU == reference, CUDA == CPU
(bit for bit; GEMM float outputs within a float32-accumulation tolerance and NVFP4 outputs within
one code step, since native GEMMs sum in a different order: tests/test_gemm_*.py hold them to the
exact docs/FORMATS.md bound), and every function traces under torch.compile(fullgraph=True)."""

from __future__ import annotations

import inspect

import pytest
import torch
from api_cases import CASES, make_call, outcome
from checks import assert_nvfp4_outputs_close, assert_same_results, ulp

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
CALLABLE = sorted(CASES)
TRACEABLE = [name for name in CALLABLE if name not in ("sfa_size_bytes", "nvfp4_gemm_m256_workspace_size")]


@pytest.mark.kernels_ci
def test_public_api_is_the_forty_functions_of_both_specs(fp4):
    assert len(HALOPS) + len(FLASHRT) == 40
    assert sorted(fp4.__all__) == sorted(HALOPS + FLASHRT)
    assert set(CASES) == set(fp4.__all__) - {"capabilities"}


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", sorted(set(HALOPS + FLASHRT) - {"capabilities"}))
def test_reference_has_the_same_signature(fp4, ref, name):
    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(getattr(fp4, name)) == shape(getattr(ref, name)), name


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", CALLABLE)
def test_cpu_call_matches_reference(fp4, ref, name):
    args, kwargs = make_call(name, "cpu")
    got = outcome(name, getattr(fp4, name)(*args, **kwargs), args)
    args, kwargs = make_call(name, "cpu")
    expected = outcome(name, getattr(ref, name)(*args, **kwargs), args)
    assert_same_results(got, expected, name)


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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
