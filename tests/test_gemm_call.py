"""GemmCall (torch-ext/fp4_gemm/_gemm.py), the one description of a `gemm` op call: it is the op's
schema by name, every public GEMM function issues exactly the call it builds, capabilities() asks
the backends about the calls the public functions really make (bias and residual dtypes included),
and `described_call` (what the tests ask the backends about) builds the same calls."""

from __future__ import annotations

import pytest
import torch
from api_cases import nvfp4_operand
from checks import OpRecorder

pytestmark = pytest.mark.kernels_ci


def gemm_calls(fp4, name: str):
    return fp4._capabilities.gemm_calls(name)


GEMM_OP_ARGUMENTS = [
    "a", "b", "sfa", "sfb", "group_index", "alpha", "bias", "residual", "out", "out_scales", "kind", "alpha_scale",
    "knobs",
]  # fmt: skip


def test_gemm_op_takes_the_call_tensors_then_its_packed_fields(fp4):
    names = [argument.name for argument in fp4.ops.gemm.default._schema.arguments]
    assert names == GEMM_OP_ARGUMENTS
    tensors = [name for name in names if name not in ("kind", "alpha_scale", "knobs")]
    assert set(tensors) <= set(fp4._gemm.GemmCall._fields)


@pytest.mark.parametrize("op", ["gemm_reference", "gemm_on", "gemm_backends"])
def test_every_gemm_op_takes_the_gemm_arguments(fp4, op):
    names = [argument.name for argument in getattr(fp4.ops, op).default._schema.arguments]
    assert names[-len(GEMM_OP_ARGUMENTS) :] == GEMM_OP_ARGUMENTS, op


def test_packed_fields_are_every_other_gemm_call_field_and_do_not_overlap(fp4):
    fields, shifts, bits, offsets = fp4.ops.gemm_packing()
    packed = {name.split(".", 1)[1] for name in fields}
    assert packed == set(fp4._gemm.GemmCall._fields) - set(GEMM_OP_ARGUMENTS)
    for prefix in ("kind.", "knobs."):
        spans = sorted((s, s + w) for f, s, w in zip(fields, shifts, bits, strict=True) if f.startswith(prefix))
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False)), prefix
        assert spans[-1][1] <= 63, f"{prefix} fits a non-negative int64"
    for field, width in zip(fields, bits, strict=True):
        name = field.split(".", 1)[1]
        if name in fp4._gemm._CODES:
            assert len(fp4.ops.gemm_names(name)) <= 1 << width, field


def packing_cases(fp4, a, b, sfa, sfb, out):
    """GemmCalls that give every named field each of its names and every integer field its extremes."""
    call = fp4._gemm.GemmCall(a, b, sfa, sfb, out=out)
    fields, shifts, bits, offsets = fp4.ops.gemm_packing()
    for field, width, offset in zip(fields, bits, offsets, strict=True):
        name = field.split(".", 1)[1]
        if name in fp4._gemm._CODES:
            values = fp4.ops.gemm_names(name)
        elif isinstance(call._field_defaults[name], bool):
            values = [False, True]
        else:
            values = [-offset, 1 - offset, (1 << width) - 1 - offset]
        for value in values:
            yield name, value, call._replace(**{name: value})


def test_op_arguments_unpack_to_the_same_call(fp4):
    a, sfa = nvfp4_operand(4, 64, seed=1)
    b, sfb = nvfp4_operand(16, 64, seed=2)
    out = torch.empty(4, 16, dtype=torch.bfloat16)
    for name, value, call in packing_cases(fp4, a, b, sfa, sfb, out):
        arguments = call.op_arguments()
        assert len(arguments) == len(GEMM_OP_ARGUMENTS)
        back = fp4._gemm.GemmCall.from_op_arguments(*arguments)
        assert all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(back, call, strict=True)), name
        assert type(getattr(back, name)) is type(value), name


@pytest.mark.parametrize(
    "field, value",
    [("a_format", "fp8"), ("activation", "silu"), ("out_format", "fp32"), ("schedule", 1), ("warps", -1),
     ("stages", 256), ("variant", -2), ("sm_count", 2**32), ("group_rows", -3), ("b_interleaved", "yes")],
)  # fmt: skip
def test_op_arguments_refuse_what_the_op_cannot_take(fp4, field, value):
    a, sfa = nvfp4_operand(4, 64, seed=1)
    b, sfb = nvfp4_operand(16, 64, seed=2)
    call = fp4._gemm.GemmCall(a, b, sfa, sfb, out=torch.empty(4, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=f"GemmCall.{field}"):
        call._replace(**{field: value}).op_arguments()


def test_capability_calls_cover_every_bias_dtype_the_function_accepts(fp4):
    dtypes = {call.bias.dtype for call in gemm_calls(fp4, "nvfp4_gemm_bias_bf16")}
    assert dtypes == {torch.bfloat16, torch.float16, torch.float32}


def test_capability_calls_take_the_residual_of_the_output_type_only(fp4):
    for name, dtype in (
        ("nvfp4_gemm_bias_residual_bf16", torch.bfloat16),
        ("nvfp4_gemm_bias_residual_fp16", torch.float16),
    ):
        assert {call.residual.dtype for call in gemm_calls(fp4, name)} == {dtype}, name


def test_capability_calls_are_what_each_function_fixes(fp4):
    """The activation, output and schedule of a call come from the function itself, not a table."""
    expected = {
        "nvfp4_gemm_bias_gelu_nvfp4_fp16": ("gelu", "nvfp4_from_fp16", "auto"),
        "nvfp4_gemm_relu2_nvfp4": ("relu2", "nvfp4", "auto"),
        "nvfp4_gemm_geglu_nvfp4_fp16": ("geglu", "nvfp4_from_fp16", "auto"),
        "nvfp4_gemm_streamk_bias_bf16": ("none", "bf16", "streamk"),
        "nvfp4_gemm_m256_bf16": ("none", "bf16", "m256"),
        "nvfp4_gemm_fp16": ("none", "fp16", "auto"),
    }
    for name, kind in expected.items():
        assert {(c.activation, c.out_format, c.schedule) for c in gemm_calls(fp4, name)} == {kind}, name


def test_capability_calls_cover_each_m_tier_the_function_accepts(fp4):
    rows = {name: {call.a.shape[0] for call in gemm_calls(fp4, name)} for name in fp4._capabilities.FLASHRT_GEMMS}
    assert rows["nvfp4_gemm_bf16"] == set(fp4._capabilities.QUERY_M)
    assert rows["fp4_w4a4_gemv_warpsplit_interleaved_bf16"] == {1}
    assert rows["fp4_w4a4_gemm_warpsplit_mrows_bf16"] == {1, 16}
    assert rows["nvfp4_gemm_m256_bf16"] == {512}


def test_capability_calls_of_e0m3_weights_take_both_activation_formats(fp4):
    assert {(c.a_format, c.b_format) for c in gemm_calls(fp4, "e0m3_weight_gemm_fp16")} == {
        ("nvfp4", "e0m3"),
        ("e0m3", "e0m3"),
    }


def test_capability_calls_of_the_halops_gemms_cover_every_mode_with_and_without_bias(fp4):
    for name in fp4._capabilities.HALOPS_GEMMS:
        kinds = {(c.a_format, c.bias is not None) for c in gemm_calls(fp4, name)}
        assert kinds == {(f, bias) for f in ("mxfp8", "mxfp4", "nvfp4") for bias in (False, True)}, name


def fields(call) -> tuple:
    """What a backend's supports() can see of a call: shapes, dtypes, presence and plain fields."""
    return tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for v in call)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("nvfp4_gemm_bias_bf16", {"bias": torch.float32}),
        ("nvfp4_gemm_bias_residual_fp16", {"bias": torch.float16, "residual": True, "out_format": "fp16"}),
        ("nvfp4_gemm_relu2_nvfp4", {"activation": "relu2", "out_format": "nvfp4"}),
        ("nvfp4_gemm_geglu_nvfp4_fp16", {"activation": "geglu", "out_format": "nvfp4_from_fp16"}),
        ("group_masked_gemm", {"grouping": "masked", "alpha": True, "bias": torch.bfloat16}),
        ("group_contiguous_gemm", {"grouping": "contiguous", "alpha": True}),
        ("batch_gemm", {"grouping": "batched", "alpha": True, "bias": torch.bfloat16}),
    ],
)
def test_described_call_is_the_call_the_public_function_makes(fp4, name, kind):
    described = fp4._gemm.described_call("nvfp4", m=256, n=4096, k=4096, groups=8, **kind)
    made = {fields(call) for call in gemm_calls(fp4, name)}
    assert fields(described) in made, name


def test_bf16_activations_are_described_without_scales(fp4, ref):
    """The W4A16 call: A plain bf16 [M, K], no sfa, B NVFP4; the CPU reference computes A @ B^T."""
    m, n, k = 3, 16, 64
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b, sfb = nvfp4_operand(n, k, seed=1)
    out = torch.full((m, n), 7.0, dtype=torch.bfloat16)
    call = fp4._gemm.GemmCall(a, b, None, sfb, "bf16", "nvfp4", out=out)
    assert fp4._gemm.described_call("bf16", "nvfp4", m=m, n=n, k=k).sfa is None
    call.run()
    expected = a.double() @ ref.dequantize(b, sfb, ref.NVFP4).double().T
    assert torch.allclose(out.double(), expected, rtol=2**-7, atol=1e-6), "bf16 x NVFP4"


def test_a_call_without_rows_or_weight_rows_launches_nothing(fp4):
    a, sfa = nvfp4_operand(4, 64, seed=1)
    b, sfb = nvfp4_operand(16, 64, seed=2)
    no_rows = fp4._gemm.GemmCall(a[:0], b, sfa, sfb, out=torch.empty(0, 16, dtype=torch.bfloat16))
    no_weight_rows = fp4._gemm.GemmCall(a, b[:0], sfa, sfb, out=torch.empty(4, 0, dtype=torch.bfloat16))
    with OpRecorder(fp4.ops.name) as recorder:
        no_rows.run()
        no_weight_rows.run()
    assert recorder.called == []


def test_bf16_activations_run_on_the_gpu_as_on_the_cpu(fp4, ref, device):
    """sfa absent through the binding: a kernel where one serves the call, else the reference there."""
    m, n, k = 3, 16, 64
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    b, sfb = nvfp4_operand(n, k, seed=1)
    outs = []
    for where in ("cpu", device):
        out = torch.full((m, n), 7.0, dtype=torch.bfloat16, device=where)
        fp4._gemm.GemmCall(a.to(where), b.to(where), None, sfb.to(where), "bf16", "nvfp4", out=out).run()
        outs.append(out.cpu().double())
    assert torch.allclose(outs[1], outs[0], rtol=2**-7, atol=1e-6), "bf16 x NVFP4 on the GPU"
