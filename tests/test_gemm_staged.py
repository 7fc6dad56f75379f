"""The staged backend (csrc/gemm/composed/staged.cu): NVFP4 outputs and GeGLU through a float32/fp16 stage
written by the backend that serves the float-output problem (the Hopper engine, or the skinny tier
where the register-streaming kernel does not encode the output itself: test_gemm_stream_nvfp4.py),
then finished and encoded by one kernel with the NVFP4 codec.
On the GPU each public function's output, written into poisoned buffers, is held to the
docs/FORMATS.md bound plus one code step of float64 math on the exactly dequantized operands; the
scale bytes of the padding rows are zero, and two runs are bitwise equal.

Which backend serves a kind is asked from the build (GemmCall.backends), for sm_90."""

from __future__ import annotations

import pytest
import torch
from api_cases import nvfp4_operand
from cases import STAGED_KINDS, dispatched
from checks import assert_bitwise_equal, assert_nvfp4_output_within_bound, gelu64, poisoned_like
from conftest import requires_arch

# ---- which problems it serves (host-side: runs without a GPU) ------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("kind", STAGED_KINDS)
def test_staged_serves_nvfp4_outputs_through_the_hopper_engine(fp4, kind):
    assert dispatched(fp4, 90, m=256, **kind) == "staged"


@pytest.mark.kernels_ci
@pytest.mark.parametrize("kind", [{"grouping": "masked"}, {"grouping": "contiguous"}])
def test_staged_leaves_groups_that_own_part_of_the_rows_to_the_reference(fp4, kind):
    """The quantizer encodes the whole matrix: it would write rows a group does not own."""
    assert dispatched(fp4, 90, m=256, out_format="nvfp4", **kind) == ""


@pytest.mark.kernels_ci
def test_staged_needs_whole_16_column_blocks(fp4):
    assert dispatched(fp4, 90, m=256, n=4104, out_format="nvfp4") == ""  # N_out % 16 == 8
    geglu = {"activation": "geglu", "out_format": "nvfp4_from_fp16"}
    assert dispatched(fp4, 90, m=256, n=4104, **geglu) == ""  # N_out = 2052


@pytest.mark.kernels_ci
def test_staged_never_serves_16_bit_outputs(fp4):
    assert dispatched(fp4, 90, m=256, out_format="bf16") == "sm90_engine"


# ---- results on the H200 ------------------------------------------------------------------------

# (M, N, K); the register-streaming kernel encodes M = 8 itself (test_gemm_stream_nvfp4.py).
SHAPES = [(200, 256, 512), (8, 128, 256), (130, 512, 64)]


def gemm64(fp4, a, b, sfa, sfb) -> torch.Tensor:
    ref = fp4.reference
    a_dq = ref.dequantize(a.cpu(), sfa.cpu(), ref.NVFP4).double()
    b_dq = ref.dequantize(b.cpu(), sfb.cpu(), ref.NVFP4).double()
    return a_dq @ b_dq.T


def run_into_poison(fp4, function, m: int, n_out: int, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    packed = poisoned_like(torch.empty(m, n_out // 2, dtype=torch.uint8, device="cuda"))
    scales = poisoned_like(torch.empty(fp4.sfa_size_bytes(m, n_out), dtype=torch.uint8, device="cuda"))
    return function(*args, out_packed=packed, out_sfa=scales, **kwargs)


def assert_padding_scales_zero(fp4, scales: torch.Tensor, m: int, n_out: int, what: str) -> None:
    ref = fp4.reference
    padded_rows = -(-m // 128) * 128
    plain = ref.unswizzle_scales(scales.cpu(), padded_rows, n_out // 16)
    assert (plain[m:] == 0).all(), f"{what}: a padding row's scale byte is not zero"


def in_range_alpha(y: torch.Tensor) -> float:
    """A power of two that keeps alpha * |y| <= 40, so squared outputs stay below NVFP4's largest
    value (6 * 448 with no global scale), where the quantizer saturates."""
    return 2.0 ** min(0, int(torch.floor(torch.log2(40.0 / y.abs().max()))))


def operands(m: int, n: int, k: int, seed: int) -> list[torch.Tensor]:
    a, sfa = nvfp4_operand(m, k, seed)
    b, sfb = nvfp4_operand(n, k, seed + 1)
    return [t.cuda() for t in (a, b, sfa, sfb)]


@requires_arch(90)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "m{}_n{}_k{}".format(*s))
def test_nvfp4_output_quantizes_the_float32_result(fp4, shape):
    m, n, k = shape
    a, b, sfa, sfb = operands(m, n, k, seed=m + n)
    packed, scales = run_into_poison(fp4, fp4.nvfp4_gemm_nvfp4, m, n, a, b, sfa, sfb, alpha=0.25)
    assert_nvfp4_output_within_bound(fp4.reference, packed, scales, 0.25 * gemm64(fp4, a, b, sfa, sfb), "nvfp4")
    assert_padding_scales_zero(fp4, scales, m, n, "nvfp4")


@requires_arch(90)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "m{}_n{}_k{}".format(*s))
def test_relu2_nvfp4_output_squares_the_positive_part(fp4, shape):
    m, n, k = shape
    a, b, sfa, sfb = operands(m, n, k, seed=m + n + 1)
    y = gemm64(fp4, a, b, sfa, sfb)
    alpha = in_range_alpha(y)
    packed, scales = run_into_poison(fp4, fp4.nvfp4_gemm_relu2_nvfp4, m, n, a, b, sfa, sfb, alpha=alpha)
    expected = torch.relu(alpha * y) ** 2
    assert_nvfp4_output_within_bound(fp4.reference, packed, scales, expected, "relu2")


@requires_arch(90)
@pytest.mark.parametrize("fp16", [False, True], ids=["float32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "m{}_n{}_k{}".format(*s))
def test_bias_gelu_nvfp4_output_applies_bias_then_gelu(fp4, shape, fp16):
    m, n, k = shape
    a, b, sfa, sfb = operands(m, n, k, seed=m + n + 2)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    function = fp4.nvfp4_gemm_bias_gelu_nvfp4_fp16 if fp16 else fp4.nvfp4_gemm_bias_gelu_nvfp4
    packed, scales = run_into_poison(fp4, function, m, n, a, b, sfa, sfb, bias.cuda())
    expected = gelu64(gemm64(fp4, a, b, sfa, sfb) + bias.double())
    if fp16:
        expected = expected.half().double()
    assert_nvfp4_output_within_bound(fp4.reference, packed, scales, expected, "bias+gelu")


@requires_arch(90)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "m{}_n{}_k{}".format(*s))
def test_geglu_nvfp4_output_pairs_gate_and_up_rows(fp4, shape):
    m, n, k = shape
    a, b, sfa, sfb = operands(m, 2 * n, k, seed=m + n + 3)
    y = gemm64(fp4, a, b, sfa, sfb)
    alpha = in_range_alpha(y)
    packed, scales = run_into_poison(fp4, fp4.nvfp4_gemm_geglu_nvfp4_fp16, m, n, a, b, sfa, sfb, alpha=alpha)
    y = alpha * y
    expected = (gelu64(y[:, 0::2]) * y[:, 1::2]).half().double()
    assert_nvfp4_output_within_bound(fp4.reference, packed, scales, expected, "geglu")
    assert_padding_scales_zero(fp4, scales, m, n, "geglu")


@requires_arch(90)
def test_staged_outputs_are_bitwise_equal_run_to_run(fp4):
    a, b, sfa, sfb = operands(200, 512, 256, seed=5)
    first = run_into_poison(fp4, fp4.nvfp4_gemm_geglu_nvfp4_fp16, 200, 256, a, b, sfa, sfb)
    second = run_into_poison(fp4, fp4.nvfp4_gemm_geglu_nvfp4_fp16, 200, 256, a, b, sfa, sfb)
    for got, again, what in zip(first, second, ("packed", "scales"), strict=True):
        assert_bitwise_equal(got, again, f"geglu {what}")
