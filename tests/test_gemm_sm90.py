"""The Hopper engine (csrc/gemm/sm90) through the public functions: within the docs/FORMATS.md bound
of float64 math on the exactly dequantized operands, for every operand format, epilogue, output
type and tile width; K tails; M and N not multiples of the tile; the spec's qualification shapes;
NaN scales; outputs poisoned first; bitwise equal across runs and under CUDA graph replay.

Which backend serves a problem is asked from the build (GemmCall.backends), so these tests also say
when a problem falls back to the reference."""

from __future__ import annotations

import pytest
import torch
from cases import dispatched
from checks import POISON_BYTE, assert_bitwise_equal, assert_within_bound, poisoned_like
from conftest import requires_arch

MODES = {"w8a8-mxfp8": "mxfp8", "w4a4-mxfp4": "mxfp4", "w4a4-nvfp4": "nvfp4"}


def engine_gemm(fp4, a, b, sfa, sfb, a_format: str, b_format: str, out, alpha_scale=1.0, alpha=None, **fields) -> None:
    """The `gemm` op on the engine by name (GemmCall.run_on), alpha and any other GemmCall `fields`
    (epilogue, knobs): from a few hundred rows on, dispatch gives dense problems to the composition
    backend instead (test_gemm_composition.py)."""
    out_format = "fp16" if out.dtype == torch.float16 else "bf16"
    fp4._gemm.GemmCall(
        a, b, sfa, sfb, a_format, b_format, alpha=alpha, alpha_scale=alpha_scale, out=out, out_format=out_format,
        **fields,
    ).run_on("sm90_engine")  # fmt: skip


def no_scales() -> torch.Tensor:
    """The sfb of a bf16 B: none (a bf16 A has sfa None)."""
    return torch.empty(0, dtype=torch.uint8, device="cuda")


# ---- which problems the engine serves (host-side predicate: runs without a GPU) ------------------


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_engine_serves_dense_gemms_of_every_mode(fp4, fmt):
    assert dispatched(fp4, 90, fmt, fmt, m=256) == "sm90_engine"


@pytest.mark.parametrize("a_format", ["nvfp4", "e0m3"])
def test_engine_serves_e0m3_weights(fp4, a_format):
    assert dispatched(fp4, 90, a_format, "e0m3", m=256, out_format="fp16") == "sm90_engine"


@pytest.mark.parametrize("activation", ["none", "gelu", "relu2"])
def test_engine_serves_activations_with_16_bit_outputs(fp4, activation):
    assert dispatched(fp4, 90, m=256, activation=activation, out_format="fp16") == "sm90_engine"


@pytest.mark.parametrize("kind", [{"out_format": "nvfp4"}, {"activation": "geglu"}])
def test_engine_leaves_quantized_outputs_and_geglu_to_other_backends(fp4, kind):
    assert dispatched(fp4, 90, m=256, **kind) != "sm90_engine"


def test_engine_needs_16_byte_rows_for_tma(fp4):
    assert dispatched(fp4, 90, m=256, k=48) != "sm90_engine"  # 24-byte NVFP4 rows
    assert dispatched(fp4, 90, m=256, k=32) == "sm90_engine"


# ---- results on the GPU ------------------------------------------------------------------------


def random_bf16(rows: int, cols: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(rows, cols, generator=g, device="cuda") * scale).to(torch.bfloat16)


def halops_operands(fp4, ref, mode: str, m: int, n: int, k: int, seed: int = 0):
    a, sfa = fp4.group_wise_quant(random_bf16(m, k, seed), mode)
    b, sfb = fp4.group_wise_quant(random_bf16(n, k, seed + 1, scale=0.05), mode)
    fmt = ref.FORMATS[MODES[mode]]
    return (a, b, sfa, sfb), ref.dequantize(a, sfa, fmt).double(), ref.dequantize(b, sfb, fmt).double()


def nvfp4_operands(fp4, ref, m: int, n: int, k: int, seed: int = 0):
    a, sfa = fp4.quantize_fp4_sfa_bf16(random_bf16(m, k, seed))
    b, sfb = fp4.quantize_fp4_sfa_bf16(random_bf16(n, k, seed + 1, scale=0.05))
    return (a, b, sfa, sfb), ref.dequantize(a, sfa, ref.NVFP4).double(), ref.dequantize(b, sfb, ref.NVFP4).double()


# (33, 4104, 2048): a 64-row tile's row tail and an N tail, wide enough for the engine (at 17..64
# rows the skinny tier takes narrow weights, test_gemm_skinny.py)
SHAPES = [(128, 128, 64), (257, 200, 320), (383, 384, 1024), (300, 520, 96), (33, 4104, 2048)]


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_dense_gemm_is_within_the_bound(fp4, ref, mode, shape):
    m, n, k = shape
    if MODES[mode] == "nvfp4" and k % 32:
        pytest.skip("NVFP4 rows of K % 32 != 0 are not 16-byte multiples (the reference serves them)")
    (a, b, sfa, sfb), a_dq, b_dq = halops_operands(fp4, ref, mode, m, n, k)
    assert dispatched(fp4, 90, MODES[mode], MODES[mode], m=m, n=n, k=k) == "sm90_engine", f"{mode} {m=} {n=} {k=}"
    bias = random_bf16(1, n, 9).reshape(n)
    alpha = torch.tensor([0.75], device="cuda")
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    fp4.dense_gemm(a, b, sfa, sfb, out, bias=bias, alpha=alpha, mode=mode)
    expected = 0.75 * (a_dq @ b_dq.T) + bias.double()
    assert_within_bound(out, expected, a_dq * 0.75, b_dq, f"dense {mode} {shape}")


@requires_arch(90)
@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("n", [136, 200, 1000])
def test_both_tile_widths_are_within_the_bound(fp4, ref, variant, n):
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, 300, n, 512)
    out = fp4.nvfp4_gemm_variant_bf16(
        a,
        b,
        sfa,
        sfb,
        alpha=0.5,
        out=poisoned_like(torch.empty(300, n, dtype=torch.bfloat16, device="cuda")),
        variant=variant,
    )  # noqa: E501
    assert_within_bound(out, 0.5 * (a_dq @ b_dq.T), a_dq * 0.5, b_dq, f"variant {variant} n={n}")


@requires_arch(90)
@pytest.mark.parametrize("n", [63, 65, 130])
def test_odd_and_unaligned_widths_are_written_exactly_to_the_edge(fp4, ref, n):
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, 150, n, 256)
    out = poisoned_like(torch.empty(150, n, dtype=torch.float16, device="cuda"))
    fp4.nvfp4_gemm_fp16(a, b, sfa, sfb, out=out)
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"fp16 n={n}")


@requires_arch(90)
@pytest.mark.parametrize("m", [64, 300])  # the 64- and the 128-row tile
def test_output_aligned_to_pairs_only_is_written_exactly(fp4, ref, m):
    """The epilogue writes four outputs per store only where the output allows it; an output view two
    elements into its storage (4-byte, not 8-byte aligned) takes the paired stores."""
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, m, 512, 256)
    storage = poisoned_like(torch.empty(m * 512 + 2, dtype=torch.bfloat16, device="cuda"))
    out = storage[2:].view(m, 512)
    assert out.data_ptr() % 8 == 4
    engine_gemm(fp4, a, b, sfa, sfb, "nvfp4", "nvfp4", out)
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"pair-aligned output m={m}")
    assert (storage[:2].view(torch.uint8) == POISON_BYTE).all(), "the elements before the output view were written"


@requires_arch(90)
def test_bias_residual_fp16_epilogue_is_within_the_bound(fp4, ref):
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, 200, 256, 512)
    bias = random_bf16(1, 256, 5).reshape(256)
    residual = random_bf16(200, 256, 6).half()
    out = fp4.nvfp4_gemm_bias_residual_fp16(a, b, sfa, sfb, bias, residual, alpha=2.0)
    expected = 2.0 * (a_dq @ b_dq.T) + bias.double() + residual.double()
    assert_within_bound(out, expected, 2 * a_dq, b_dq, "bias + residual fp16")


@requires_arch(90)
def test_bias_gelu_epilogue_is_within_the_bound(fp4, ref):
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, 200, 256, 512)
    bias = random_bf16(1, 256, 5).reshape(256)
    out = fp4.nvfp4_gemm_bias_gelu_bf16(a, b, sfa, sfb, bias)
    expected = torch.nn.functional.gelu(a_dq @ b_dq.T + bias.double())
    # GELU's slope is at most ~1.13: the input bound carries over with that factor
    assert_within_bound(out, expected, a_dq * 1.13, b_dq, "bias + gelu")


@requires_arch(90)
@pytest.mark.parametrize("a_format", [0, 1])
@pytest.mark.parametrize("m", [130, 3100])  # 3100: from 24 row tiles on, B is dequantized once to bf16
def test_e0m3_weight_gemm_is_within_the_bound(fp4, ref, a_format, m):
    x = random_bf16(m, 512, 1)
    if a_format == 1:
        a, sfa = fp4.quantize_fp4_sfa_bf16(x)
        a_dq = ref.dequantize(a, sfa, ref.NVFP4).double()
    else:
        a, sfa = fp4.quantize_e0m3_sfa_fp16(x.half())
        a_dq = ref.dequantize(a, sfa, ref.E0M3).double()
    b, sfb = fp4.quantize_e0m3_sfa_fp16(random_bf16(256, 512, 2).half())
    b_dq = ref.dequantize(b, sfb, ref.E0M3).double()
    out = poisoned_like(torch.empty(m, 256, dtype=torch.float16, device="cuda"))
    engine_gemm(fp4, a, b, sfa, sfb, "nvfp4" if a_format == 1 else "e0m3", "e0m3", out, alpha_scale=0.25)
    assert_within_bound(out, 0.25 * (a_dq @ b_dq.T), 0.25 * a_dq, b_dq, f"e0m3 a_format={a_format}")


@requires_arch(90)
@pytest.mark.parametrize("nk", [(17408, 5120), (5120, 17408), (12288, 5120)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_qualification_shapes_are_within_the_bound(fp4, ref, nk):
    n, k = nk
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, 384, n, k)
    out = fp4.nvfp4_gemm_bf16(
        a, b, sfa, sfb, out=poisoned_like(torch.empty(384, n, dtype=torch.bfloat16, device="cuda"))
    )
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"{n}x{k}")


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
def test_nan_scale_makes_its_row_and_only_its_row_nan(fp4, ref, mode):
    (a, b, sfa, sfb), _, _ = halops_operands(fp4, ref, mode, 200, 256, 256)
    fmt = ref.FORMATS[MODES[mode]]
    sfa.reshape(-1)[ref.sf_offset(70, 1, ref._ceil_div(256 // fmt.group, 4))] = fmt.scale_nan
    out = torch.empty(200, 256, dtype=torch.bfloat16, device="cuda")
    alpha = torch.ones(1, device="cuda")
    fp4.dense_gemm(a, b, sfa, sfb, out, alpha=alpha, mode=mode)
    nan_rows = out.isnan().any(dim=1).nonzero().flatten().tolist()
    assert nan_rows == [70] and bool(out[70].isnan().all())


def adversarial_operand(fp4, ref, fmt: str, rows: int, k: int, seed: int):
    """Random element bytes (no E4M3 NaN codes) and random scale codes over the whole UE4M3 range
    (subnormal, zero and 448 included) or the UE8M0 codes 2^-30 .. 2^30, of one halops operand; the
    scale buffer's padding bytes (blocks past K) hold the NaN code."""
    form = ref.FORMATS[fmt]
    values, scales = fp4.group_wise_quant(random_bf16(rows, k, seed), {v: m for m, v in MODES.items()}[fmt])
    g = torch.Generator(device="cuda").manual_seed(seed)

    def random_bytes(shape, low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=g, device="cuda", dtype=torch.uint8)

    codes = values.view(torch.uint8)
    if fmt == "mxfp8":  # magnitudes 0 .. 0x7E, either sign
        codes.copy_(random_bytes(codes.shape, 0, 0x7F) | (random_bytes(codes.shape, 0, 2) << 7))
    else:
        codes.copy_(random_bytes(codes.shape, 0, 256))
    flat = scales.view(-1)
    flat.copy_(random_bytes(flat.shape, 0, 0x7F) if form.scale != "ue8m0" else random_bytes(flat.shape, 97, 158))
    nkb = k // form.group
    nkt = ref._ceil_div(nkb, 4)
    for kb in range(nkb, 4 * nkt):
        flat[torch.as_tensor(ref.sf_offset(torch.arange(rows), kb, nkb), device="cuda")] = form.scale_nan
    return values, scales, ref.dequantize(values, scales, form).double()


@requires_arch(90)
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("k", [96, 512])
def test_every_scale_code_and_nan_padding_are_within_the_bound(fp4, ref, fmt, k):
    # the decode's factors (NVFP4: s * 2^119 on E2M1 bit patterns) are exact for every scale code,
    # and a K tail's padding scale bytes never reach the result
    m, n = 200, 264
    a, sfa, a_dq = adversarial_operand(fp4, ref, fmt, m, k, 1)
    b, sfb, b_dq = adversarial_operand(fp4, ref, fmt, n, k, 2)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    engine_gemm(fp4, a, b, sfa, sfb, fmt, fmt, out)
    assert bool(out.isfinite().all()), f"{fmt} k={k}: non-finite outputs"
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"{fmt} k={k}")


@requires_arch(90)
def test_runs_are_bitwise_equal_and_replay_in_a_cuda_graph(fp4, ref):
    (a, b, sfa, sfb), _, _ = nvfp4_operands(fp4, ref, 500, 768, 1024)
    first = fp4.nvfp4_gemm_bf16(a, b, sfa, sfb)
    second = fp4.nvfp4_gemm_bf16(a, b, sfa, sfb)
    assert_bitwise_equal(second, first, "second run")
    out = poisoned_like(first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.nvfp4_gemm_bf16(a, b, sfa, sfb, out=out)
    out.view(torch.uint8).fill_(0xA5)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, first, "graph replay")


@requires_arch(90)
@pytest.mark.parametrize("a_format", ["nvfp4", "bf16"])
@pytest.mark.parametrize("shape", [(64, 4352, 5120), (256, 17408, 1024)], ids=lambda s: "x".join(map(str, s)))
def test_stream_k_runs_are_bitwise_equal(fp4, ref, a_format, shape):
    # few tiles on all SMs: stream-K with one piece per CTA (64 rows), and with whole tiles between
    # pieces (256 rows: more units per CTA than one tile's K tiles), whose epilogue staging the next
    # piece's B decode reuses
    m, n, k = shape
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, m, n, k)
    if a_format == "bf16":
        a, sfa, a_dq = a_dq.to(torch.bfloat16), None, a_dq.to(torch.bfloat16).double()
    runs = []
    for _ in range(8):
        out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        engine_gemm(fp4, a, b, sfa, sfb, a_format, "nvfp4", out)
        runs.append(out)
    assert_within_bound(runs[0], a_dq @ b_dq.T, a_dq, b_dq, f"{a_format} {shape}")
    for i, out in enumerate(runs[1:], 1):
        assert_bitwise_equal(out, runs[0], f"{a_format} {shape} run {i}")


@requires_arch(90)
def test_k_not_a_multiple_of_32_falls_back_to_the_exact_reference(fp4, ref):
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, 64, 64, 48)
    assert dispatched(fp4, 90, m=64, n=64, k=48) == ""
    out = fp4.nvfp4_gemm_bf16(a, b, sfa, sfb)
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, "K=48 reference")


@requires_arch(90)
@pytest.mark.parametrize(
    "shape", [(257, 200, 320), (257, 200, 576), (384, 2048, 4096)], ids=lambda s: "x".join(map(str, s))
)
def test_stream_k_and_whole_tile_splits_are_both_within_the_bound(fp4, ref, shape):
    m, n, k = shape
    (a, b, sfa, sfb), a_dq, b_dq = halops_operands(fp4, ref, "w4a4-nvfp4", m, n, k)
    alpha = torch.ones(1, device="cuda")
    expected = a_dq @ b_dq.T
    # one SM: tiles divide evenly, whole tiles; all SMs: uneven, stream-K from K = 512 (8 K tiles),
    # whole tiles below; the streamk function: stream-K at every K
    for sm_count in (1, -1):
        out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        fp4.dense_gemm(a, b, sfa, sfb, out, alpha=alpha, sm_count=sm_count, mode="w4a4-nvfp4")
        assert_within_bound(out, expected, a_dq, b_dq, f"sm_count={sm_count}")
    a2, b2, sfa2, sfb2 = nvfp4_operands(fp4, ref, m, n, k)[0]
    streamk = fp4.nvfp4_gemm_streamk_bf16(a2, b2, sfa2, sfb2)
    again = fp4.nvfp4_gemm_streamk_bf16(a2, b2, sfa2, sfb2)
    assert_bitwise_equal(again, streamk, "stream-K run to run")


@requires_arch(90)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", [(3073, 264, 96), (3080, 520, 1024)], ids=lambda s: "x".join(map(str, s)))
def test_weights_dequantized_once_to_bf16_are_within_the_bound(fp4, ref, mode, shape):
    # from 24 row tiles of A on, B is dequantized once into bf16 scratch (BSource::Bf16)
    m, n, k = shape
    (a, b, sfa, sfb), a_dq, b_dq = halops_operands(fp4, ref, mode, m, n, k)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    fmt = MODES[mode]
    engine_gemm(fp4, a, b, sfa, sfb, fmt, fmt, out, alpha=torch.full((1,), 0.5, device="cuda"))
    assert_within_bound(out, 0.5 * (a_dq @ b_dq.T), 0.5 * a_dq, b_dq, f"{mode} {shape}")


# ---- bf16 operands: W4A16 (bf16 activations, 4-bit weights) and the plain bf16 GEMM ---------------


@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4", "bf16"])
def test_engine_serves_bf16_activations_with_4_bit_or_bf16_weights(fp4, b_format):
    # above the swapped engine's 256 rows (test_w4a16.py), below the composition's 1024
    assert dispatched(fp4, 90, "bf16", b_format, m=300, n=4096, k=4096) == "sm90_engine"


@pytest.mark.parametrize("grouping", ["batched", "masked", "contiguous"])
def test_engine_serves_grouped_w4a16_above_16_rows_per_group(fp4, grouping):
    """Not the skinny kernel's 16-row chunks (its path where no arch kernel reads a bf16 A)."""
    assert dispatched(fp4, 90, "bf16", "nvfp4", m=16, grouping=grouping) == "skinny"
    assert dispatched(fp4, 90, "bf16", "nvfp4", m=17, grouping=grouping) == "sm90_engine"


def test_engine_leaves_bf16_activations_with_8_bit_weights_to_other_backends(fp4):
    assert dispatched(fp4, 90, "bf16", "mxfp8", m=256) != "sm90_engine"


@requires_arch(90)
@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize(
    "shape", [(64, 256, 512), (300, 520, 1024), (3100, 264, 256)], ids=lambda s: "x".join(map(str, s))
)
def test_bf16_activations_with_4_bit_weights_are_within_the_bound(fp4, ref, b_format, shape):
    # from 24 row tiles of A on (m = 3100), B is dequantized once and both operands feed wgmma from
    # shared memory
    m, n, k = shape
    a = random_bf16(m, k, 21)
    mode = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4"}[b_format]
    b, sfb = fp4.group_wise_quant(random_bf16(n, k, 22, scale=0.05), mode)
    b_dq = ref.dequantize(b, sfb, ref.FORMATS[b_format]).double()
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    engine_gemm(fp4, a, b, None, sfb, "bf16", b_format, out, alpha_scale=0.5)
    assert_within_bound(out, 0.5 * (a.double() @ b_dq.T), 0.5 * a.double(), b_dq, f"w4a16 {b_format} {shape}")


@requires_arch(90)
@pytest.mark.parametrize(
    "shape", [(128, 128, 64), (300, 520, 1000), (2048, 1024, 4096)], ids=lambda s: "x".join(map(str, s))
)
def test_bf16_gemm_is_within_the_bound(fp4, ref, shape):
    m, n, k = shape
    a, b = random_bf16(m, k, 23), random_bf16(n, k, 24, scale=0.05)
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    engine_gemm(fp4, a, b, None, no_scales(), "bf16", "bf16", out, alpha_scale=2.0)
    assert_within_bound(out, 2.0 * (a.double() @ b.double().T), 2.0 * a.double(), b.double(), f"bf16 {shape}")


# ---- the 64-row tile (variant 2: 64 x 256, both consumer warpgroups on the same rows) -------------

SHORT_TILE = 2  # the variant that runs the 64-row tile on the engine (backend.cu tile_shape)
SHORT_TILE_PAIRS = [
    ("nvfp4", "nvfp4"),
    ("mxfp4", "mxfp4"),
    ("mxfp8", "mxfp8"),
    ("nvfp4", "e0m3"),
    ("e0m3", "e0m3"),
    ("bf16", "nvfp4"),
    ("bf16", "mxfp4"),
]
HALOPS_MODES = {fmt: mode for mode, fmt in MODES.items()}


def pair_operand(fp4, ref, fmt: str, rows: int, k: int, seed: int, scale: float = 1.0):
    """(values, scales, dequantized float64) of one operand in format `fmt` (bf16: no scales)."""
    x = random_bf16(rows, k, seed, scale)
    if fmt == "bf16":
        return x, None, x.double()
    if fmt == "e0m3":
        values, scales = fp4.quantize_e0m3_sfa_fp16(x.half())
    else:
        values, scales = fp4.group_wise_quant(x, HALOPS_MODES[fmt])
    return values, scales, ref.dequantize(values, scales, ref.FORMATS[fmt]).double()


@requires_arch(90)
@pytest.mark.parametrize("pair", SHORT_TILE_PAIRS, ids=lambda p: "x".join(p))
@pytest.mark.parametrize("m", [1, 17, 63, 64, 65, 100])
def test_64_row_tile_is_within_the_bound_for_every_format_pair(fp4, ref, pair, m):
    # N = 300: a part-filled second column tile; K = 352: a half-filled last K tile; m = 65 and 100
    # put a second row tile at row 64 of the first 128-row scale atom
    a_format, b_format = pair
    n, k = 300, 352
    a, sfa, a_dq = pair_operand(fp4, ref, a_format, m, k, 31)
    b, sfb, b_dq = pair_operand(fp4, ref, b_format, n, k, 32, scale=0.05)
    out = poisoned_like(torch.empty(m, n, dtype=torch.float16 if "e0m3" in pair else torch.bfloat16, device="cuda"))
    engine_gemm(fp4, a, b, sfa, sfb, a_format, b_format, out, alpha_scale=0.5, variant=SHORT_TILE)
    assert_within_bound(out, 0.5 * (a_dq @ b_dq.T), 0.5 * a_dq, b_dq, f"64-row tile {pair} m={m}")


@requires_arch(90)
@pytest.mark.parametrize("epilogue", ["bias_residual_fp16", "bias_gelu_bf16"])
def test_64_row_tile_epilogues_are_within_the_bound(fp4, ref, epilogue):
    m, n, k = 90, 520, 512
    (a, b, sfa, sfb), a_dq, b_dq = nvfp4_operands(fp4, ref, m, n, k)
    bias = random_bf16(1, n, 5).reshape(n)
    alpha = torch.full((1,), 0.75, device="cuda")
    if epilogue == "bias_residual_fp16":
        residual = random_bf16(m, n, 6).half()
        out = poisoned_like(torch.empty(m, n, dtype=torch.float16, device="cuda"))
        fields = dict(bias=bias, residual=residual)
        expected = 0.75 * (a_dq @ b_dq.T) + bias.double() + residual.double()
        slope = 1.0
    else:
        out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        fields = dict(bias=bias, activation="gelu")
        expected = torch.nn.functional.gelu(0.75 * (a_dq @ b_dq.T) + bias.double())
        slope = 1.13  # GELU's largest slope: the input bound carries over with it
    engine_gemm(fp4, a, b, sfa, sfb, "nvfp4", "nvfp4", out, alpha=alpha, variant=SHORT_TILE, **fields)
    assert_within_bound(out, expected, 0.75 * slope * a_dq, b_dq, f"64-row tile {epilogue}")


@requires_arch(90)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize(
    "shape", [(64, 4352, 5120), (100, 4352, 5120), (256, 4096, 7168)], ids=lambda s: "x".join(map(str, s))
)
def test_64_row_tile_stream_k_runs_are_bitwise_equal(fp4, ref, fmt, shape):
    # 17 to 64 tiles of 64 x 256 on all SMs: stream-K, one or a few pieces per CTA; one SM: whole tiles
    m, n, k = shape
    (a, b, sfa, sfb), a_dq, b_dq = halops_operands(fp4, ref, HALOPS_MODES[fmt], m, n, k)
    runs = []
    for _ in range(8):
        out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        engine_gemm(fp4, a, b, sfa, sfb, fmt, fmt, out, variant=SHORT_TILE)
        runs.append(out)
    assert_within_bound(runs[0], a_dq @ b_dq.T, a_dq, b_dq, f"64-row tile {fmt} {shape}")
    for i, out in enumerate(runs[1:], 1):
        assert_bitwise_equal(out, runs[0], f"64-row tile {fmt} {shape} run {i}")
    whole = poisoned_like(runs[0])
    engine_gemm(fp4, a, b, sfa, sfb, fmt, fmt, whole, variant=SHORT_TILE, sm_count=1)
    assert_within_bound(whole, a_dq @ b_dq.T, a_dq, b_dq, f"64-row tile {fmt} {shape} whole tiles")


# (rows, n, k, variant, SMs): a grid of `SMs` CTAs over more than a wave of tiles that do not fill
# their last one, so stream-K splits only the last wave's tiles (or, where that wave holds few, the
# last two waves') and the CTAs take the others whole before them (scheduler.cuh): 24 tiles of
# 128 x 256 on 7 SMs; 51 on 25 SMs, the last two waves split; 64 tiles of 64 x 256 on 30 SMs, and on
# 60 SMs, where 4 split tiles of 15 CTAs each spread their fix-up
WHOLE_THEN_SPLIT = [
    (384, 2048, 4096, -1, 7),
    (320, 4352, 5120, -1, 25),
    (256, 4096, 7168, SHORT_TILE, 30),
    (256, 4096, 7168, SHORT_TILE, 60),
]


@requires_arch(90)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "bf16"])
@pytest.mark.parametrize("case", WHOLE_THEN_SPLIT, ids=lambda c: "x".join(map(str, c[:3])) + f"-sms{c[4]}")
def test_whole_tiles_before_split_ones_are_within_the_bound_and_reproducible(fp4, ref, fmt, case):
    m, n, k, variant, sms = case
    a_format, b_format = fmt, "nvfp4" if fmt == "bf16" else fmt
    (a, b, sfa, sfb), a_dq, b_dq = halops_operands(fp4, ref, HALOPS_MODES[b_format], m, n, k)
    if fmt == "bf16":  # bf16 activations, NVFP4 weights (the W4A16 row above 256 rows)
        a, sfa, a_dq = a_dq.to(torch.bfloat16), None, a_dq.to(torch.bfloat16).double()
    runs = []
    for _ in range(4):
        out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        engine_gemm(fp4, a, b, sfa, sfb, a_format, b_format, out, variant=variant, sm_count=sms)
        runs.append(out)
    assert_within_bound(runs[0], a_dq @ b_dq.T, a_dq, b_dq, f"{fmt} {case}")
    for i, out in enumerate(runs[1:], 1):
        assert_bitwise_equal(out, runs[0], f"{fmt} {case} run {i}")


@requires_arch(90)
def test_64_row_tile_replays_in_a_cuda_graph(fp4, ref):
    m, n, k = 64, 4352, 5120  # stream-K: the flags' reset is part of the graph
    (a, b, sfa, sfb), _, _ = nvfp4_operands(fp4, ref, m, n, k)
    first = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    engine_gemm(fp4, a, b, sfa, sfb, "nvfp4", "nvfp4", first, variant=SHORT_TILE)
    out = poisoned_like(first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        engine_gemm(fp4, a, b, sfa, sfb, "nvfp4", "nvfp4", out, variant=SHORT_TILE)
    for _ in range(2):
        out.view(torch.uint8).fill_(0xA5)
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, first, "64-row tile graph replay")


@requires_arch(90)
@pytest.mark.parametrize("row", [5, 70, 99])
def test_64_row_tile_nan_scale_makes_its_row_and_only_its_row_nan(fp4, ref, row):
    # rows 64.. of A are the second 64-row tile, whose scales sit at row 64 of the first scale atom
    m, n, k = 100, 300, 256
    (a, b, sfa, sfb), _, _ = nvfp4_operands(fp4, ref, m, n, k)
    sfa.reshape(-1)[ref.sf_offset(row, 1, ref._ceil_div(k // 16, 4))] = ref.NVFP4.scale_nan
    out = poisoned_like(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    engine_gemm(fp4, a, b, sfa, sfb, "nvfp4", "nvfp4", out, variant=SHORT_TILE)
    nan_rows = out.isnan().any(dim=1).nonzero().flatten().tolist()
    assert nan_rows == [row] and bool(out[row].isnan().all())
