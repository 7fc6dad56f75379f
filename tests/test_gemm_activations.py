"""Every activation of the GEMM epilogue (none, GELU, relu2, GeGLU) on NaN, +-Inf, -0 and exactly
representable inputs, against values written out here: NaN stays NaN, -0 keeps its sign where the
math does, GELU(-inf) is NaN (-inf * 0, as torch.nn.functional.gelu in float64), relu2(-inf) is 0
(docs/FORMATS.md, "GEMM result"). On the CPU the reference; on a GPU every backend that serves the
call there (GemmCall.backends; the reference on the GPU where none does), outputs poisoned first.

How the inputs reach the activation exactly: A is all zero, so every product and the accumulator
are +0; alpha_scale = -1 makes alpha * acc = -0, and -0 + bias = bias for every bias value (-0
included), so the activation sees the bias itself, one value per output column."""

from __future__ import annotations

import math

import pytest
import torch
from checks import assert_bitwise_equal, poisoned_like

NAN, INF = math.nan, math.inf
# The activation's input, one per output column: special values, then finite values whose every
# activation is exact in float32 (gelu(8) = 8, gelu(-20) = -0: the erfc underflows).
INPUTS = (NAN, INF, -INF, -0.0, 0.0, 8.0, -20.0, 64.0, -64.0, 16.0, -16.0, 32.0, -32.0, 128.0, -128.0, 256.0)
EXPECTED = {
    "none": INPUTS,
    "gelu": (NAN, INF, NAN, -0.0, 0.0, 8.0, -0.0, 64.0, -0.0, 16.0, -0.0, 32.0, -0.0, 128.0, -0.0, 256.0),
    "relu2": (NAN, INF, 0.0, 0.0, 0.0, 64.0, 0.0, 4096.0, 0.0, 256.0, 0.0, 1024.0, 0.0, 16384.0, 0.0, 65536.0),
}
# GeGLU's (gate, up) pairs and gelu(gate) * up
GEGLU = (
    ((NAN, 1.0), NAN),
    ((INF, 1.0), INF),
    ((-INF, 1.0), NAN),
    ((-0.0, 1.0), -0.0),
    ((-0.0, -1.0), 0.0),
    ((0.0, -1.0), -0.0),
    ((8.0, -0.0), -0.0),
    ((1.0, NAN), NAN),
    ((8.0, INF), INF),
    ((INF, 0.0), NAN),
    ((0.0, INF), NAN),
    ((-20.0, 2.0), -0.0),
    ((8.0, 3.0), 24.0),
)
MARKER = 8.0  # a nonzero neighbour in each NVFP4 block, so that a -0 keeps its sign code
MARKER_RESULT = {"none": 8.0, "gelu": 8.0, "relu2": 64.0, "geglu": 8.0}  # geglu: gelu(8) * 1
M_ROWS = (3, 40)  # the M <= 16 kernels and the engines
K = 64
OPERANDS = (("nvfp4", "nvfp4"), ("nvfp4", "e0m3"))
OUTPUTS = {"bf16": torch.bfloat16, "fp16": torch.float16}
CASES = [
    (a_format, b_format, out_format, activation, m)
    for a_format, b_format in OPERANDS
    for m in M_ROWS
    for out_format, activations in (
        ("bf16", EXPECTED),
        ("fp16", EXPECTED),
        ("nvfp4", EXPECTED),
        ("nvfp4_from_fp16", ["geglu"]),
    )
    for activation in activations
]


def operands(ref, a_format: str, b_format: str, m: int, n: int) -> tuple[torch.Tensor, ...]:
    """A all zero (every product +0), B positive and nonzero, with their flat scale buffers."""
    a, sfa = ref.quantize(torch.zeros(m, K), ref.FORMATS[a_format], swizzle=True)
    b, sfb = ref.quantize(torch.full((n, K), 0.75), ref.FORMATS[b_format], swizzle=True)
    return a, b, sfa.reshape(-1), sfb.reshape(-1)


def in_blocks(values: list[float], marker: float) -> list[float]:
    """One 16-element NVFP4 output block per value: the value, the marker, then zeros."""
    return [x for v in values for x in [v, marker] + [0.0] * 14]


def columns(out_format: str, activation: str) -> tuple[list[float], list[float]]:
    """(the bias, one value per column of y; the hand-written result of each output column)."""
    if activation == "geglu":  # y columns 2j (gate) and 2j + 1 (up) make output column j
        bias = [x for (gate, up), _ in GEGLU for x in [gate, up, MARKER, 1.0] + [0.0] * 28]
        return bias, in_blocks([result for _, result in GEGLU], MARKER_RESULT["geglu"])
    if out_format.startswith("nvfp4"):
        return in_blocks(list(INPUTS), MARKER), in_blocks(list(EXPECTED[activation]), MARKER_RESULT[activation])
    return list(INPUTS), list(EXPECTED[activation])


def build_case(fp4, ref, a_format, b_format, out_format, activation, m, device):
    """(the GemmCall on `device`, outputs poisoned; its expected outputs on the CPU). Every row of the
    result is the same: the activation of the bias row."""
    bias, results = columns(out_format, activation)
    a, b, sfa, sfb = (t.to(device) for t in operands(ref, a_format, b_format, m, len(bias)))
    rows = torch.tensor(results, dtype=torch.float64).expand(m, -1)
    if out_format.startswith("nvfp4"):
        quantized = rows.half().float() if out_format == "nvfp4_from_fp16" else rows.float()
        packed, scales = ref.quantize(quantized, ref.NVFP4, swizzle=True)
        expected = (packed, scales.reshape(-1))
        out = poisoned_like(torch.empty(packed.shape, dtype=torch.uint8, device=device))
        out_scales = poisoned_like(torch.empty(scales.numel(), dtype=torch.uint8, device=device))
        bias_dtype = torch.bfloat16
    else:
        bias_dtype = OUTPUTS[out_format]
        expected = (rows.to(bias_dtype), None)
        out, out_scales = poisoned_like(torch.empty(rows.shape, dtype=bias_dtype, device=device)), None
    call = fp4._gemm.GemmCall(
        a, b, sfa, sfb, a_format, b_format, alpha_scale=-1.0,
        bias=torch.tensor(bias, dtype=torch.float64).to(bias_dtype).to(device), activation=activation,
        out=out, out_scales=out_scales, out_format=out_format,
    )  # fmt: skip
    return call, expected


# cuBLASLt's accumulator starts at +0: an output whose every product is -0 is +0 there (docs/API.md,
# the composition backend). Every other bit must match.
ZERO_SIGN_FROM_POSITIVE_START = {"composition"}


def assert_outputs(call, expected: tuple, what: str, backend: str | None = None) -> None:
    out = call.out.cpu()
    if backend in ZERO_SIGN_FROM_POSITIVE_START and out.dtype in (torch.bfloat16, torch.float16):
        negative_zero = (expected[0] == 0) & torch.signbit(expected[0])
        out = torch.where(negative_zero & (out == 0), expected[0], out)
    assert_bitwise_equal(out, expected[0], what)
    if expected[1] is not None:
        assert_bitwise_equal(call.out_scales.cpu(), expected[1], f"{what} scales")


def describe(a_format, b_format, out_format, activation, m) -> str:
    return f"{a_format} x {b_format} -> {out_format}, {activation}, {m=}"


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_reference_activations_of_special_values_are_the_written_math(fp4, ref, case):
    call, expected = build_case(fp4, ref, *case, "cpu")
    call.run()
    assert_outputs(call, expected, describe(*case))


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_every_backend_computes_the_activations_of_special_values_exactly(fp4, ref, device, case):
    major, minor = torch.cuda.get_device_capability()
    call, expected = build_case(fp4, ref, *case, device)
    backends = call.backends(10 * major + minor)
    if (major, minor) == (9, 0):
        assert backends, f"{describe(*case)}: no kernel of the H200's serves it"
    for backend in backends or [None]:
        call, _ = build_case(fp4, ref, *case, device)  # fresh poisoned outputs
        if backend is None:
            call.run()  # the reference, with PyTorch ops on the GPU
        else:
            call.run_on(backend)
        assert_outputs(call, expected, f"{backend or 'reference'}: {describe(*case)}", backend)
