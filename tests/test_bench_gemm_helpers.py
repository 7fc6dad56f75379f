"""The GEMM benchmark's peers (benchmarks/gemm_peers.py) and row bookkeeping (benchmarks/bench_gemm.py),
checked on CPU against the reference, so a broken peer never becomes a baseline.

The Triton dequantizer runs in Triton's interpreter when no GPU is present; tl.dot_scaled has no
interpreter implementation, so its kernel is only compiled ahead of time for sm_90 here (its results
are checked against ours on every row of a GPU run).
"""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch
from conftest import requires_repo_file

BENCHMARKS = requires_repo_file("benchmarks")
sys.path.insert(0, str(BENCHMARKS))
import bench_gemm  # noqa: E402
import gemm_peers as peers  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not peers.triton_available(), reason="triton is not installed")

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


@pytest.mark.parametrize("rows,nkb", [(1, 1), (130, 6), (256, 8), (300, 3)])
def test_sf_index_is_the_sfatom_offset(ref, rows, nkb):
    m = torch.arange(rows)[:, None]
    kb = torch.arange(nkb)[None, :]
    assert torch.equal(peers.sf_index(rows, nkb), ref.sf_offset(m, kb, nkb))
    plain = torch.randint(0, 255, (rows, nkb), dtype=torch.uint8)
    assert torch.equal(peers.plain_scales(ref.swizzle_scales(plain), rows, nkb), plain)


def test_decode_tables_match_the_reference(ref):
    def same(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)

    code = torch.arange(256, dtype=torch.uint8)
    same(peers.e4m3_values(), ref.decode_e4m3(code))
    same(peers.e4m3_values(), code.view(torch.float8_e4m3fn).float())  # torch's own E4M3 agrees
    nibble = torch.arange(16, dtype=torch.uint8)
    same(peers.element_table("e2m1").float(), ref.decode_e2m1(nibble))
    same(peers.element_table("e0m3").float(), ref.decode_e0m3(nibble))
    same(peers.scale_table("ue8m0").float(), ref.decode_ue8m0(code))
    same(peers.scale_table("ue4m3").float(), ref.decode_ue4m3(code))


@pytest.mark.parametrize("name", list(peers.OPERANDS))
@pytest.mark.parametrize("flat", [False, True], ids=["halops-2d", "flat"])
def test_torch_dequant_is_exact(ref, name, flat):
    values, scales, exact = quantized(ref, name)
    if flat:
        scales = scales.reshape(-1)  # the flashrt-style API's buffer
    operand = peers.OPERANDS[name]
    dequant = peers.TorchDequant.build(operand, ROWS, exact.shape[1], "cpu")
    assert torch.equal(dequant(values, scales), exact.to(torch.bfloat16))


def test_rowwise_fp8_reconstructs_within_e4m3_precision():
    x = torch.randn(5, 64) * torch.logspace(-3, 3, 5)[:, None]
    q, scale = peers.rowwise_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (5, 1)
    restored = q.float() * scale
    big = x.abs() >= x.abs().amax(dim=1, keepdim=True) * 2**-6  # normal range of the row's scale
    assert ((restored - x).abs() <= x.abs() * 2**-4)[big].all()


def test_copies_cover_l2():
    l2 = 60 * 2**20
    assert peers.copies_for(int(44.6e6), l2) == 3  # NVFP4 17408 x 5120 weight
    assert peers.copies_for(int(178e6), l2) == 2  # its bf16 form
    assert peers.copies_for(2**20, l2) == 61
    args = (torch.zeros(4), torch.ones(2))
    copies = peers.rotation_copies(args, 64)
    assert len(copies) == 1 + math.ceil(64 / 24) and copies[0] is args
    assert all(torch.equal(c[0], args[0]) and c[0].data_ptr() != args[0].data_ptr() for c in copies[1:])
    seen = []
    rotation = peers.Rotation(lambda a, b: seen.append(a.data_ptr()) or a, copies)
    for _ in range(2 * len(copies)):
        rotation()
    assert seen == [c[0].data_ptr() for c in copies] * 2


def test_row_ratios_skip_failed_and_missing_peers():
    times = {"ours": 10.0, "cublas_bf16": 20.0, "scaled_mm_fp8_rowwise": 5.0, "dequant_mm": 40.0,
             "triton_dequant_mm": None, "triton_dot_scaled": 30.0}  # fmt: skip
    checks = {
        "cublas_bf16": {"rel_err": 1e-3, "ok": True},
        "scaled_mm_fp8_rowwise": {"rel_err": 2e-2, "ok": True},
        "dequant_mm": {"rel_err": 1e-3, "ok": True},
        "triton_dot_scaled": {"rel_err": 0.5, "ok": False},
    }
    row = bench_gemm.make_row("dense_gemm", "mxfp4", 256, 1024, 512, times, checks, {}, "reference")
    assert row["ratio_vs_cublas_bf16"] == 2.0 and row["ratio_vs_scaled_mm_fp8_rowwise"] == 0.5
    assert row["ratio_vs_dequant_mm"] == 4.0
    assert row["ratio_vs_triton_dequant_mm"] is None and row["triton_dequant_mm_us"] is None
    assert row["ratio_vs_triton_dot_scaled"] is None and row["triton_dot_scaled_us"] == 30.0
    assert row["tflops"] == round(2 * 256 * 1024 * 512 / 10.0 / 1e6, 2)
    ratios = {"ratio_vs_cublas_bf16", "ratio_vs_dequant_mm", "ratio_vs_triton_dequant_mm", "ratio_vs_triton_dot_scaled"}
    keys = {"op", "format", "M", "N", "K", "ours_us", "tflops"} | ratios | {f"{p}_us" for p in bench_gemm.PEERS}
    assert keys <= row.keys()
    table = bench_gemm.markdown({"gpu": "cpu", "torch": "t", "triton": None, "date": "d", "rows": [row]})
    assert "| mxfp4 | `dense_gemm` (reference) | 256 | 1024 | 512 | 10.0 |" in table


def test_cli_grids():
    quick = bench_gemm.parse_args(["--quick"])
    assert quick.ms == list(bench_gemm.QUICK_MS) and quick.shapes == list(bench_gemm.QUICK_SHAPES)
    custom = bench_gemm.parse_args(["--ms", "1", "8", "--shapes", "256x512", "--formats", "nvfp4"])
    assert custom.ms == [1, 8] and custom.shapes == [(256, 512)] and custom.formats == ["nvfp4"]


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
    kernels = peers.triton_kernels()
    operand = peers.OPERANDS[name]
    config = peers.dot_scaled_config(4096)
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
    kernels = peers.triton_kernels()
    operand = peers.OPERANDS["nvfp4"]
    signature = {"values": "*u8", "scales": "*u8", "out": "*bf16", "rows": "i32", "k": "i32", "nkt": "i32"}
    constants = {"ELEMENT": 1, "SCALE": 1, "GROUP": operand.group, "BLOCK_ROWS": peers.DEQUANT_BLOCK_ROWS,
                 "BLOCK_K": peers.DEQUANT_BLOCK_K}  # fmt: skip
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
@pytest.mark.parametrize("name", list(peers.OPERANDS))
def test_triton_dequant_is_exact(ref, monkeypatch, name):
    module = peers if DEVICE == "cuda" else interpreted_peers(monkeypatch)
    values, scales, exact = quantized(ref, name)
    out = torch.full(exact.shape, float("nan"), dtype=torch.bfloat16, device=DEVICE)
    module.triton_dequant(values.to(DEVICE), scales.to(DEVICE), module.OPERANDS[name], out)
    assert torch.equal(out.cpu(), exact.to(torch.bfloat16))


@pytest.mark.skipif(DEVICE != "cuda" or not peers.triton_available(), reason="tl.dot_scaled needs a GPU")
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_triton_dot_scaled_matches_cublas_on_exact_operands(ref, name, m):
    k = 512  # a multiple of every configuration's BLOCK_K
    a_values, a_scales, a_exact = (t.cuda() for t in quantized(ref, name, rows=m, k=k, seed=1))
    b_values, b_scales, b_exact = (t.cuda() for t in quantized(ref, name, rows=256, k=k, seed=2))
    nkb = k // ref.FORMATS[name].group
    out = torch.empty(m, 256, dtype=torch.bfloat16, device="cuda")
    peers.triton_dot_scaled(a_values, peers.plain_scales(a_scales, m, nkb), b_values,
                            peers.plain_scales(b_scales, 256, nkb), peers.OPERANDS[name], out)  # fmt: skip
    expected = a_exact.double() @ b_exact.double().T
    assert bench_gemm.relative_error(out, expected) < 1e-2
