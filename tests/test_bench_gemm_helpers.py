"""The GEMM benchmark's peers (benchmarks/gemm_peers.py) and row bookkeeping (benchmarks/bench_gemm.py),
checked on CPU against the reference, so a broken peer never becomes a baseline.

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
from conftest import requires_repo_file

BENCHMARKS = requires_repo_file("benchmarks")
sys.path.insert(0, str(BENCHMARKS))
import bench_gemm  # noqa: E402
import gemm_peers as peers  # noqa: E402
import gemm_table  # noqa: E402
import plot_gemm  # noqa: E402

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


PASSED = {"rel_err": 1e-3, "ok": True}
FAILED = {"rel_err": 0.5, "ok": False}


def a_row(times: dict, checks: dict, m: int = 256, n: int = 1024, k: int = 512, backend: str = "reference") -> dict:
    return bench_gemm.make_row("dense_gemm", "mxfp4", m, n, k, times, checks, {}, backend)


def test_row_ratios_skip_failed_and_missing_peers():
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
    assert row["ratio_vs_dequant_mm"] == 4.0
    assert row["ratio_vs_triton_dequant_mm"] is None and row["triton_dequant_mm_us"] is None
    assert row["ratio_vs_triton_dot_scaled"] is None and row["triton_dot_scaled_us"] == 30.0
    assert row["tflops"] == round(2 * 256 * 1024 * 512 / 10.0 / 1e6, 2)
    ratios = {"ratio_vs_cublas_bf16", "ratio_vs_dequant_mm", "ratio_vs_triton_dequant_mm", "ratio_vs_triton_dot_scaled"}
    keys = {"op", "format", "M", "N", "K", "ours_us", "tflops"} | ratios | {f"{p}_us" for p in bench_gemm.PEERS}
    assert keys <= row.keys()
    table = gemm_table.markdown({"gpu": "cpu", "torch": "t", "triton": None, "date": "d", "rows": [row]})
    assert "| mxfp4 | `dense_gemm` | reference | 256 | 1024 | 512 | 10.0 |" in table


def test_fp8_rowwise_ratio_is_the_scaled_mm_ratio():
    checks = {"scaled_mm_fp8_rowwise": PASSED}
    row = a_row({"ours": 10.0, "scaled_mm_fp8_rowwise": 4.0}, checks)
    assert row["ratio_vs_fp8_rowwise"] == row["ratio_vs_scaled_mm_fp8_rowwise"] == 0.4
    failed = a_row({"ours": 10.0, "scaled_mm_fp8_rowwise": 4.0}, {"scaled_mm_fp8_rowwise": FAILED})
    assert failed["ratio_vs_fp8_rowwise"] is None


def test_row_records_the_engine_bf16_ceiling_and_its_ratio_to_cublas():
    times = {"ours": 40.0, "cublas_bf16": 27.0, bench_gemm.CEILING: 30.0}
    row = a_row(times, {"cublas_bf16": PASSED, bench_gemm.CEILING: PASSED})
    assert row["engine_bf16_ceiling_us"] == 30.0
    assert row["engine_bf16_ceiling_ratio_vs_cublas_bf16"] == 0.9  # cuBLAS time / the ceiling's
    assert row["peer_check"][bench_gemm.CEILING] == PASSED


@pytest.mark.parametrize("failing", ["cublas_bf16", bench_gemm.CEILING])
def test_ceiling_ratio_needs_both_checks(failing):
    checks = {"cublas_bf16": PASSED, bench_gemm.CEILING: PASSED} | {failing: FAILED}
    row = a_row({"ours": 40.0, "cublas_bf16": 27.0, bench_gemm.CEILING: 30.0}, checks)
    assert row["engine_bf16_ceiling_ratio_vs_cublas_bf16"] is None
    assert row["engine_bf16_ceiling_us"] == 30.0  # measured, shown, but no ratio


def test_readme_table_keeps_the_excerpt_shapes_with_the_new_columns():
    rows = [
        a_row({"ours": 10.0, "cublas_bf16": 8.0, "scaled_mm_fp8_rowwise": 5.0, bench_gemm.CEILING: 9.0},
              {"cublas_bf16": PASSED, "scaled_mm_fp8_rowwise": PASSED, bench_gemm.CEILING: PASSED},
              m=1024, n=n, k=k, backend="composition")
        for n, k in [(4096, 7168), (5120, 17408)]
    ]  # fmt: skip
    table = gemm_table.readme_table({"rows": rows})
    header = table.splitlines()[0]
    assert "vs fp8 row-wise" in header and "engine bf16 us" in header and "engine bf16 vs cuBLAS bf16" in header
    assert "| mxfp4 | 1024 | 4096 | 7168 | composition | 10.0 | 6013 | 0.80 | 0.50 | - | - | 9.0 | 0.89 |" in table
    assert "17408" not in table  # (5120, 17408) is not an excerpt shape
    assert len(table.splitlines()) == 3


def test_readme_table_cli_prints_the_excerpt(tmp_path, capsys):
    row = a_row({"ours": 10.0}, {}, m=64, n=8192, k=8192, backend="sm90_engine")
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"rows": [row]}))
    printed = gemm_table.main([str(path)])
    assert printed == capsys.readouterr().out
    assert "| mxfp4 | 64 | 8192 | 8192 | sm90_engine | 10.0 |" in printed


def test_plot_titles_say_which_backend_served_which_m():
    rows = [{"M": m, "ours_backend": b} for m, b in [(1024, "composition"), (1, "skinny"), (16, "skinny"),
            (64, "sm90_engine"), (256, "sm90_engine"), (4096, "composition"), (2048, "composition")]]  # fmt: skip
    assert plot_gemm.backend_spans(rows) == "skinny 1-16, sm90_engine 64-256, composition 1k-4k"
    assert plot_gemm.backend_spans([{"M": 8, "ours_backend": None}]) == "? 8"


def test_plot_draws_the_ceiling_like_a_checked_peer():
    assert bench_gemm.CEILING in plot_gemm.METHODS
    rows = [a_row({"ours": 10.0, bench_gemm.CEILING: 8.0}, {bench_gemm.CEILING: ok}, m=m)
            for m, ok in [(64, PASSED), (256, FAILED)]]  # fmt: skip
    ms, values = plot_gemm.tflops_series(rows, bench_gemm.CEILING)
    assert ms == [64] and values == [pytest.approx(2 * 64 * 1024 * 512 / 8.0 / 1e6)]


def test_cli_grids():
    default = bench_gemm.parse_args([])
    assert {64, 1024} <= set(default.ms) and set(bench_gemm.EXPERT_SHAPES) <= set(default.shapes)
    assert set(bench_gemm.QUALIFICATION_SHAPES) <= set(default.shapes) and "e0m3" not in default.formats
    quick = bench_gemm.parse_args(["--quick"])
    assert quick.ms == list(bench_gemm.QUICK_MS) and quick.shapes == list(bench_gemm.QUICK_SHAPES)
    custom = bench_gemm.parse_args(["--ms", "1", "8", "--shapes", "256x512", "--formats", "nvfp4", "e0m3"])
    assert custom.ms == [1, 8] and custom.shapes == [(256, 512)] and custom.formats == ["nvfp4", "e0m3"]


def test_default_grid_size():
    # 3 formats x 6 shapes x 7 M, each row timing 5 peers, the ceiling and ours: the count the
    # device-time estimate in the report is made of
    args = bench_gemm.parse_args([])
    assert len(bench_gemm.blocks(args.formats, args.shapes)) * len(args.ms) == 126
    assert bench_gemm.timings_per_row() == 7


class FakeClock:
    """perf_counter for run_grid: each block takes `block_s` seconds."""

    def __init__(self, block_s: float) -> None:
        self.now, self.block_s = 0.0, block_s

    def perf_counter(self) -> float:
        return self.now

    def run_block(self, fp4, block, ms, *rest) -> list[dict]:
        self.now += self.block_s
        return [{"block": block.name(), "M": m} for m in ms]


def test_grid_starts_no_block_after_its_budget(monkeypatch):
    clock = FakeClock(block_s=10.0)
    monkeypatch.setattr(bench_gemm, "time", clock)
    monkeypatch.setattr(bench_gemm, "run_block", clock.run_block)
    saved = []
    grid = bench_gemm.blocks(["mxfp8", "nvfp4"], [(256, 512), (512, 256)])
    rows, not_run = bench_gemm.run_grid(None, grid, [1, 16], "dense_gemm", "cpu", 15.0,
                                        lambda rows, not_run: saved.append((len(rows), list(not_run))))  # fmt: skip
    # blocks start at 0 and 10 s; at 20 s the 15 s budget is spent
    assert [r["block"] for r in rows] == ["mxfp8 256x512"] * 2 + ["mxfp8 512x256"] * 2
    assert not_run == ["nvfp4 256x512", "nvfp4 512x256"]
    assert saved == [(2, []), (4, [])]


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


# ---- the engine's bf16 ceiling and the backend column ------------------------------------------


def require_hopper_code(fp4) -> None:
    if 90 not in fp4.ops.gemm_backend_archs():
        pytest.skip("this build has no sm_90 code (built with --archs)")


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.bfloat16, device="meta")


@pytest.mark.parametrize("n,k", bench_gemm.SHAPES)
def test_ceiling_call_is_served_by_the_hopper_engine(fp4, n, k):
    require_hopper_code(fp4)
    for m in bench_gemm.MS:
        call = bench_gemm.ceiling_call(fp4, meta(m, k), meta(n, k), meta(m, n))
        assert bench_gemm.CEILING_BACKEND in call.backends(90), f"{m=} {n=} {k=}"


@pytest.mark.parametrize("fmt", bench_gemm.FORMATS)
def test_backend_column_shows_the_composition_from_1024_rows(fp4, fmt):
    require_hopper_code(fp4)
    ours = bench_gemm.ours_for(fmt, "dense_gemm")
    for n, k in bench_gemm.SHAPES:
        got = {m: bench_gemm.dispatched_backend(fp4, fmt, ours, m, n, k, 90) for m in (16, 256, 1024, 4096)}
        assert got == {16: "skinny", 256: "sm90_engine", 1024: "composition", 4096: "composition"}, f"{n=} {k=}"


def bf16_operands(fp4, m: int, n: int, k: int, device: str) -> tuple[bench_gemm.Operands, bench_gemm.Weight]:
    ours = bench_gemm.ours_for("nvfp4", "dense_gemm")
    a_op, b_op = peers.GEMM_OPERANDS["nvfp4"]
    generator = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(m, k, generator=generator, device=device).bfloat16()
    y = torch.randn(n, k, generator=generator, device=device).bfloat16()
    a = bench_gemm.Operands.make(fp4, x, a_op, ours)
    return a, bench_gemm.Weight.make(bench_gemm.Operands.make(fp4, y, b_op, ours), l2_bytes=1)


@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (64, 384, 256), (300, 256, 1024)])
def test_ceiling_is_the_bf16_product(fp4, m, n, k):
    if DEVICE == "cuda":
        require_hopper_code(fp4)
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("the Hopper engine runs on sm_90 only")
    a, w = bf16_operands(fp4, m, n, k, DEVICE)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    ceiling = bench_gemm.ceiling_fn(fp4, a, w, out, DEVICE)
    expected = a.bf16.double() @ w.q.bf16.double().T
    for _ in range(len(w.bf16)):  # every rotation copy
        out.fill_(float("nan"))
        assert bench_gemm.relative_error(ceiling(), expected) < 1e-2, f"{m=} {n=} {k=}"
