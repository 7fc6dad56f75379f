"""The composition backend (csrc/gemm/composed/composition.cu): a dense GEMM as the exact dequantization of
both operands into 16-bit scratch plus one cuBLASLt matmul (float32 accumulation, the epilogue in
float32, one rounding to the output).

Host-side (no GPU needed): where dispatch takes it (GemmCall.backends), on sm_90 dense problems from
the measured row counts of composition.cu (768 for MXFP8, MXFP4 and NVFP4, 1024 for the other
pairs), and on every arch bf16 activations that no arch kernel reads, above the skinny tier.
On the H200 it runs by name (GemmCall.run_on("composition")): every operand format, bias, residual,
fp16 output, alpha as a device tensor and as alpha_scale, odd N and K tails, NaN scales, outputs
poisoned first, within the docs/FORMATS.md bound of float64 math on the exactly dequantized
operands; bitwise equal run to run and under CUDA-graph replay; and through the public functions
where dispatch picks it (NVFP4 outputs included, staged over its float32 result)."""

from __future__ import annotations

import pytest
import torch
from cases import dispatched
from checks import assert_bitwise_equal, assert_nvfp4_output_within_bound, assert_within_bound, poisoned_like
from conftest import requires_arch

# (A, B) formats the dequantize op decodes, and bf16 activations with 4-bit weights (W4A16)
PAIRS = [
    ("mxfp8", "mxfp8"),
    ("mxfp4", "mxfp4"),
    ("nvfp4", "nvfp4"),
    ("nvfp4", "e0m3"),
    ("e0m3", "e0m3"),
    ("bf16", "nvfp4"),
    ("bf16", "mxfp4"),
]
BLACKWELL = [100, 110, 120]
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ---- where dispatch takes it (host-side: runs without a GPU) -------------------------------------


# The fewest rows from which the H200 took the composition over the engine (composition.cu)
HOPPER_MIN_ROWS = {
    ("mxfp8", "mxfp8"): 768,
    ("mxfp4", "mxfp4"): 768,
    ("nvfp4", "nvfp4"): 768,
    ("nvfp4", "e0m3"): 1024,
    ("e0m3", "e0m3"): 1024,
    ("bf16", "nvfp4"): 1024,
    ("bf16", "mxfp4"): 1024,
}


@pytest.mark.kernels_ci
@pytest.mark.parametrize("pair", PAIRS, ids="x".join)
def test_hopper_dispatches_dense_gemms_to_the_composition_from_the_measured_rows(fp4, pair):
    rows = HOPPER_MIN_ROWS[pair]
    for m in (rows, rows + 1, 4096):
        assert dispatched(fp4, 90, *pair, m=m) == "composition", f"{m=}"


@pytest.mark.kernels_ci
@pytest.mark.parametrize("pair", PAIRS, ids="x".join)
def test_hopper_keeps_dense_gemms_below_the_measured_rows_on_its_engine(fp4, pair):
    # from 65 rows: up to 64 the skinny tier may take them (test_gemm_skinny); W4A16 from 257: up to 256
    # the swapped engine may (test_w4a16)
    for m in (257, 300, HOPPER_MIN_ROWS[pair] - 1) if pair[0] == "bf16" else (65, 256, HOPPER_MIN_ROWS[pair] - 1):
        assert dispatched(fp4, 90, *pair, m=m) == "sm90_engine", f"{m=}"


def test_hopper_keeps_the_engines_own_bf16_gemm(fp4):
    assert dispatched(fp4, 90, "bf16", "bf16", m=4096) == "sm90_engine"


@pytest.mark.parametrize("b_format", ["mxfp8", "e0m3"])
def test_hopper_serves_bf16_activations_its_engine_does_not_read_above_16_rows(fp4, b_format):
    assert dispatched(fp4, 90, "bf16", b_format, m=17) == "composition"
    assert dispatched(fp4, 90, "bf16", b_format, m=16) != "composition"


def test_k_tails_the_engine_cannot_load_are_served_from_the_measured_rows(fp4):
    # 24-byte NVFP4 rows: no TMA for the engine; the dequantize kernel reads them
    assert dispatched(fp4, 90, "nvfp4", "nvfp4", m=1024, k=48) == "composition"
    assert dispatched(fp4, 90, "nvfp4", "nvfp4", m=64, k=48) == ""


@pytest.mark.parametrize("activation", ["gelu", "relu2"])
def test_activations_are_left_to_the_engine(fp4, activation):
    """cuBLASLt's GELU is the tanh form; the contract's is the erf form."""
    assert dispatched(fp4, 90, "nvfp4", "nvfp4", m=4096, activation=activation) == "sm90_engine"


@pytest.mark.parametrize("grouping", ["batched", "contiguous", "masked"])
def test_grouped_gemms_are_not_served(fp4, grouping):
    assert dispatched(fp4, 90, "nvfp4", "nvfp4", m=1024, grouping=grouping) != "composition"


def test_fp16_outputs_are_served_where_both_operands_are_exact_in_fp16(fp4):
    """NVFP4 and E0M3 values (UE4M3 scales) are exact in fp16; MX values (UE8M0 scales) are not."""
    assert dispatched(fp4, 90, "nvfp4", "nvfp4", m=4096, out_format="fp16") == "composition"
    assert dispatched(fp4, 90, "nvfp4", "e0m3", m=4096, out_format="fp16") == "composition"
    assert dispatched(fp4, 90, "mxfp8", "mxfp8", m=4096, out_format="fp16") == "sm90_engine"
    assert dispatched(fp4, 90, "bf16", "nvfp4", m=4096, out_format="fp16") == "sm90_engine"


@pytest.mark.parametrize("out_format", ["nvfp4", "nvfp4_from_fp16"])
def test_nvfp4_outputs_stay_staged(fp4, out_format):
    assert dispatched(fp4, 90, "nvfp4", "nvfp4", m=4096, out_format=out_format) == "staged"


@pytest.mark.parametrize("cc", BLACKWELL)
@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4"])
def test_blackwell_serves_bf16_activations_above_the_skinny_tier(fp4, cc, b_format):
    assert dispatched(fp4, cc, "bf16", b_format, m=17) == "composition"
    assert dispatched(fp4, cc, "bf16", b_format, m=4096) == "composition"
    assert dispatched(fp4, cc, "bf16", b_format, m=16) != "composition"


@pytest.mark.parametrize("cc", BLACKWELL)
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_blackwell_keeps_its_block_scaled_kernels(fp4, cc, fmt):
    assert dispatched(fp4, cc, fmt, fmt, m=4096) == f"sm{cc}_cutlass"


# ---- results on the H200 -------------------------------------------------------------------------


def operand(ref, fmt: str, rows: int, k: int, seed: int, scale: float = 1.0, spread: int = 4):
    """(values, scales, float64 values) of a random [rows, K] operand, rows scaled by 2^-spread ..
    2^spread (so the block scales vary): block-scaled from the reference quantizer, or plain bf16
    without scales."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, generator=g, device="cuda") * scale
    x = x * torch.exp2(torch.randint(-spread, spread + 1, (rows, 1), generator=g, device="cuda").float())
    if fmt == "bf16":
        values = x.to(torch.bfloat16)
        return values, torch.empty(0, dtype=torch.uint8, device="cuda"), values.double()
    values, scales = ref.quantize(x, ref.FORMATS[fmt], swizzle=True)
    return values, scales, ref.dequantize(values, scales, ref.FORMATS[fmt]).double()


def composition(fp4, a, b, sfa, sfb, pair, out, alpha=None, alpha_scale=1.0, bias=None, residual=None) -> None:
    """The `gemm` op on the composition backend by name (GemmCall.run_on); a bf16 A has no sfa."""
    out_format = "fp16" if out.dtype == torch.float16 else "bf16"
    fp4._gemm.GemmCall(
        a,
        b,
        None if pair[0] == "bf16" else sfa,
        sfb,
        pair[0],
        pair[1],
        alpha=alpha,
        alpha_scale=alpha_scale,
        bias=bias,
        residual=residual,
        out=out,
        out_format=out_format,
    ).run_on("composition")


def block(pair) -> int:
    """K granularity of the pair: the larger block size of its block-scaled operands."""
    return max({"mxfp8": 32, "mxfp4": 32, "nvfp4": 16, "e0m3": 16, "bf16": 1}[f] for f in pair)


def shape_id(shape: tuple[int, int, int]) -> str:
    return "m{}_n{}_k{}".format(*shape)


# (M, N, K): M from 1024, N odd or not a multiple of the tiles, K tails that are not whole 64-wide tiles
SHAPES = [(1024, 256, 512), (1031, 257, 96), (2500, 130, 352), (4100, 77, 1056)]


@requires_arch(90)
@pytest.mark.parametrize("pair", PAIRS, ids="x".join)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_format_is_within_the_bound(fp4, ref, pair, shape):
    m, n, k = shape
    k = k // block(pair) * block(pair)
    a, sfa, a64 = operand(ref, pair[0], m, k, seed=m)
    b, sfb, b64 = operand(ref, pair[1], n, k, seed=n, scale=0.05)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    composition(fp4, a, b, sfa, sfb, pair, out, alpha_scale=0.5)
    assert_within_bound(out, 0.5 * (a64 @ b64.T), 0.5 * a64, b64, f"{pair} {m=} {n=} {k=}")


@requires_arch(90)
@pytest.mark.parametrize("pair", [("nvfp4", "nvfp4"), ("nvfp4", "e0m3"), ("e0m3", "e0m3")], ids="x".join)
def test_fp16_outputs_of_ue4m3_scaled_operands_are_within_the_bound(fp4, ref, pair):
    m, n, k = 1031, 257, 96
    a, sfa, a64 = operand(ref, pair[0], m, k, seed=17)
    b, sfb, b64 = operand(ref, pair[1], n, k, seed=18, scale=0.05)
    out = poisoned_like(torch.empty(m, n, dtype=torch.float16, device="cuda"))
    composition(fp4, a, b, sfa, sfb, pair, out, alpha_scale=0.5)
    assert_within_bound(out, 0.5 * (a64 @ b64.T), 0.5 * a64, b64, f"fp16 {pair} {m=} {n=} {k=}")


@requires_arch(90)
@pytest.mark.parametrize("b_format", ["mxfp8", "e0m3"])
@pytest.mark.parametrize("shape", [(17, 96, 64), (300, 257, 96), (1031, 130, 352)], ids=shape_id)
def test_bf16_activations_the_engine_does_not_read_are_within_the_bound(fp4, ref, b_format, shape):
    """Dispatch takes these from 17 rows on: the one region the H200 runs below 1024 rows."""
    m, n, k = shape
    pair = ("bf16", b_format)
    assert dispatched(fp4, 90, *pair, m=m, n=n, k=k) == "composition", f"{pair} {m=} {n=} {k=}"
    a, sfa, a64 = operand(ref, pair[0], m, k, seed=19)
    b, sfb, b64 = operand(ref, pair[1], n, k, seed=20, scale=0.05)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    composition(fp4, a, b, sfa, sfb, pair, out, alpha=torch.tensor([2.0], device="cuda"))
    assert_within_bound(out, 2.0 * (a64 @ b64.T), 2.0 * a64, b64, f"{pair} {m=} {n=} {k=}")


@requires_arch(90)
def test_nvfp4_rows_of_24_bytes_are_within_the_bound(fp4, ref):
    m, n, k = 1100, 63, 48
    a, sfa, a64 = operand(ref, "nvfp4", m, k, seed=1)
    b, sfb, b64 = operand(ref, "nvfp4", n, k, seed=2)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    composition(fp4, a, b, sfa, sfb, ("nvfp4", "nvfp4"), out)
    assert_within_bound(out, a64 @ b64.T, a64, b64, f"{m=} {n=} {k=}")


@requires_arch(90)
@pytest.mark.parametrize("out_format", ["bf16", "fp16"])
@pytest.mark.parametrize("epilogue", ["bias", "residual", "bias_residual"])
def test_bias_and_residual_are_added_before_the_one_rounding(fp4, ref, out_format, epilogue):
    m, n, k = 1030, 264, 256
    pair = ("nvfp4", "nvfp4")
    dtype = OUT_DTYPES[out_format]
    a, sfa, a64 = operand(ref, pair[0], m, k, seed=3)
    b, sfb, b64 = operand(ref, pair[1], n, k, seed=4, scale=0.05)
    g = torch.Generator(device="cuda").manual_seed(5)
    bias = torch.randn(n, generator=g, device="cuda").to(dtype) if "bias" in epilogue else None
    residual = torch.randn(m, n, generator=g, device="cuda").to(dtype) if "residual" in epilogue else None
    alpha = torch.tensor([0.75], device="cuda")
    out = poisoned_like(torch.empty(m, n, dtype=dtype, device="cuda"))
    composition(fp4, a, b, sfa, sfb, pair, out, alpha=alpha, alpha_scale=2.0, bias=bias, residual=residual)
    expected = 1.5 * (a64 @ b64.T)
    for term in (bias, residual):
        expected = expected if term is None else expected + term.double()
    assert_within_bound(out, expected, 1.5 * a64, b64, f"{epilogue} {out_format} {m=} {n=} {k=}")


@requires_arch(90)
def test_alpha_tensor_and_alpha_scale_multiply(fp4, ref):
    m, n, k = 1024, 128, 128
    pair = ("mxfp8", "mxfp8")
    a, sfa, a64 = operand(ref, pair[0], m, k, seed=6)
    b, sfb, b64 = operand(ref, pair[1], n, k, seed=7)
    for alpha, alpha_scale, factor in [(None, 0.25, 0.25), (torch.tensor([-3.0], device="cuda"), 1.0, -3.0),
                                       (torch.tensor([0.5], device="cuda"), -0.125, -0.0625)]:  # fmt: skip
        out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        composition(fp4, a, b, sfa, sfb, pair, out, alpha=alpha, alpha_scale=alpha_scale)
        assert_within_bound(out, factor * (a64 @ b64.T), abs(factor) * a64, b64, f"alpha {factor} {m=} {n=} {k=}")


@requires_arch(90)
@pytest.mark.parametrize("pair", PAIRS[:5], ids="x".join)
def test_nan_scales_give_nan_exactly_where_the_reference_has_it(fp4, ref, pair):
    m, n, k = 1024, 200, 256
    a, sfa, _ = operand(ref, pair[0], m, k, seed=8)
    b, sfb, _ = operand(ref, pair[1], n, k, seed=9)
    fa, fb = ref.FORMATS[pair[0]], ref.FORMATS[pair[1]]
    sfa.reshape(-1)[ref.sf_offset(70, 1, ref._ceil_div(k // fa.group, 4))] = fa.scale_nan
    sfb.reshape(-1)[ref.sf_offset(5, 0, ref._ceil_div(k // fb.group, 4))] = fb.scale_nan
    a64, b64 = ref.dequantize(a, sfa, fa).double(), ref.dequantize(b, sfb, fb).double()
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    composition(fp4, a, b, sfa, sfb, pair, out)
    expected = a64 @ b64.T
    assert expected[70].isnan().all() and expected[:, 5].isnan().all()
    assert torch.equal(out.isnan(), expected.isnan()), f"NaN positions {pair}"
    rows, cols = torch.arange(m, device="cuda") != 70, torch.arange(n, device="cuda") != 5
    finite = expected[rows][:, cols]
    assert_within_bound(out[rows][:, cols], finite, a64[rows], b64[cols], f"NaN scales {pair} {m=} {n=} {k=}")


@requires_arch(90)
def test_bias_of_another_dtype_than_the_output_is_refused(fp4, ref):
    """cuBLASLt reads the bias in the output's type: a float32 bias would be rounded first."""
    a, sfa, _ = operand(ref, "nvfp4", 1024, 64, seed=10)
    out = torch.empty(1024, 1024, dtype=torch.bfloat16, device="cuda")
    bias = torch.zeros(1024, dtype=torch.float32, device="cuda")
    with pytest.raises(RuntimeError, match="does not serve this problem"):
        composition(fp4, a, a, sfa, sfa, ("nvfp4", "nvfp4"), out, bias=bias)


@requires_arch(90)
def test_runs_are_bitwise_equal_and_replay_in_a_cuda_graph(fp4, ref):
    m, n, k = 2048, 768, 1024
    pair = ("nvfp4", "nvfp4")
    a, sfa, _ = operand(ref, pair[0], m, k, seed=11)
    b, sfb, _ = operand(ref, pair[1], n, k, seed=12)
    alpha = torch.tensor([0.5], device="cuda")
    first, second = (torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    composition(fp4, a, b, sfa, sfb, pair, first, alpha=alpha)
    composition(fp4, a, b, sfa, sfb, pair, second, alpha=alpha)
    assert_bitwise_equal(second, first, "second run")
    out = poisoned_like(first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        composition(fp4, a, b, sfa, sfb, pair, out, alpha=alpha)
    out.view(torch.uint8).fill_(0xA5)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, first, "graph replay")


@requires_arch(90)
@pytest.mark.parametrize("mode", ["w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4"])
def test_dense_gemm_from_1024_rows_runs_the_composition_within_the_bound(fp4, ref, mode):
    m, n, k = 1500, 384, 512
    fmt = {"w8a8-mxfp8": "mxfp8", "w4a4-mxfp4": "mxfp4", "w4a4-nvfp4": "nvfp4"}[mode]
    assert dispatched(fp4, 90, fmt, fmt, m=m, n=n, k=k) == "composition", f"{fmt} {m=} {n=} {k=}"
    a, sfa, a64 = operand(ref, fmt, m, k, seed=13)
    b, sfb, b64 = operand(ref, fmt, n, k, seed=14, scale=0.05)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    fp4.dense_gemm(a, b, sfa, sfb, out, bias=bias, alpha=torch.tensor([0.75], device="cuda"), mode=mode)
    assert_within_bound(out, 0.75 * (a64 @ b64.T) + bias.double(), 0.75 * a64, b64, f"{mode} {m=} {n=} {k=}")


@requires_arch(90)
def test_nvfp4_output_from_1024_rows_quantizes_the_composition_float32_result(fp4, ref):
    m, n, k = 1024, 256, 512
    # no spread of row magnitudes: every output block stays above NVFP4's smallest nonzero scale
    a, sfa, a64 = operand(ref, "nvfp4", m, k, seed=15, spread=0)
    b, sfb, b64 = operand(ref, "nvfp4", n, k, seed=16, spread=0)
    packed = poisoned_like(torch.empty(m, n // 2, dtype=torch.uint8, device="cuda"))
    scales = poisoned_like(torch.empty(fp4.sfa_size_bytes(m, n), dtype=torch.uint8, device="cuda"))
    fp4.nvfp4_gemm_nvfp4(a, b, sfa, sfb, alpha=0.25, out_packed=packed, out_sfa=scales)
    assert_nvfp4_output_within_bound(ref, packed, scales, 0.25 * (a64 @ b64.T).cpu(), f"nvfp4 out {m=} {n=} {k=}")
