"""The peers of benchmarks/peers.py (benchmarks/gemm_peers.py) checked on CPU against the reference, so a
broken peer never becomes a baseline, and the result rows checked for the keys the README and card read.

The Triton dequantizer runs in Triton's interpreter when no GPU is present; tl.dot_scaled has no
interpreter implementation, so its kernel is only compiled ahead of time for sm_90 here (its results
are checked against ours on every row of a GPU run).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest
import torch
from cases import require_built
from conftest import gpu_missing, requires_arch, requires_repo_file

BENCHMARKS = requires_repo_file("benchmarks")
sys.path.insert(0, str(BENCHMARKS))
import gemm_peers  # noqa: E402
import peers  # noqa: E402
import suites  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not gemm_peers.triton_available(), reason="triton is not installed")

# rows not a multiple of 128 and a block count not a multiple of 4: padding in both directions
ROWS, K_BLOCKS = 130, 6


def quantized(
    ref, name: str, rows: int = ROWS, k: int | None = None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, swizzled scales [2-D halops view], exact float32) of a random matrix in format `name`."""
    fmt = ref.FORMATS[name]
    x = torch.randn(rows, k or K_BLOCKS * fmt.group, generator=torch.Generator().manual_seed(seed))
    values, scales = ref.quantize(x, fmt, swizzle=True)
    return values, scales, ref.dequantize(values, scales, fmt)


# ---- the peers compute the GEMM the reference computes -----------------------------------------


@pytest.mark.parametrize("rows,nkb", [(1, 1), (130, 6), (256, 8), (300, 3)])
def test_sf_index_is_the_sfatom_offset(ref, rows, nkb):
    m = torch.arange(rows)[:, None]
    kb = torch.arange(nkb)[None, :]
    assert torch.equal(gemm_peers.sf_index(rows, nkb), ref.sf_offset(m, kb, nkb))
    plain = torch.randint(0, 255, (rows, nkb), dtype=torch.uint8)
    assert torch.equal(gemm_peers.plain_scales(ref.swizzle_scales(plain), rows, nkb), plain)


def test_decode_tables_match_the_reference(ref):
    def same(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)

    code = torch.arange(256, dtype=torch.uint8)
    same(gemm_peers.e4m3_values(), ref.decode_e4m3(code))
    same(gemm_peers.e4m3_values(), code.view(torch.float8_e4m3fn).float())  # torch's own E4M3 agrees
    nibble = torch.arange(16, dtype=torch.uint8)
    same(gemm_peers.element_table("e2m1").float(), ref.decode_e2m1(nibble))
    same(gemm_peers.element_table("e0m3").float(), ref.decode_e0m3(nibble))
    same(gemm_peers.scale_table("ue8m0").float(), ref.decode_ue8m0(code))
    same(gemm_peers.scale_table("ue4m3").float(), ref.decode_ue4m3(code))


@pytest.mark.parametrize("name", list(gemm_peers.OPERANDS))
@pytest.mark.parametrize("flat", [False, True], ids=["halops-2d", "flat"])
def test_torch_dequant_is_exact(ref, name, flat):
    values, scales, exact = quantized(ref, name)
    if flat:
        scales = scales.reshape(-1)  # the flashrt-style API's buffer
    operand = gemm_peers.OPERANDS[name]
    dequant = gemm_peers.TorchDequant.build(operand, ROWS, exact.shape[1], "cpu")
    assert torch.equal(dequant(values, scales), exact.to(torch.bfloat16))


def test_rowwise_fp8_reconstructs_within_e4m3_precision():
    x = torch.randn(5, 64) * torch.logspace(-3, 3, 5)[:, None]
    q, scale = gemm_peers.rowwise_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (5, 1)
    restored = q.float() * scale
    big = x.abs() >= x.abs().amax(dim=1, keepdim=True) * 2**-6  # normal range of the row's scale
    assert ((restored - x).abs() <= x.abs() * 2**-4)[big].all()


def test_rowwise_fp8_stacked_is_rowwise_fp8_per_matrix():
    """The grouped FP8 peer's operands: each expert's matrix as the dense peer quantizes it, with the
    scales [E, rows] that torch._scaled_grouped_mm takes."""
    w = torch.randn(3, 8, 64)
    q, scale = gemm_peers.rowwise_fp8_stacked(w)
    assert q.shape == w.shape and scale.shape == (3, 8)
    for e in range(3):
        q_e, scale_e = gemm_peers.rowwise_fp8(w[e])
        assert torch.equal(q[e].view(torch.uint8), q_e.view(torch.uint8)) and torch.equal(scale[e], scale_e[:, 0])


def test_copies_cover_l2():
    l2 = 60 * 2**20
    assert gemm_peers.copies_for(int(44.6e6), l2) == 3  # NVFP4 17408 x 5120 weight
    assert gemm_peers.copies_for(int(178e6), l2) == 2  # its bf16 form
    assert gemm_peers.copies_for(2**20, l2) == 61
    args = (torch.zeros(4), torch.ones(2))
    copies = gemm_peers.rotation_copies(args, 64)
    assert len(copies) == 1 + math.ceil(64 / 24) and copies[0] is args
    assert all(torch.equal(c[0], args[0]) and c[0].data_ptr() != args[0].data_ptr() for c in copies[1:])
    seen = []
    rotation = gemm_peers.Rotation(lambda a, b: seen.append(a.data_ptr()) or a, copies)
    for _ in range(2 * len(copies)):
        rotation()
    assert seen == [c[0].data_ptr() for c in copies] * 2


def sm90_compile(kernel, signature: dict[str, str], constants: dict, num_warps: int, num_stages: int = 3):
    """Compile a jitted kernel for sm_90 without a GPU (Triton's bundled ptxas), with the 16-byte
    alignment the launcher would specialize on for the given argument names."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature)
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in ("values", "scales", "out", "a", "b", "c", "k")
               if n in names}  # fmt: skip
    source = ASTSource(kernel, signature | dict.fromkeys(constants, "constexpr"), constants, aligned)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


@needs_triton
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4"])
def test_dot_scaled_compiles_for_sm90(name):
    kernels = gemm_peers.triton_kernels()
    operand = gemm_peers.OPERANDS[name]
    config = gemm_peers.dot_scaled_config(4096)
    pointer = "*fp8e4nv" if name == "mxfp8" else "*u8"
    signature = {"a": pointer, "a_scale": "*u8", "b": pointer, "b_scale": "*u8", "c": "*bf16",
                 "m": "i32", "n": "i32", "k": "i32"}  # fmt: skip
    constants = {"FORMAT": operand.element, "PACK": 2 if operand.packed else 1, "SCALE_GROUP": operand.group,
                 "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                 "GROUP_M": 8}  # fmt: skip
    compiled = sm90_compile(kernels.dot_scaled, signature, constants, config.num_warps, config.num_stages)
    assert "mma" in compiled.asm["ptx"]


@needs_triton
def test_dequant_kernel_compiles_vectorized_for_sm90():
    kernels = gemm_peers.triton_kernels()
    operand = gemm_peers.OPERANDS["nvfp4"]
    signature = {"values": "*u8", "scales": "*u8", "out": "*bf16", "rows": "i32", "k": "i32", "nkt": "i32"}
    constants = {"ELEMENT": 1, "SCALE": 1, "GROUP": operand.group, "BLOCK_ROWS": gemm_peers.DEQUANT_BLOCK_ROWS,
                 "BLOCK_K": gemm_peers.DEQUANT_BLOCK_K}  # fmt: skip
    ptx = sm90_compile(kernels.dequant, signature, constants, num_warps=4).asm["ptx"]
    assert "st.global.v4" in ptx  # 16-byte stores: the kernel is meant to run near copy bandwidth


def interpreted_peers(monkeypatch) -> object:
    """A second instance of gemm_peers whose Triton kernels are jitted for Triton's CPU interpreter
    (the flag is read when they are jitted; the first instance keeps its compiled kernels)."""
    spec = importlib.util.spec_from_file_location("gemm_peers_interpreted", BENCHMARKS / "gemm_peers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    module.triton_kernels()
    return module


@needs_triton
@pytest.mark.parametrize("name", list(gemm_peers.OPERANDS))
def test_triton_dequant_is_exact(ref, monkeypatch, name):
    module = gemm_peers if DEVICE == "cuda" else interpreted_peers(monkeypatch)
    values, scales, exact = quantized(ref, name)
    out = torch.full(exact.shape, float("nan"), dtype=torch.bfloat16, device=DEVICE)
    module.triton_dequant(values.to(DEVICE), scales.to(DEVICE), module.OPERANDS[name], out)
    assert torch.equal(out.cpu(), exact.to(torch.bfloat16))


@requires_arch()  # tl.dot_scaled needs a GPU
@needs_triton
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_triton_dot_scaled_matches_cublas_on_exact_operands(ref, name, m):
    k = 512  # a multiple of every configuration's BLOCK_K
    a_values, a_scales, a_exact = (t.cuda() for t in quantized(ref, name, rows=m, k=k, seed=1))
    b_values, b_scales, b_exact = (t.cuda() for t in quantized(ref, name, rows=256, k=k, seed=2))
    nkb = k // ref.FORMATS[name].group
    out = torch.empty(m, 256, dtype=torch.bfloat16, device="cuda")
    a_plain, b_plain = gemm_peers.plain_scales(a_scales, m, nkb), gemm_peers.plain_scales(b_scales, 256, nkb)
    gemm_peers.triton_dot_scaled(a_values, a_plain, b_values, b_plain, gemm_peers.OPERANDS[name], out)
    expected = a_exact.double() @ b_exact.double().T
    assert gemm_peers.relative_error(out, expected) < 1e-2


# ---- humming-kernels' W4A16: our weight in its checkpoint layout --------------------------------

HUMMING_FORMATS = ["nvfp4", "mxfp4"]


def humming_dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor | None):
    """float32 [N, K] of a humming float4e2m1 weight in plain PyTorch: what humming's dequantize_weight
    (utils/weight.py) computes with its GPU ops. Unpack (kernel/pack_weight.cuh): element i of an int32
    word at bits 4i..4i+3. Decode (kernel/dequant_weight.cuh): the sign (bit 3) to float32's bit 31, the
    exponent and mantissa bits below float32's exponent field, times 2^(128 - 2) to rebias. Then the group
    scale repeated along K and the tensor scale."""
    words = weight.view(torch.int32)
    codes = ((words[..., None] >> (4 * torch.arange(8, dtype=torch.int32))) & 15).flatten(-2)
    values = (((codes & 8) << 28) | ((codes & 7) << 22)).view(torch.float32) * 2.0**126
    out = values * weight_scale.float().repeat_interleave(codes.shape[-1] // weight_scale.shape[-1], dim=-1)
    return out if weight_scale_2 is None else out * weight_scale_2.float()


@pytest.mark.parametrize("name", HUMMING_FORMATS)
def test_humming_tensors_decode_to_the_reference(ref, name):
    """Our bytes in the layout humming's schema reads (the codes viewed as int32 words, as
    schema/modelopt.py and schema/mxfp4.py do; scales unswizzled) decode to our reference values."""
    values, scales, exact = quantized(ref, name)
    global_scale = torch.tensor([0.5])  # not 1: a tensor scale that were dropped or divided would show
    tensors, config = gemm_peers.humming_tensors(values, scales, gemm_peers.OPERANDS[name], global_scale)
    assert tensors["weight"].data_ptr() == values.data_ptr()  # the same bytes, not a re-quantization
    if name == "nvfp4":
        assert config == {"quant_method": "modelopt", "quant_algo": "nvfp4"}
        decoded = humming_dequantize(tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"])
        assert torch.equal(decoded, exact * global_scale)
    else:
        assert config == {"quant_method": "mxfp4"} and set(tensors) == {"weight", "weight_scale"}
        decoded = humming_dequantize(tensors["weight"], tensors["weight_scale"].view(torch.float8_e8m0fnu), None)
        assert torch.equal(decoded, exact)


@pytest.mark.parametrize("name", HUMMING_FORMATS)
def test_hummings_schema_takes_our_tensors(ref, name):
    """humming's own schema on CPU: it accepts the tensors (dtypes, shapes), converts them into the
    humming weight it runs (float4e2m1 codes, per-16 E4M3 scales with a tensor scale, or per-32 E8M0
    scales), and that weight decodes to our reference values."""
    pytest.importorskip("humming", reason=f"humming-kernels is not installed ({gemm_peers.HUMMING_INSTALL})")
    from humming import dtypes
    from humming.config.enum import WeightScale2Type
    from humming.schema import BaseWeightSchema

    values, scales, exact = quantized(ref, name)
    n, k = exact.shape
    global_scale = torch.tensor([0.5])
    tensors, config = gemm_peers.humming_tensors(values, scales, gemm_peers.OPERANDS[name], global_scale)
    schema = BaseWeightSchema.from_config(dict(config))
    schema.validate_tensors(tensors, n, k, torch.bfloat16)
    # convert_humming without its CUDA device guard: the conversion HummingLayer.transform() runs first
    converted, out = schema._convert_humming(dict(tensors), [n], [k], torch.bfloat16)
    assert converted.b_dtype == dtypes.float4e2m1
    operand = gemm_peers.OPERANDS[name]
    assert converted.weight_scale_group_size == operand.group
    if name == "nvfp4":
        assert converted.bs_dtype == dtypes.float8e4m3 and converted.weight_scale_2_type == WeightScale2Type.TENSOR
        expected = exact * global_scale
    else:
        assert converted.bs_dtype == dtypes.float8e8m0 and "weight_scale_2" not in out
        expected = exact
    decoded = humming_dequantize(out["weight"], out["weight_scale"], out.get("weight_scale_2"))
    assert torch.equal(decoded, expected)


def test_humming_failure_is_kept_for_the_block(monkeypatch):
    """A weight whose humming layers could not be built records why once; every later row of its block
    gets the same error without building (JIT-compiling) again."""
    calls = []

    def failing(*args: object) -> None:
        calls.append(args)
        raise ImportError("no module named 'humming'")

    monkeypatch.setattr(gemm_peers, "humming_linear", failing)
    w = gemm_peers.Weight(None, [(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(512, dtype=torch.uint8))] * 2,
                          [], [], [])  # fmt: skip
    with pytest.raises(ImportError):
        gemm_peers.humming_layers(w, gemm_peers.OPERANDS["mxfp4"], "w4a16-mxfp4")
    with pytest.raises(RuntimeError, match="ImportError: no module named 'humming'"):
        gemm_peers.humming_layers(w, gemm_peers.OPERANDS["mxfp4"], "w4a16-mxfp4")
    assert len(calls) == 1


def test_humming_is_a_peer_of_the_w4a16_rows_only(fp4):
    """Every W4A16 row offers humming (whose build then says why it cannot run on CPU); the W4A4 and
    W8A8 rows do not list it (humming_us null without a note)."""
    m, n, k = 4, 128, 256
    for fmt in gemm_peers.DEFAULT_FORMATS:
        ours = gemm_peers.ours_for(fmt, "dense_gemm")
        a_op, b_op = gemm_peers.GEMM_OPERANDS[fmt]
        a = gemm_peers.Operands.make(fp4, torch.randn(m, k).bfloat16(), a_op, ours)
        w = gemm_peers.Weight.make(gemm_peers.Operands.make(fp4, torch.randn(n, k).bfloat16(), b_op, ours), 1)
        builders = gemm_peers.peer_fns(fmt, a, w, torch.empty(m, n, dtype=torch.bfloat16))
        assert ("humming" in builders) == (fmt in gemm_peers.W4A16_FORMATS), fmt
        if fmt in gemm_peers.W4A16_FORMATS:
            assert a.values is a.bf16 and a.scales.numel() == 0  # bf16 activations as they are
            with pytest.raises(RuntimeError, match="CUDA GPU"):
                builders["humming"]()


@requires_arch()
@pytest.mark.parametrize("name", HUMMING_FORMATS)
@pytest.mark.parametrize("m", [1, 16, 300])
def test_humming_linear_matches_the_exact_product(ref, name, m):
    """humming's W4A16 GEMM on our weight bytes against the float64 product of the exact values: a
    misread layout (nibble order, scale layout, tensor scale) is off by O(1)."""
    pytest.importorskip("humming", reason=f"humming-kernels is not installed ({gemm_peers.HUMMING_INSTALL})")
    n, k = 256, 1024
    values, scales, exact = (t.cuda() for t in quantized(ref, name, rows=n, k=k, seed=2))
    global_scale = torch.tensor([0.5], device="cuda")
    linear = gemm_peers.humming_linear(values, scales, gemm_peers.OPERANDS[name], global_scale)
    x = torch.randn(m, k, generator=torch.Generator(device="cuda").manual_seed(1), device="cuda").bfloat16()
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = linear(x, out)
    scale = 0.5 if name == "nvfp4" else 1.0
    expected = x.double() @ (exact.double() * scale).T
    assert gemm_peers.relative_error(got, expected) < 1e-2
    assert got.data_ptr() == out.data_ptr()  # written into the caller's buffer, as the grid times it


# ---- the engine's bf16 ceiling and the backend column ------------------------------------------


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.bfloat16, device="meta")


@pytest.mark.parametrize("n,k", gemm_peers.SHAPES)
def test_ceiling_call_is_served_by_the_hopper_engine(fp4, n, k):
    require_built(fp4, 90)
    for m in gemm_peers.MS:
        call = gemm_peers.ceiling_call(fp4, meta(m, k), meta(n, k), meta(m, n))
        assert gemm_peers.CEILING_BACKEND in call.backends(90), f"{m=} {n=} {k=}"


@pytest.mark.parametrize("fmt", gemm_peers.FORMATS)
def test_backend_column_shows_the_composition_from_1024_rows(fp4, fmt):
    require_built(fp4, 90)
    ours = gemm_peers.ours_for(fmt, "dense_gemm")
    for n, k in gemm_peers.SHAPES:
        got = {m: gemm_peers.dispatched_backend(fp4, fmt, ours, m, n, k, 90) for m in (16, 256, 1024, 4096)}
        w4a16 = fmt.startswith("w4a16")  # the swapped engine from 9 rows
        engine, small = ("sm90_swap_ab", "sm90_swap_ab") if w4a16 else ("sm90_engine", "skinny")
        assert got == {16: small, 256: engine, 1024: "composition", 4096: "composition"}, f"{n=} {k=}"


@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (64, 384, 256), (300, 256, 1024)])
def test_ceiling_is_the_bf16_product(fp4, m, n, k):
    if DEVICE == "cuda":  # the Hopper engine runs on sm_90 only
        require_built(fp4, 90)
        if reason := gpu_missing((90,)):
            pytest.skip(reason)
    ours = gemm_peers.ours_for("nvfp4", "dense_gemm")
    a_op, b_op = gemm_peers.GEMM_OPERANDS["nvfp4"]
    generator = torch.Generator(device=DEVICE).manual_seed(3)
    x = torch.randn(m, k, generator=generator, device=DEVICE).bfloat16()
    y = torch.randn(n, k, generator=generator, device=DEVICE).bfloat16()
    a = gemm_peers.Operands.make(fp4, x, a_op, ours)
    w = gemm_peers.Weight.make(gemm_peers.Operands.make(fp4, y, b_op, ours), l2_bytes=1)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    ceiling = gemm_peers.ceiling_fn(fp4, a, w, out, DEVICE)
    expected = a.bf16.double() @ w.q.bf16.double().T
    for _ in range(len(w.bf16)):  # every rotation copy
        out.fill_(float("nan"))
        assert gemm_peers.relative_error(ceiling(), expected) < 1e-2, f"{m=} {n=} {k=}"


# ---- the rows carry the keys and ratios the README and card read -------------------------------

PASSED = {"rel_err": 1e-3, "ok": True}
FAILED = {"rel_err": 0.5, "ok": False}


def a_row(times: dict, checks: dict, m: int = 256, n: int = 1024, k: int = 512, backend: str = "reference") -> dict:
    return gemm_peers.make_row("dense_gemm", "mxfp4", m, n, k, times, checks, {}, backend)


def test_gemm_row_ratios_skip_failed_and_missing_peers():
    times = {"ours": 10.0, "cublas_bf16": 20.0, "scaled_mm_fp8_rowwise": 5.0, "dequant_mm": 40.0,
             "triton_dequant_mm": None, "triton_dot_scaled": 30.0}  # fmt: skip
    checks = {
        "cublas_bf16": PASSED,
        "scaled_mm_fp8_rowwise": {"rel_err": 2e-2, "ok": True},
        "dequant_mm": PASSED,
        "triton_dot_scaled": FAILED,
    }
    row = a_row(times, checks)
    assert row["ratio_vs_cublas_bf16"] == 2.0 and row["ratio_vs_scaled_mm_fp8_rowwise"] == 0.5
    assert row["ratio_vs_fp8_rowwise"] == row["ratio_vs_scaled_mm_fp8_rowwise"]  # the README's short name
    assert row["ratio_vs_dequant_mm"] == 4.0
    assert row["ratio_vs_triton_dequant_mm"] is None and row["triton_dequant_mm_us"] is None
    assert row["ratio_vs_triton_dot_scaled"] is None and row["triton_dot_scaled_us"] == 30.0
    assert row["tflops"] == round(2 * 256 * 1024 * 512 / 10.0 / 1e6, 2)
    keys = {"op", "format", "M", "N", "K", "ours_backend", "ours_us", "tflops", "peer_check", "notes"}
    keys |= {f"{p}_us" for p in gemm_peers.PEERS} | {f"ratio_vs_{p}" for p in gemm_peers.PEERS}
    assert keys <= row.keys()


@pytest.mark.parametrize("check", [PASSED, FAILED, None])
def test_w4a16_row_carries_the_humming_ratio(check):
    """humming_us and ratio_vs_humming = humming's time / ours, a ratio only where humming passed its check."""
    checks = {"cublas_bf16": PASSED} | ({"humming": check} if check else {})
    times = {"ours": 20.0, "cublas_bf16": 30.0} | ({"humming": 25.0} if check else {})
    row = gemm_peers.make_row("dense_gemm", "w4a16-nvfp4", 64, 1024, 512, times, checks, {}, "sm90_engine")
    assert row["humming_us"] == (25.0 if check else None)
    assert row["ratio_vs_humming"] == (1.25 if check is PASSED else None)
    assert row["peer_check"]["humming"] == check


@pytest.mark.parametrize("failing", [None, "cublas_bf16", gemm_peers.CEILING])
def test_ceiling_ratio_needs_both_checks(failing):
    checks = {"cublas_bf16": PASSED, gemm_peers.CEILING: PASSED} | ({failing: FAILED} if failing else {})
    row = a_row({"ours": 40.0, "cublas_bf16": 27.0, gemm_peers.CEILING: 30.0}, checks)
    assert row["engine_bf16_ceiling_us"] == 30.0  # measured and shown, with or without a ratio
    expected = None if failing else 0.9  # cuBLAS time / the ceiling's
    assert row["engine_bf16_ceiling_ratio_vs_cublas_bf16"] == expected


def test_readme_table_keeps_the_excerpt_shapes(tmp_path, capsys):
    rows = [
        a_row({"ours": 10.0, "cublas_bf16": 8.0, "scaled_mm_fp8_rowwise": 5.0, gemm_peers.CEILING: 9.0},
              {"cublas_bf16": PASSED, "scaled_mm_fp8_rowwise": PASSED, gemm_peers.CEILING: PASSED},
              m=1024, n=n, k=k, backend="composition")
        for n, k in [(4096, 7168), (5120, 17408)]
    ]  # fmt: skip
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"rows": rows}))
    table = peers.main(["gemm", "--table", "--out", str(path)])
    assert table == capsys.readouterr().out
    header = table.splitlines()[0]
    assert "vs fp8 row-wise" in header and "engine bf16 us" in header and "engine bf16 vs cuBLAS bf16" in header
    assert "vs humming" in header
    assert "| mxfp4 | 1024 | 4096 | 7168 | composition | 10.0 | 6013 | 0.80 | 0.50 | - | - | - | 9.0 | 0.89 |" in table
    assert "17408" not in table  # (5120, 17408) is not an excerpt shape
    assert len(table.splitlines()) == 3


def test_quant_row_carries_the_keys_the_card_reads():
    case = suites.QuantCase("group_wise_quant", "w4a4-nvfp4", (16384, 8192), 425_000_000, print, print)
    row = suites.quant_row(case, ours_us=125.0, torch_us=5000.0)
    assert list(row) == ["op", "mode", "shape", "bytes", "us", "torch_us", "GBps", "fraction_of_copy_bw",
                         "speedup_vs_torch"]  # fmt: skip
    assert row["shape"] == [16384, 8192] and row["GBps"] == 3400.0 and row["fraction_of_copy_bw"] == 0.8
    assert row["speedup_vs_torch"] == 40.0


SUBCOMMANDS = ("gemm", "grouped", "skinny", "w4a16", "staged", "e0m3-split", "quant", "host")


@pytest.mark.parametrize("argv", [[]] + [[command] for command in SUBCOMMANDS], ids=lambda a: " ".join(a) or "-")
def test_help_runs_without_a_gpu(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        peers.main([*argv, "--help"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    assert all(command in printed for command in SUBCOMMANDS) if not argv else "--out" in printed
