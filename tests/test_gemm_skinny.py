"""The M <= 16 kernels (csrc/gemm/skinny) through the public functions: within the docs/FORMATS.md
bound of float64 math on the exactly dequantized operands (the reference, on CPU copies), for every
M in 1..16, N at its alignment and large, every operand format, epilogue and output type, the decode
GEMV on the streaming layout, K tails, NaN scales; outputs poisoned first; bitwise equal run to run,
with and without a K split, and under CUDA graph replay; the native repack bit for bit. Both kernels
of the tier, named by their variant (SKINNY_KERNELS), where the planner would pick either; on sm_90
the register-streaming kernel at 17..64 rows, named and where dispatch takes it.

Which backend serves a problem is asked from the build (GemmCall.backends): those tests run without a
GPU."""

from __future__ import annotations

import pytest
import torch
from cases import build_capabilities, compute_capability, dispatched
from checks import POISON_BYTE, assert_bitwise_equal, assert_within_bound, poisoned_like
from conftest import requires_arch
from decode_cases import (
    EXPERT_SHAPES,
    MODES,
    QUALIFICATION_SHAPES,
    REGISTER_STREAM_PAIRS,
    SKINNY_KERNELS,
    Operands,
    assert_epilogue_within_bound,
    gemm,
    gpu_activation,
    gpu_weight,
    poisoned_out,
    random_bf16,
)

OPERAND_PAIRS = [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8", "mxfp8"), ("nvfp4", "e0m3"), ("e0m3", "e0m3")]
W4A16_PAIRS = [("bf16", "nvfp4"), ("bf16", "mxfp4"), ("bf16", "mxfp8")]
ARCHS = tuple(compute_capability(cap) for cap in build_capabilities())  # 90, 100, ... from build.toml


# ---- which problems the skinny kernels serve (host-side predicate: runs without a GPU) ----------


def m16_tier_backend(fp4, cc: int, pair: tuple[str, str], m: int, activation: str) -> str:
    """The skinny tier, but for W4A16 of 9 to 16 rows with 4-bit weights and no epilogue on sm_90,
    which dispatch gives the swapped engine where the build has it (docs/PERFORMANCE.md)."""
    swapped = cc == 90 and pair in (("bf16", "nvfp4"), ("bf16", "mxfp4")) and m >= 9 and activation == "none"
    return "sm90_swap_ab" if swapped and "sm90_swap_ab" in fp4.ops.gemm_backend_names() else "skinny"


@pytest.mark.parametrize("cc", ARCHS)
@pytest.mark.parametrize("pair", OPERAND_PAIRS + W4A16_PAIRS, ids="-".join)
def test_skinny_serves_every_dense_problem_of_up_to_16_rows_on_every_arch_but_w4a16_from_9_on_sm90(fp4, cc, pair):
    for m in range(1, 17):
        for activation in ("none", "gelu", "relu2"):
            for out_format in ("bf16", "fp16"):
                got = dispatched(fp4, cc, *pair, m=m, activation=activation, out_format=out_format, unbuilt=True)
                expected = m16_tier_backend(fp4, cc, pair, m, activation)
                assert got == expected, f"M={m} {activation} {out_format}: {got!r}"


@pytest.mark.parametrize("schedule", ["auto", "streamk"])
def test_skinny_serves_every_schedule_of_the_tier(fp4, schedule):
    assert dispatched(fp4, 90, m=16, schedule=schedule) == "skinny"


def test_skinny_serves_the_interleaved_gemv_at_its_alignment(fp4):
    assert dispatched(fp4, 90, m=1, n=8, k=64, b_interleaved=True) == "skinny"
    assert dispatched(fp4, 90, m=1, n=4104, k=4160, b_interleaved=True) == "skinny"


@pytest.mark.parametrize(
    "kind",
    [
        {"m": 65},
        {"m": 17, "n": 17408},  # dense, 17..64 rows: only where the register-streaming kernel measured faster
        # NVFP4 outputs the register-streaming kernel does not encode (test_gemm_stream_nvfp4.py)
        {"activation": "geglu", "out_format": "nvfp4_from_fp16", "sm_count": 66},
        {"out_format": "nvfp4", "variant": 3},
        {"activation": "relu2", "out_format": "nvfp4", "n": 4104},  # N_out % 16 == 8
        {"grouping": "masked", "m": 17},  # 17 rows per group
        {"grouping": "batched", "m": 17},
        {"grouping": "contiguous", "m": 17},  # 136 rows over 8 groups: more than 16 per group on average
        {"grouping": "masked", "n": 4104},  # a group's weight rows would not start on a 128-row scale tile
        {"grouping": "masked", "out_format": "nvfp4"},
        {"k": 48},  # 24-byte NVFP4 rows: not whole 16-byte chunks
        {"m": 2, "b_interleaved": True},  # the streaming layout is the M = 1 GEMV's
        {"m": 1, "n": 12, "k": 64, "b_interleaved": True},
        {"m": 1, "n": 8, "k": 96, "b_interleaved": True},
        {"m": 1, "grouping": "masked", "b_interleaved": True},
    ],
    ids=lambda kind: "-".join(f"{key}={value}" for key, value in kind.items()),
)
def test_skinny_leaves_other_problems_to_the_engines_or_the_reference(fp4, kind):
    kind = {"m": 4} | kind  # a decode step's rows where the case names none
    assert dispatched(fp4, 90, **kind) != "skinny"


def test_skinny_leaves_mismatched_operand_formats_alone(fp4):
    pairs = [("mxfp4", "nvfp4"), ("nvfp4", "mxfp4"), ("mxfp8", "mxfp4"), ("mxfp4", "e0m3"), ("bf16", "e0m3")]
    for a_format, b_format in pairs:
        assert dispatched(fp4, 90, a_format, b_format, m=4) != "skinny", (a_format, b_format)


# ---- every M, every format ----------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("n", [8, 4104])
@pytest.mark.parametrize("m", range(1, 17))
def test_nvfp4_gemm_bf16_every_m_within_the_bound(fp4, ref, m, n):
    ops = Operands(ref, "nvfp4", "nvfp4", m, n, 512, seed=m)
    out = fp4.nvfp4_gemm_bf16(*ops.cuda(), alpha=0.5, out=poisoned_out(m, n))
    assert_within_bound(out.cpu(), 0.5 * ops.product(), 0.5 * ops.a_dq, ops.b_dq, f"M={m} N={n}")


@requires_arch()
@pytest.mark.parametrize("n", [8, 4104])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 13, 16])
@pytest.mark.parametrize("fmt", list(MODES))
def test_dense_gemm_every_mode_and_m_within_the_bound(fp4, ref, fmt, m, n):
    ops = Operands(ref, fmt, fmt, m, n, 512, seed=100 + m)
    bias = random_bf16(1, n, 7).reshape(n)
    out = poisoned_out(m, n)
    a, b, sfa, sfb = ops.cuda()
    fp4.dense_gemm(a, b, sfa, sfb, out, bias=bias.cuda(), alpha=torch.tensor([0.75], device="cuda"), mode=MODES[fmt])
    assert_epilogue_within_bound(out, ops, alpha=0.75, bias=bias, what=f"{fmt} M={m} N={n}")


@requires_arch()
@pytest.mark.parametrize("m", [1, 4, 8, 9, 16])
@pytest.mark.parametrize("a_format", [1, 0])
def test_e0m3_weight_gemm_fp16_within_the_bound(fp4, ref, a_format, m):
    ops = Operands(ref, "nvfp4" if a_format == 1 else "e0m3", "e0m3", m, 4104, 256, seed=200 + m)
    out = poisoned_out(m, 4104, torch.float16)
    fp4.e0m3_weight_gemm_fp16(*ops.cuda(), alpha=0.25, a_format=a_format, out=out)
    assert_within_bound(out.cpu(), 0.25 * ops.product(), 0.25 * ops.a_dq, ops.b_dq, f"a_format={a_format} M={m}")


# ---- the flashrt tiers: knobs, the streaming layout ------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("stages", [1, 3, 8])
@pytest.mark.parametrize("warps", [2, 4, 8])
@pytest.mark.parametrize("m", [1, 7, 16])
def test_mrows_tier_every_knob_within_the_bound(fp4, ref, m, warps, stages):
    k = 64 * warps * 3
    ops = Operands(ref, "nvfp4", "nvfp4", m, 4104, k, seed=300 + m)
    out = fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(
        *ops.cuda(), alpha=2.0, warps=warps, stages=stages, out=poisoned_out(m, 4104)
    )
    what = f"M={m} warps={warps} stages={stages}"
    assert_within_bound(out.cpu(), 2.0 * ops.product(), 2.0 * ops.a_dq, ops.b_dq, what)


@requires_arch()
@pytest.mark.parametrize("stages", [1, 3, 8])
@pytest.mark.parametrize("warps", [2, 4, 8])
@pytest.mark.parametrize("nk", [(8, 64), (136, 192), (4104, 512)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemv_on_the_streaming_layout_within_the_bound(fp4, ref, nk, warps, stages):
    n, k = nk
    ops = Operands(ref, "nvfp4", "nvfp4", 1, n, k, seed=n + k)
    a, b, sfa, sfb = ops.cuda()
    streamed = fp4.fp4_repack_b_interleaved_sm120(b)
    out = fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(
        a, streamed, sfa, sfb, alpha=0.5, warps=warps, stages=stages, out=poisoned_out(1, n)
    )
    assert_within_bound(out.cpu(), 0.5 * ops.product(), 0.5 * ops.a_dq, ops.b_dq, f"{n}x{k} warps={warps}")


# ---- epilogues and output types ------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("m", [1, 11, 16])
def test_bias_residual_gelu_epilogues_within_the_bound(fp4, ref, m):
    n, k = 4104, 256
    ops = Operands(ref, "nvfp4", "nvfp4", m, n, k, seed=400 + m)
    a, b, sfa, sfb = ops.cuda()
    bias = random_bf16(1, n, 1).reshape(n)
    residual = random_bf16(m, n, 2)
    checks = {
        "bias bf16": (fp4.nvfp4_gemm_bias_bf16(a, b, sfa, sfb, bias.cuda(), alpha=1.5, out=poisoned_out(m, n)),
                      {"alpha": 1.5, "bias": bias}),
        "bias fp32 stream-K": (fp4.nvfp4_gemm_streamk_bias_bf16(a, b, sfa, sfb, bias.float().cuda(),
                                                                 out=poisoned_out(m, n)), {"bias": bias.float()}),
        "residual": (fp4.nvfp4_gemm_residual_bf16(a, b, sfa, sfb, residual.cuda(), out=poisoned_out(m, n)),
                     {"residual": residual}),
        "bias + residual": (fp4.nvfp4_gemm_bias_residual_bf16(a, b, sfa, sfb, bias.cuda(), residual.cuda(), alpha=0.5,
                                                              out=poisoned_out(m, n)),
                            {"alpha": 0.5, "bias": bias, "residual": residual}),
        "bias + residual fp16": (fp4.nvfp4_gemm_bias_residual_fp16(a, b, sfa, sfb, bias.half().cuda(),
                                                                   residual.half().cuda(),
                                                                   out=poisoned_out(m, n, torch.float16)),
                                 {"bias": bias.half(), "residual": residual.half()}),
        "bias + gelu": (fp4.nvfp4_gemm_bias_gelu_bf16(a, b, sfa, sfb, bias.cuda(), alpha=3.0, out=poisoned_out(m, n)),
                        {"alpha": 3.0, "bias": bias, "activation": "gelu"}),
        "fp16": (fp4.nvfp4_gemm_fp16(a, b, sfa, sfb, alpha=0.25, out=poisoned_out(m, n, torch.float16)),
                 {"alpha": 0.25}),
    }  # fmt: skip
    for what, (out, epilogue) in checks.items():
        assert_epilogue_within_bound(out, ops, **epilogue, what=f"M={m} {what}")


@requires_arch()
@pytest.mark.parametrize("out_format", ["bf16", "fp16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_relu2_and_gelu_with_16_bit_outputs_within_the_bound(fp4, ref, fmt, out_format):
    """The gemm op directly: no public function pairs relu2 with a 16-bit output."""
    m, n = 6, 1032
    ops = Operands(ref, fmt, fmt, m, n, 320, seed=9)
    a, b, sfa, sfb = ops.cuda()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[out_format]
    bias = random_bf16(1, n, 3).reshape(n).to(dtype)
    for activation in ("relu2", "gelu"):
        out = poisoned_out(m, n, dtype)
        fp4._gemm.GemmCall(
            a, b, sfa, sfb, fmt, fmt, alpha_scale=0.5, bias=bias.cuda(), activation=activation, out=out,
            out_format=out_format, pdl=False,
        ).run()  # fmt: skip
        assert_epilogue_within_bound(out, ops, alpha=0.5, bias=bias, activation=activation, what=f"{fmt} {activation}")


# ---- K tails, scale padding, NaN scales -----------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("kernel", list(SKINNY_KERNELS))
@pytest.mark.parametrize("fmt", list(MODES) + ["e0m3"])
@pytest.mark.parametrize("k", [32, 96, 160, 224, 288])
def test_k_tails_ignore_the_scale_padding(fp4, ref, fmt, k, kernel):
    """K that ends inside a slab and inside a 4-block SfAtom column: the padding scale bytes (0 by
    contract) are set to the NaN code here, and must not reach the result."""
    m, n = 3, 72
    ops = Operands(ref, "nvfp4" if fmt == "e0m3" else fmt, fmt, m, n, k, seed=k)
    a, b, sfa, sfb = ops.cuda()
    group = ref.FORMATS[fmt].group
    nkb = k // group
    for buffer, rows, scale_format in ((sfa, m, "nvfp4" if fmt == "e0m3" else fmt), (sfb, n, fmt)):
        flat = buffer.reshape(-1)
        padding = torch.ones_like(flat, dtype=torch.bool)
        padding[ref.unswizzle_scales(torch.arange(flat.numel()), rows, nkb).reshape(-1).cuda()] = False
        flat[padding] = ref.FORMATS[scale_format].scale_nan
    out = poisoned_out(m, n, torch.float16)
    fp4._gemm.GemmCall(
        a, b, sfa, sfb, "nvfp4" if fmt == "e0m3" else fmt, fmt, out=out, out_format="fp16",
        **SKINNY_KERNELS[kernel], pdl=False,
    ).run()  # fmt: skip
    a_format = "nvfp4" if fmt == "e0m3" else fmt
    assert dispatched(fp4, 90, a_format, fmt, m=m, n=n, k=k) == "skinny", f"{a_format} x {fmt} {m=} {n=} {k=}"
    assert_within_bound(out.cpu(), ops.product(), ops.a_dq, ops.b_dq, f"{fmt} K={k} {kernel}")


def assert_nan_scales_make_their_row_and_column_nan(fp4, ref, fmt: str, m: int, k: int, token: int, knobs: dict,
                                                   what: str) -> None:  # fmt: skip
    """The NaN scale code at block 1 of A's row `token` and at the last block of weight row 130: NaN in
    exactly that output row and column."""
    n = 264
    ops = Operands(ref, fmt, fmt, m, n, k, seed=11)
    a, b, sfa, sfb = ops.cuda()
    nkb = k // ref.FORMATS[fmt].group
    nan = ref.FORMATS[fmt].scale_nan
    sfa.reshape(-1)[ref.sf_offset(token, 1, nkb)] = nan
    sfb.reshape(-1)[ref.sf_offset(130, nkb - 1, nkb)] = nan
    out = gemm(fp4, a, b, sfa, sfb, fmt, fmt, poisoned_out(m, n), **knobs)
    nan_mask = out.isnan().cpu()
    expected = torch.zeros(m, n, dtype=torch.bool)
    expected[token, :] = True
    expected[:, 130] = True
    assert torch.equal(nan_mask, expected), f"{what}: NaN at {nan_mask.nonzero().tolist()[:8]}"


@requires_arch()
@pytest.mark.parametrize("kernel", list(SKINNY_KERNELS))
@pytest.mark.parametrize("fmt", list(MODES))
def test_nan_scales_make_their_row_and_column_nan(fp4, ref, fmt, kernel):
    assert_nan_scales_make_their_row_and_column_nan(fp4, ref, fmt, 9, 256, 4, SKINNY_KERNELS[kernel], f"{fmt} {kernel}")


# ---- split-K, determinism, graphs ------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("m", [1, 16])
def test_split_and_unsplit_k_both_within_the_bound_and_each_deterministic(fp4, ref, m):
    """One SM: the grid never splits K; all SMs: a K split with its float32 scratch and fixed-order reduction."""
    n, k = 2056, 4096
    ops = Operands(ref, "nvfp4", "nvfp4", m, n, k, seed=12)
    a, b, sfa, sfb = ops.cuda()
    alpha = torch.ones(1, device="cuda")
    for sm_count in (1, -1):
        outs = []
        for _ in range(2):
            out = poisoned_out(m, n)
            fp4.dense_gemm(a, b, sfa, sfb, out, alpha=alpha, sm_count=sm_count, mode="w4a4-nvfp4")
            outs.append(out)
        assert_bitwise_equal(outs[1], outs[0], f"sm_count={sm_count} run to run")
        assert_within_bound(outs[0].cpu(), ops.product(), ops.a_dq, ops.b_dq, f"M={m} sm_count={sm_count}")


@requires_arch()
@pytest.mark.parametrize("fmt", list(MODES))
def test_runs_are_bitwise_equal_and_replay_in_a_cuda_graph(fp4, ref, fmt):
    m, n, k = 5, 4104, 2048
    ops = Operands(ref, fmt, fmt, m, n, k, seed=13)
    a, b, sfa, sfb = ops.cuda()
    alpha = torch.tensor([1.25], device="cuda")
    first = poisoned_out(m, n)
    fp4.dense_gemm(a, b, sfa, sfb, first, alpha=alpha, mode=MODES[fmt])
    for _ in range(3):
        again = poisoned_out(m, n)
        fp4.dense_gemm(a, b, sfa, sfb, again, alpha=alpha, mode=MODES[fmt])
        assert_bitwise_equal(again, first, f"{fmt} run to run")
    out = poisoned_out(m, n)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.dense_gemm(a, b, sfa, sfb, out, alpha=alpha, mode=MODES[fmt])
    for _ in range(2):
        out.view(torch.uint8).fill_(POISON_BYTE)
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, first, f"{fmt} graph replay")
    assert_within_bound(out.cpu(), 1.25 * ops.product(), 1.25 * ops.a_dq, ops.b_dq, f"{fmt} graph replay")


# The decode shapes of the benchmark: operands quantized by the package on the GPU and checked
# against float64 math on the GPU.


def gpu_operands(fp4, ref, a_format: str, b_format: str, m: int, n: int, k: int, seed: int, a_scale: float = 1.0,
                 b_scale: float = 1.0):  # fmt: skip
    a, sfa, a_dq = gpu_activation(fp4, ref, a_format, m, k, seed, scale=a_scale)
    b, sfb = gpu_weight(fp4, ref, b_format, n, k, seed + 1, scale=b_scale)
    return (a, b, sfa, sfb), a_dq, ref.dequantize(b, sfb, ref.FORMATS[b_format]).double()


@requires_arch()
def test_gemv_replays_in_a_cuda_graph(fp4, ref):
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, "nvfp4", "nvfp4", 1, 17408, 5120, seed=14)
    streamed = fp4.fp4_repack_b_interleaved_sm120(b)
    first = fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, streamed, sfa, sfb)
    out = poisoned_like(first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, streamed, sfa, sfb, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, first, "gemv graph replay")
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, "gemv 17408x5120")


@requires_arch()
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("pair", [(f, f) for f in MODES] + W4A16_PAIRS[:2], ids="-".join)
@pytest.mark.parametrize("nk", QUALIFICATION_SHAPES + EXPERT_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_decode_shapes_within_the_bound(fp4, ref, nk, pair, m):
    """Both kernels where the register-streaming one serves the pair (the planner's choice otherwise);
    unnamed, W4A16 of 16 rows runs on the swapped engine (m16_tier_backend)."""
    n, k = nk
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, *pair, m, n, k, seed=15)
    expected = m16_tier_backend(fp4, 90, pair, m, "none")
    assert dispatched(fp4, 90, *pair, m=m, n=n, k=k) == expected, f"{pair} {m=} {n=} {k=}"
    kernels = SKINNY_KERNELS.items() if pair in REGISTER_STREAM_PAIRS else [("auto", {})]
    for kernel, knobs in kernels:
        out = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n), **knobs)
        assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"{pair} M={m} {n}x{k} {kernel}")


# ---- W4A16: bf16 activations over NVFP4, MXFP4 and MXFP8 weights (the gemm op, a_format "bf16") -----


@requires_arch()
@pytest.mark.parametrize("n", [8, 4104])
@pytest.mark.parametrize("m", range(1, 17))
@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4", "mxfp8"])
def test_w4a16_gemm_every_m_within_the_bound(fp4, ref, b_format, m, n):
    ops = Operands(ref, "bf16", b_format, m, n, 512, seed=500 + m)
    a, b, sfa, sfb = ops.cuda()
    out = gemm(fp4, a, b, sfa, sfb, "bf16", b_format, poisoned_out(m, n), alpha_scale=0.5)
    assert_within_bound(out.cpu(), 0.5 * ops.product(), 0.5 * ops.a_dq, ops.b_dq, f"bf16 x {b_format} M={m} N={n}")


@requires_arch()
@pytest.mark.parametrize("m", [1, 9, 16])
@pytest.mark.parametrize("pair", REGISTER_STREAM_PAIRS, ids="-".join)
@pytest.mark.parametrize("kernel", list(SKINNY_KERNELS))
def test_every_epilogue_of_both_kernels_within_the_bound(fp4, ref, kernel, pair, m):
    """W4A16 and the 4-bit W4A4 pairs: every output type, bias type and activation, with a residual."""
    n, k = 1032, 384
    ops = Operands(ref, *pair, m, n, k, seed=600 + m)
    a, b, sfa, sfb = ops.cuda()
    alpha = torch.tensor([0.75], device="cuda")
    for out_dtype in (torch.bfloat16, torch.float16):
        for bias_dtype in (torch.bfloat16, torch.float16, torch.float32):
            bias = random_bf16(1, n, 3).reshape(n).to(bias_dtype)
            residual = random_bf16(m, n, 4).to(out_dtype)
            for activation in ("none", "gelu", "relu2"):
                out = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n, out_dtype), alpha=alpha, bias=bias.cuda(),
                           residual=residual.cuda(), activation=activation,
                           **SKINNY_KERNELS[kernel])  # fmt: skip
                what = f"{kernel} {pair} M={m} out {out_dtype} bias {bias_dtype} {activation}"
                assert_epilogue_within_bound(out, ops, 0.75, bias, residual, activation, what)


@requires_arch()
@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4", "mxfp8"])
def test_w4a16_nan_weight_scales_make_their_column_nan(fp4, ref, b_format):
    m, n, k = 7, 264, 256
    ops = Operands(ref, "bf16", b_format, m, n, k, seed=21)
    a, b, sfa, sfb = ops.cuda()
    nkb = k // ref.FORMATS[b_format].group
    sfb.reshape(-1)[ref.sf_offset(130, nkb - 1, nkb)] = ref.FORMATS[b_format].scale_nan
    nan_mask = gemm(fp4, a, b, sfa, sfb, "bf16", b_format, poisoned_out(m, n)).isnan().cpu()
    expected = torch.zeros(m, n, dtype=torch.bool)
    expected[:, 130] = True
    assert torch.equal(nan_mask, expected), f"{b_format}: NaN at {nan_mask.nonzero().tolist()[:8]}"


@requires_arch()
@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4"])
def test_w4a16_runs_are_bitwise_equal_and_replay_in_a_cuda_graph(fp4, ref, b_format):
    m, n, k = 16, 4096, 7168
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, "bf16", b_format, m, n, k, seed=22)
    first = gemm(fp4, a, b, sfa, sfb, "bf16", b_format, poisoned_out(m, n))
    again = gemm(fp4, a, b, sfa, sfb, "bf16", b_format, poisoned_out(m, n))
    assert_bitwise_equal(again, first, f"{b_format} run to run")
    out = poisoned_out(m, n)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(fp4, a, b, sfa, sfb, "bf16", b_format, out)
    out.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, first, f"{b_format} graph replay")
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"bf16 x {b_format} graph replay")


# ---- MX block scales beyond one bf16 factor, NaN E4M3 elements ----------------------------------


@requires_arch()
@pytest.mark.parametrize("scales", [(2.0**24, 2.0**-24), (2.0**-24, 2.0**24)], ids=["large-a", "large-b"])
@pytest.mark.parametrize("pair", [("mxfp4", "mxfp4"), ("mxfp8", "mxfp8"), ("bf16", "mxfp4"), ("bf16", "mxfp8")],
                         ids="-".join)  # fmt: skip
def test_mx_scales_above_one_bf16_factor_within_the_bound(fp4, ref, pair, scales):
    """Block scales 2^k with k above 1 (MXFP4) or 7 (MXFP8) take the decode's second multiply."""
    m, n, k = 5, 520, 1024
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, *pair, m, n, k, seed=23, a_scale=scales[0],
                                                b_scale=scales[1])  # fmt: skip
    out = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n))
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"{pair} scales {scales}")


@requires_arch()
@pytest.mark.parametrize("kernel", list(SKINNY_KERNELS))
@pytest.mark.parametrize("a_format", ["mxfp8", "bf16"])
def test_nan_e4m3_weight_elements_make_their_column_nan(fp4, ref, a_format, kernel):
    """Elements 0x7F / 0xFF of weight rows 77 and 90 (bf16 A: the staged kernel under every knob)."""
    m, n, k = 3, 136, 128
    ops = Operands(ref, a_format, "mxfp8", m, n, k, seed=24)
    a, b, sfa, sfb = ops.cuda()
    b.view(torch.uint8)[77, 5] = 0x7F
    b.view(torch.uint8)[90, 100] = 0xFF
    out = gemm(fp4, a, b, sfa, sfb, a_format, "mxfp8", poisoned_out(m, n), **SKINNY_KERNELS[kernel])
    nan_mask = out.isnan().cpu()
    expected = torch.zeros(m, n, dtype=torch.bool)
    expected[:, [77, 90]] = True
    assert torch.equal(nan_mask, expected), f"{a_format} {kernel}: NaN at {nan_mask.nonzero().tolist()[:8]}"


# ---- the streaming-layout repack -------------------------------------------------------------------


@requires_arch()
@pytest.mark.parametrize("nk", [(8, 64), (136, 192), (4104, 5120)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_repack_cuda_equals_the_reference_bit_for_bit(fp4, ref, nk):
    n, k = nk
    b = torch.randint(0, 256, (n, k // 2), generator=torch.Generator().manual_seed(n), dtype=torch.uint8)
    expected = ref.interleave_rows(b)
    assert_bitwise_equal(fp4.fp4_repack_b_interleaved_sm120(b.cuda()).cpu(), expected, f"{n}x{k}")
    out = poisoned_like(b.cuda())
    assert fp4.fp4_repack_b_interleaved_sm120(b.cuda(), out=out) is out
    assert_bitwise_equal(out.cpu(), expected, f"{n}x{k} into out")


@requires_arch()
def test_repack_cuda_unaligned_and_in_place(fp4, ref):
    n, k = 24, 192
    b = torch.randint(0, 256, (n, k // 2), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    expected = ref.interleave_rows(b)
    storage = torch.zeros(n * k // 2 + 1, dtype=torch.uint8, device="cuda")
    unaligned = storage[1:].view(n, k // 2)
    unaligned.copy_(b.cuda())
    assert unaligned.data_ptr() % 16 != 0
    assert_bitwise_equal(fp4.fp4_repack_b_interleaved_sm120(unaligned).cpu(), expected, "unaligned input")
    in_place = b.cuda()
    fp4.ops.repack(in_place, in_place)
    assert_bitwise_equal(in_place.cpu(), expected, "in place")


# ---- argument rules, checked before any launch ------------------------------------------------------


@requires_arch()
def test_tier_rules_raise_before_launch(fp4, ref):
    a17, b, sfa17, sfb = Operands(ref, "nvfp4", "nvfp4", 17, 64, 384).cuda()
    a, _, sfa, _ = Operands(ref, "nvfp4", "nvfp4", 1, 64, 384).cuda()
    a2, _, sfa2, _ = Operands(ref, "nvfp4", "nvfp4", 2, 64, 384).cuda()
    with pytest.raises(ValueError, match="M <= 16"):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(a17, b, sfa17, sfb)
    with pytest.raises(ValueError, match="64 \\* warps"):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(a, b, sfa, sfb, warps=8)  # K = 384 is not a multiple of 512
    with pytest.raises(ValueError, match="warps"):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(a, b, sfa, sfb, warps=3)
    with pytest.raises(ValueError, match="stages"):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(a, b, sfa, sfb, stages=9)
    with pytest.raises(ValueError, match="M = 1"):
        fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a2, b, sfa2, sfb)
    with pytest.raises(ValueError, match="multiple of 8"):
        fp4.fp4_repack_b_interleaved_sm120(torch.zeros(12, 256, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()  # nothing was launched that could have failed


# ---- the register-streaming kernel by name (variant 4): every M, pair, tail, knob and K split ------

REGISTER_STREAM = SKINNY_KERNELS["register-stream"]["variant"]
STAGED = SKINNY_KERNELS["staged"]["variant"]
SPLITS = [1, 3, 8]  # one CTA per K range; clusters of 3 (uneven slices) and 8 (ranks with no step)


def kernel_names(fn) -> list[str]:
    """The CUDA kernels one call of fn launches (torch.profiler)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@requires_arch()
@pytest.mark.parametrize("pair", REGISTER_STREAM_PAIRS, ids="-".join)
def test_each_variant_runs_its_kernel(fp4, ref, pair):
    """The knobs of SKINNY_KERNELS launch the kernel they name, so the tests below hold that one to the bound."""
    m, n, k = 3, 264, 512
    a, b, sfa, sfb = Operands(ref, *pair, m, n, k, seed=30).cuda()
    out = poisoned_out(m, n)
    for kernel, knobs in SKINNY_KERNELS.items():
        names = kernel_names(lambda kn=knobs: gemm(fp4, a, b, sfa, sfb, *pair, out, **kn))
        streamed = [name for name in names if "register_stream_kernel" in name]
        staged = [name for name in names if "skinny_gemm_kernel" in name]
        expected = (streamed, staged) if kernel.startswith("register-stream") else (staged, streamed)
        assert len(expected[0]) == 1 and not expected[1], f"{pair} {kernel}: launched {names}"


@requires_arch()
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("m", [1, 7, 16])
@pytest.mark.parametrize("pair", [("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("nvfp4", "e0m3"), ("bf16", "nvfp4")],
                         ids="-".join)  # fmt: skip
def test_staged_kernel_takes_the_split_knob_within_the_bound(fp4, ref, pair, m, splits):
    """`splits` = S runs the staged kernel over clusters of S CTAs too (where one fits an SM), also
    where its planner would pick another S: K = 8192 gives every rank of 8 stages of its own."""
    ops = Operands(ref, *pair, m, 1040, 8192, seed=710)
    a, b, sfa, sfb = ops.cuda()
    out = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, 1040), variant=STAGED, splits=splits)
    assert_within_bound(out.cpu(), ops.product(), ops.a_dq, ops.b_dq, f"staged {pair} M={m} S={splits}")


@requires_arch()
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("m", range(1, 17))
@pytest.mark.parametrize("n", [8, 4104])
@pytest.mark.parametrize("pair", REGISTER_STREAM_PAIRS, ids="-".join)
def test_register_stream_every_m_within_the_bound(fp4, ref, pair, n, m, splits):
    """N = 8: one tile half past N; 4104: whole tiles, then one with 8 rows. K = 1536: 6 steps a row,
    over 1, 3 or 8 CTAs of a cluster."""
    ops = Operands(ref, *pair, m, n, 1536, seed=700)  # one weight per (pair, N): quantized once
    a, b, sfa, sfb = ops.cuda()
    out = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n), alpha_scale=0.5, variant=REGISTER_STREAM,
               splits=splits)  # fmt: skip
    assert_within_bound(out.cpu(), 0.5 * ops.product(), 0.5 * ops.a_dq, ops.b_dq, f"{pair} M={m} N={n} S={splits}")


@requires_arch()
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("tiles", [1, 3, 8])
@pytest.mark.parametrize("warps", [1, 3, 8])
@pytest.mark.parametrize("m", [1, 8, 13])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_register_stream_every_knob_within_the_bound(fp4, ref, fmt, m, warps, tiles, splits):
    """warps: K sub-slices of a CTA (more than its slice has steps leaves some idle); stages: 16-row
    tiles per CTA (with splits > 1 walked by 8 / warps groups of warps); splits: CTAs of a cluster."""
    n, k = 520, 1280  # 5 steps of 256 elements a row (NVFP4), 10 of 128 (MXFP8): uneven slices
    ops = Operands(ref, fmt, fmt, m, n, k, seed=800 + m)
    a, b, sfa, sfb = ops.cuda()
    out = gemm(fp4, a, b, sfa, sfb, fmt, fmt, poisoned_out(m, n), warps=warps, stages=tiles, splits=splits,
               variant=REGISTER_STREAM)  # fmt: skip
    what = f"{fmt} M={m} warps={warps} tiles={tiles} splits={splits}"
    assert_within_bound(out.cpu(), ops.product(), ops.a_dq, ops.b_dq, what)


@requires_arch()
@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("nk", [(17408, 5120), (5120, 17408), (1536, 7168)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_register_stream_planned_split_within_the_bound(fp4, ref, fmt, nk, m):
    """The split the planner picks for variant 4 (splits 0) on decode shapes, M = 16 at K = 17408 too,
    where one CTA cannot stage all of K."""
    n, k = nk
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, fmt, fmt, m, n, k, seed=33)
    names = kernel_names(lambda: gemm(fp4, a, b, sfa, sfb, fmt, fmt, poisoned_out(m, n),
                                      variant=REGISTER_STREAM))  # fmt: skip
    assert any("register_stream_kernel" in name for name in names), f"{fmt} M={m} {n}x{k}: launched {names}"
    out = gemm(fp4, a, b, sfa, sfb, fmt, fmt, poisoned_out(m, n), variant=REGISTER_STREAM)
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"{fmt} M={m} {n}x{k} planned split")


@requires_arch()
@pytest.mark.parametrize(
    "scales", [(1.0, 1.0), (2.0**24, 2.0**-24), (2.0**-24, 2.0**24)], ids=["unit", "large-a", "large-b"]
)
@pytest.mark.parametrize("pair", REGISTER_STREAM_PAIRS, ids="-".join)
@pytest.mark.parametrize("splits", [1, 4])
def test_register_stream_adversarial_scales_within_the_bound(fp4, ref, splits, pair, scales):
    """MX block scales 2^k above one bf16 factor take the decode's second multiply."""
    m, n, k = 5, 520, 1024
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, *pair, m, n, k, seed=31, a_scale=scales[0],
                                                b_scale=scales[1])  # fmt: skip
    out = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n), variant=REGISTER_STREAM, splits=splits)
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"{pair} scales {scales} S={splits}")


@requires_arch()
@pytest.mark.parametrize("splits", [3, 8])
@pytest.mark.parametrize("fmt", list(MODES))
def test_register_stream_cluster_nan_scales_make_their_row_and_column_nan(fp4, ref, fmt, splits):
    """NaN scale codes in the slices of different ranks: K = 2048 (8 steps a row, 16 for MXFP8), token
    11's in rank 0's slice, weight row 130's in the last rank's."""
    knobs = {"variant": REGISTER_STREAM, "splits": splits}
    assert_nan_scales_make_their_row_and_column_nan(fp4, ref, fmt, 16, 2048, 11, knobs, f"{fmt} S={splits}")


@requires_arch()
@pytest.mark.parametrize("kernel, pair, splits", [
    ("staged", ("nvfp4", "e0m3"), 2), ("staged", ("nvfp4", "e0m3"), 3), ("staged", ("nvfp4", "nvfp4"), 8),
    ("register-stream", ("nvfp4", "nvfp4"), 2), ("register-stream", ("mxfp8", "mxfp8"), 8),
])  # fmt: skip
def test_cluster_k_split_is_bitwise_equal_while_other_work_shifts_its_ranks(fp4, ref, kernel, pair, splits):
    """The ranks of a cluster hand their partial sums over distributed shared memory, ordered by
    cluster-scope mbarriers (release by the writer's arrive, acquire by the reader's wait; a rank
    rewrites its partials only after every rank's `consumed` arrival). compute-sanitizer's racecheck
    does not model those barriers across CTAs and reports the reads as hazards. Here copies on a second
    stream take memory bandwidth and SMs while the GEMM runs, so its ranks reach the hand-over at
    shifting times: 200 runs are bitwise equal to the first, which is within the bound."""
    m, n, k = 7, 1024, 8192
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, *pair, m, n, k, seed=41)
    knobs = {"variant": SKINNY_KERNELS[kernel]["variant"], "splits": splits}
    first = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n), **knobs)
    assert_within_bound(first, a_dq @ b_dq.T, a_dq, b_dq, f"{kernel} {pair} M={m} S={splits}")
    noise = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    outs = [poisoned_out(m, n) for _ in range(200)]
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(40):
            noise[: 128 << 20].copy_(noise[128 << 20 :])
    for out in outs:
        gemm(fp4, a, b, sfa, sfb, *pair, out, **knobs)
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert_bitwise_equal(out, first, f"{kernel} {pair} M={m} S={splits} run {i} beside the copies")


@requires_arch()
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("pair", REGISTER_STREAM_PAIRS, ids="-".join)
def test_register_stream_runs_are_bitwise_equal_and_replay_in_a_cuda_graph(fp4, ref, pair, m, splits):
    n, k = 4104, 5120
    (a, b, sfa, sfb), a_dq, b_dq = gpu_operands(fp4, ref, *pair, m, n, k, seed=32)
    knobs = {"variant": REGISTER_STREAM, "splits": splits}
    first = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n), **knobs)
    for _ in range(2):
        again = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n), **knobs)
        assert_bitwise_equal(again, first, f"{pair} M={m} S={splits} run to run")
    out = poisoned_out(m, n)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(fp4, a, b, sfa, sfb, *pair, out, **knobs)
    for _ in range(2):
        out.view(torch.uint8).fill_(POISON_BYTE)
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, first, f"{pair} M={m} S={splits} graph replay")
    assert_within_bound(out, a_dq @ b_dq.T, a_dq, b_dq, f"{pair} M={m} S={splits} graph replay")


# ---- 17 to 64 rows: the register-streaming kernel on sm_90 (4 and 8 token tiles) ----------------

WIDE_MS = [17, 24, 32, 33, 48, 64]


@pytest.mark.parametrize("m", [17, 32, 33, 64])
@pytest.mark.parametrize("pair", REGISTER_STREAM_PAIRS, ids="-".join)
def test_register_stream_serves_17_to_64_rows_on_sm90_where_named(fp4, pair, m):
    assert dispatched(fp4, 90, *pair, m=m, n=4096, k=7168, variant=4) == "skinny"


@pytest.mark.parametrize(
    ("pair", "m", "n", "served"),
    [
        (("nvfp4", "nvfp4"), 32, 2048, True),  # 128 tiles x 4 token tiles
        (("nvfp4", "nvfp4"), 64, 2048, False),  # 128 x 8: 8 token tiles, the engine measured faster
        (("mxfp4", "mxfp4"), 32, 4096, True),  # 256 x 4 (W4A16 there: the swapped engine, test_w4a16)
        (("mxfp4", "mxfp4"), 48, 4096, False),  # 256 x 8
        (("nvfp4", "nvfp4"), 24, 17408, False),
        (("mxfp8", "mxfp8"), 32, 1536, True),  # 96 x 4
        (("mxfp8", "mxfp8"), 48, 1536, False),  # 96 x 8
        (("mxfp8", "mxfp8"), 32, 4096, False),  # 256 x 4: above MXFP8's 768
    ],
)
def test_dispatch_takes_the_register_stream_kernel_at_17_to_64_rows_where_measured_faster(fp4, pair, m, n, served):
    assert (dispatched(fp4, 90, *pair, m=m, n=n, k=7168) == "skinny") == served, f"{pair} {m=} {n=} k=7168"


def test_register_stream_leaves_wider_problems_other_arches_long_k_and_sm_count_to_the_engines(fp4):
    assert dispatched(fp4, 90, m=65, n=4096, k=7168, variant=4) != "skinny"
    assert dispatched(fp4, 90, m=64, n=4096, k=65536, variant=4) != "skinny"  # the activations do not fit
    assert dispatched(fp4, 90, m=32, n=4096, k=7168, variant=4, sm_count=64) != "skinny"
    assert dispatched(fp4, 90, m=32, n=4096, k=7168, variant=3) != "skinny"  # the staged kernel stops at 16
    for cc in ARCHS:
        if cc != 90:
            assert dispatched(fp4, cc, m=32, n=4096, k=7168, variant=4, unbuilt=True) != "skinny", f"sm_{cc}"


@requires_arch(90)
@pytest.mark.parametrize("splits", [1, 2, 0], ids=["one-cta", "cluster-2", "planner"])
@pytest.mark.parametrize("n", [8, 4104])
@pytest.mark.parametrize("m", WIDE_MS)
@pytest.mark.parametrize("pair", REGISTER_STREAM_PAIRS, ids="-".join)
def test_register_stream_17_to_64_rows_within_the_bound(fp4, ref, pair, m, n, splits):
    k = 544  # two whole 128-byte steps of a 4-bit row and a 16-byte tail (MXFP8: four and a tail)
    ops = Operands(ref, *pair, m, n, k, seed=700 + m + n)
    a, b, sfa, sfb = ops.cuda()
    out = gemm(fp4, a, b, sfa, sfb, *pair, poisoned_out(m, n), variant=4, splits=splits)
    assert_within_bound(out.cpu(), ops.product(), ops.a_dq, ops.b_dq, f"{pair} M={m} N={n} splits={splits}")


@requires_arch(90)
@pytest.mark.parametrize("m", [24, 64])
def test_register_stream_17_to_64_rows_epilogues_within_the_bound(fp4, ref, m):
    n, k = 1032, 2048
    ops = Operands(ref, "nvfp4", "nvfp4", m, n, k, seed=800 + m)
    a, b, sfa, sfb = ops.cuda()
    alpha = torch.tensor([0.75], device="cuda")
    bias, residual = random_bf16(1, n, 3).reshape(n), random_bf16(m, n, 4)
    for activation in ("none", "gelu", "relu2"):
        out = gemm(fp4, a, b, sfa, sfb, "nvfp4", "nvfp4", poisoned_out(m, n), alpha=alpha, bias=bias.cuda(),
                   residual=residual.cuda(), activation=activation, variant=4)  # fmt: skip
        assert_epilogue_within_bound(out, ops, 0.75, bias, residual, activation, f"M={m} {activation}")


@requires_arch(90)
@pytest.mark.parametrize("fmt", list(MODES))
def test_register_stream_17_to_64_rows_nan_scales_make_their_row_and_column_nan(fp4, ref, fmt):
    assert_nan_scales_make_their_row_and_column_nan(fp4, ref, fmt, 40, 256, 37, {"variant": 4}, f"{fmt} M=40")


@requires_arch(90)
@pytest.mark.parametrize("m", [17, 64])
def test_register_stream_17_to_64_rows_are_bitwise_equal_and_replay_in_a_cuda_graph(fp4, ref, m):
    n, k = 4104, 7168
    ops = Operands(ref, "nvfp4", "nvfp4", m, n, k, seed=900 + m)
    a, b, sfa, sfb = ops.cuda()

    def run(out: torch.Tensor) -> torch.Tensor:
        return gemm(fp4, a, b, sfa, sfb, "nvfp4", "nvfp4", out, variant=4)

    first = run(poisoned_out(m, n))
    for i in range(3):
        assert_bitwise_equal(run(poisoned_out(m, n)), first, f"M={m} run {i}")
    out = poisoned_out(m, n)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(out)
    out.view(torch.uint8).fill_(POISON_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, first, f"M={m} graph replay")
    assert_within_bound(out.cpu(), ops.product(), ops.a_dq, ops.b_dq, f"M={m}")
