"""Block-scaled GEMMs: ours against what a Hopper user has instead, in one process, on the same data.

For each format, (N, K) and M, random bf16 A [M, K] and B [N, K] are quantized with the package and
every method below multiplies those same bytes; the peers are timed first, ours last
(benchmarks/gemm_peers.py implements the peers):

  cublas_bf16            torch.mm on A and B dequantized exactly to bf16 once, outside the timing
  scaled_mm_fp8_rowwise  torch._scaled_mm on e4m3 operands with row-wise float32 scales (the dequantized
                         operands re-quantized outside the timing): another recipe, the FP8 ceiling
  dequant_mm             PyTorch ops dequantize A and B (nibbles, table lookup, scales gathered through
                         an index built beforehand), then torch.mm; all of it timed
  triton_dequant_mm      one Triton kernel dequantizes A, then B, to bf16 from the swizzled scales,
                         then torch.mm; all of it timed
  triton_dot_scaled      Triton tl.dot_scaled on plain [rows, K/g] scales (unswizzled beforehand)
  ours                   the package's public function named in the row's "op"; "ours_backend" names
                         the backend dispatch gave it (skinny, sm90_engine, composition, ...)
  engine_bf16_ceiling    not a peer: the Hopper engine (backend sm90_engine, by name) on the dequantized
                         bf16 operands, the same pipeline without any decode: what ours could reach

Formats: mxfp8, mxfp4, nvfp4 (dense_gemm on group_wise_quant operands, or --nvfp4-op nvfp4_gemm_bf16
on quantize_fp4_sfa_bf16 operands) and e0m3 (E0M3 weights, NVFP4 activations: e0m3_weight_gemm_fp16;
only with --formats, to keep the default grid inside its device time).
Shapes (N, K): four large layers and two MoE experts' (4096, 7168) and (7168, 2048); M from 1 to 4096
(8192 with --ms).

Timing: medians of triton.testing.do_bench, which clears L2 before every run; each method also cycles
through copies of its weight operands (gemm_peers.Rotation), so small-M runs stream B from HBM as
decode does. Every peer's output is compared with ours once per row ("peer_check": max |diff| /
max |ours|); a peer that fails the check, or raises (recorded in "notes"), gets no ratio.
ratio_vs_X = X's time / our time: above 1, ours is faster ("ratio_vs_fp8_rowwise" is the same number
as "ratio_vs_scaled_mm_fp8_rowwise", under its short name); engine_bf16_ceiling_ratio_vs_cublas_bf16 =
cuBLAS bf16 time / the ceiling's time.

Device time: the grid stops starting new (format, N, K) blocks after --budget-s seconds of measuring;
the blocks left out are listed in the JSON's "not_run" (null when the whole grid ran).

    python benchmarks/bench_gemm.py                              # default grid: 126 rows, 882 medians
    python benchmarks/bench_gemm.py --formats mxfp8 mxfp4 nvfp4 e0m3  # plus E0M3: 168 rows
    python benchmarks/bench_gemm.py --quick --out /tmp/gemm.json # smoke run: 24 rows
    python benchmarks/gemm_table.py                              # the README excerpt of the result
    python benchmarks/plot_gemm.py                               # its plot (.png beside the JSON)
    python benchmarks/bench_gemm.py --device cpu --ms 16 --shapes 256x512 --out /tmp/cpu.json
        # a functional dry run without a GPU (Triton interpreted, timings meaningless)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings, however this file is loaded
import gemm_peers as peers  # noqa: E402
from benchmark import Ours, ours_fn, ours_for, quantize  # noqa: E402
from gemm_table import markdown, parse_shape  # noqa: E402

Tensor = torch.Tensor
ROOT = Path(__file__).resolve().parent.parent

FORMATS = ("mxfp8", "mxfp4", "nvfp4", "e0m3")
DEFAULT_FORMATS = ("mxfp8", "mxfp4", "nvfp4")
MS = (1, 16, 64, 256, 1024, 2048, 4096)
QUALIFICATION_SHAPES = ((17408, 5120), (5120, 17408), (12288, 5120), (8192, 8192))
EXPERT_SHAPES = ((4096, 7168), (7168, 2048))
SHAPES = QUALIFICATION_SHAPES + EXPERT_SHAPES
QUICK_MS, QUICK_SHAPES = (16, 256, 1024, 4096), ((17408, 5120), (4096, 7168))
DEFAULT_BUDGET_S = 220.0
PEERS = ("cublas_bf16", "scaled_mm_fp8_rowwise", "dequant_mm", "triton_dequant_mm", "triton_dot_scaled")
# max |peer - ours| / max |ours|. The exact peers differ from ours only by fp32 summation order and the
# bf16 rounding of the output. The FP8 peer re-quantizes every element to 3 mantissa bits: 3.4-4.8% in a
# float64 emulation of these formats and K; a broken peer (a transposed or misread scale) is off by O(1).
CHECK_TOLERANCE = dict.fromkeys(PEERS, 1e-2) | {"scaled_mm_fp8_rowwise": 0.15}
CEILING = "engine_bf16_ceiling"
CEILING_BACKEND = "sm90_engine"
CEILING_TOLERANCE = 1e-2  # exact operands, as cublas_bf16
DEFAULT_L2_BYTES = 60 * 2**20
PEER_NOTES = {
    "cublas_bf16": "torch.mm(A_bf16, B_bf16.T), operands dequantized exactly once outside the timing",
    "scaled_mm_fp8_rowwise": "torch._scaled_mm e4m3 x e4m3, row-wise fp32 scales, use_fast_accum="
    f"{peers.FP8_FAST_ACCUM}; operands re-quantized from the dequantized bf16 outside the timing",
    "dequant_mm": "PyTorch ops dequantize A and B (table lookup, scale gather by a precomputed index), then torch.mm",
    "triton_dequant_mm": "one Triton kernel dequantizes A then B to bf16 (SfAtom offsets in-kernel), then torch.mm",
    "triton_dot_scaled": "Triton tl.dot_scaled, plain [rows, K/g] scales, one untuned config per M range",
    CEILING: "not a peer: GemmCall(A_bf16, B_bf16, formats bf16 x bf16).run_on('sm90_engine') on the "
    "operands dequantized exactly once outside the timing: the Hopper engine's pipeline without a decode",
}


def dispatched_backend(fp4, fmt: str, ours: Ours, m: int, n: int, k: int, cc: int) -> str | None:
    """The backend dispatch gives our call of this shape on compute capability cc ("reference" = the
    PyTorch fallback): a host-side query, answered without a GPU; None if the build cannot say."""
    a_op, b_op = peers.GEMM_OPERANDS[fmt]
    out_format = "fp16" if ours.out_dtype == torch.float16 else "bf16"
    alpha = ours.op == "dense_gemm" and fmt == "nvfp4"  # ours_fn passes dense_gemm's NVFP4 alpha tensor
    try:
        call = fp4._gemm.described_call(a_op.name, b_op.name, m=m, n=n, k=k, alpha=alpha, out_format=out_format)
        name = call.backend(cc)
    except Exception:  # an older or newer build without this query: say nothing rather than guess
        return None
    return name or "reference"


def ours_backend(fp4, fmt: str, ours: Ours, m: int, n: int, k: int) -> str | None:
    """Which backend serves this GEMM here, so a row never passes off the fallback's time as the engine's
    and the composition's rows (dense, from M = 768 or 1024 by format on sm_90) show as such."""
    if not torch.cuda.is_available():
        return "reference"
    major, minor = torch.cuda.get_device_capability()
    return dispatched_backend(fp4, fmt, ours, m, n, k, 10 * major + minor)


# ---- operands -----------------------------------------------------------------------------------


@dataclass
class Operands:
    """One matrix quantized by the package, and what the peers derive from it outside the timing."""

    operand: peers.Operand
    values: Tensor
    scales: Tensor  # swizzled, in the shape the package returned
    bf16: Tensor  # exactly dequantized (the package's reference)
    plain: Tensor  # uint8 [rows, K/g] for tl.dot_scaled
    fp8: tuple[Tensor, Tensor]  # row-wise e4m3 values and float32 [rows, 1] scales of bf16

    @classmethod
    def make(cls, fp4, x: Tensor, operand: peers.Operand, ours: Ours) -> Operands:
        values, scales = quantize(fp4, x, operand, ours)
        rows, k = x.shape
        fmt = fp4.reference.FORMATS[operand.name]
        bf16 = fp4.reference.dequantize(values, scales, fmt).to(torch.bfloat16)
        return cls(operand, values, scales, bf16, peers.plain_scales(scales, rows, k // operand.group),
                   peers.rowwise_fp8(bf16))  # fmt: skip


@dataclass
class Weight:
    """B in each form a method consumes, with its rotation copies: built once per format and shape."""

    q: Operands
    packed: list[tuple[Tensor, ...]]  # (values, swizzled scales): ours, dequant_mm, triton_dequant_mm
    bf16: list[tuple[Tensor, ...]]  # cublas_bf16
    fp8: list[tuple[Tensor, ...]]  # scaled_mm_fp8_rowwise
    plain: list[tuple[Tensor, ...]]  # triton_dot_scaled

    @classmethod
    def make(cls, q: Operands, l2_bytes: int) -> Weight:
        return cls(
            q,
            peers.rotation_copies((q.values, q.scales), l2_bytes),
            peers.rotation_copies((q.bf16,), l2_bytes),
            peers.rotation_copies(q.fp8, l2_bytes),
            peers.rotation_copies((q.values, q.plain), l2_bytes),
        )


# ---- one row ------------------------------------------------------------------------------------


def peer_fns(fmt: str, a: Operands, w: Weight, out: Tensor) -> dict[str, Callable[[], Callable[[], Tensor]]]:
    """Per peer, a builder of its timed callable (building may raise: the peer is then recorded null)."""
    a_op, b_op = peers.GEMM_OPERANDS[fmt]
    m, k = a.bf16.shape
    n = w.q.bf16.shape[0]
    device = a.bf16.device

    def cublas() -> Callable[[], Tensor]:
        return peers.Rotation(lambda b: peers.mm_bt(a.bf16, b, out), w.bf16)

    def fp8() -> Callable[[], Tensor]:
        return peers.Rotation(lambda b, bs: peers.scaled_mm_rowwise(*a.fp8, b, bs), w.fp8)

    def dequant_mm() -> Callable[[], Tensor]:
        deq_a = peers.TorchDequant.build(a_op, m, k, device)
        deq_b = peers.TorchDequant.build(b_op, n, k, device)
        return peers.Rotation(lambda b, sfb: peers.mm_bt(deq_a(a.values, a.scales), deq_b(b, sfb), out), w.packed)

    def triton_dequant_mm() -> Callable[[], Tensor]:
        a_bf16 = torch.empty(m, k, dtype=torch.bfloat16, device=device)
        b_bf16 = torch.empty(n, k, dtype=torch.bfloat16, device=device)

        def run(b: Tensor, sfb: Tensor) -> Tensor:
            peers.triton_dequant(a.values, a.scales, a_op, a_bf16)
            return peers.mm_bt(a_bf16, peers.triton_dequant(b, sfb, b_op, b_bf16), out)

        return peers.Rotation(run, w.packed)

    def dot_scaled() -> Callable[[], Tensor]:
        if a_op != b_op:
            raise NotImplementedError(f"tl.dot_scaled has no {b_op.element} format")
        return peers.Rotation(lambda b, bs: peers.triton_dot_scaled(a.values, a.plain, b, bs, b_op, out), w.plain)

    builders = (cublas, fp8, dequant_mm, triton_dequant_mm, dot_scaled)
    return dict(zip(PEERS, builders, strict=True))


def ceiling_call(fp4, a_bf16: Tensor, b_bf16: Tensor, out: Tensor) -> tuple:
    """The `gemm` op's call (an fp4._gemm.GemmCall) of a plain bf16 GEMM out = A_bf16 @ B_bf16^T."""
    no_scales = torch.empty(0, dtype=torch.uint8, device=a_bf16.device)
    return fp4._gemm.GemmCall(a_bf16, b_bf16, None, no_scales, "bf16", "bf16", out=out)


def ceiling_fn(fp4, a: Operands, w: Weight, out: Tensor, device: str) -> Callable[[], Tensor]:
    """The engine's bf16 ceiling on this row's operands, B's bf16 copies rotated as for cublas_bf16.

    On the GPU the engine runs by name (GemmCall.run_on), wherever dispatch would send the call; the CPU
    dry run has no engine, so there the op's dispatch (the reference) runs it."""
    calls = [(ceiling_call(fp4, a.bf16, b, out),) for (b,) in w.bf16]

    def run(call) -> Tensor:
        if device == "cuda":
            call.run_on(CEILING_BACKEND)
        else:
            call.run()
        return out

    return peers.Rotation(run, calls)


def relative_error(out: Tensor, expected: Tensor) -> float:
    """max |out - expected| / max |expected| in float32 (NaN anywhere gives NaN: a failed check)."""
    diff = (out.float() - expected.float()).abs().max()
    return float(diff / expected.float().abs().max().clamp(min=1e-30))


def error_text(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:300]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_us(fn: Callable[[], object], device: str) -> float:
    """Median time of fn in microseconds.

    CUDA: triton.testing.do_bench (L2 cleared before each run), with warm-up and repetition windows
    scaled to one run's time so that big shapes take a few runs and small ones a hundred: the full grid
    must fit a few minutes. CPU (the dry run): a handful of wall-clock runs.
    """
    if device != "cuda":
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e6 * sorted(times)[1]
    import triton.testing

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    once_ms = start.elapsed_time(end)
    warmup, rep = min(max(3 * once_ms, 1.0), 25.0), min(max(30 * once_ms, 10.0), 100.0)
    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def measure_checked(
    name: str,
    build: Callable[[], Callable[[], Tensor]],
    tolerance: float,
    expected: Tensor | None,
    device: str,
    times: dict[str, float | None],
    checks: dict[str, dict],
    notes: dict[str, str],
) -> None:
    """One method's output checked against ours, then its median time; a method that cannot run this
    case (format, OOM, compile error) is recorded null with the reason in notes."""
    times[name], got = None, None
    try:
        fn = build()
        got = fn()
        sync(device)
        if expected is not None:
            err = relative_error(got, expected)
            checks[name] = {"rel_err": err if math.isfinite(err) else str(err), "ok": err <= tolerance}
            if not checks[name]["ok"]:
                notes[name] = f"check failed: rel err {err:.3g} > {tolerance}"
        times[name] = median_us(fn, device)
    except Exception as e:
        notes[name] = error_text(e)
    del got


def measure_row(fp4, fmt: str, ours: Ours, a: Operands, w: Weight, device: str) -> dict:
    m, k = a.bf16.shape
    n = w.q.bf16.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)  # shared by the peers and the ceiling
    ours_out = torch.empty(m, n, dtype=ours.out_dtype, device=device)
    ours_call = peers.Rotation(ours_fn(fp4, ours, fmt, a.values, a.scales, ours_out), w.packed)
    times: dict[str, float | None] = {}
    checks: dict[str, dict] = {}
    notes: dict[str, str] = {}
    try:
        expected = ours_call().clone()  # untimed: the output every peer is checked against
        sync(device)
    except Exception as e:
        expected, notes["ours"] = None, error_text(e)
    for name, build in peer_fns(fmt, a, w, out).items():
        measure_checked(name, build, CHECK_TOLERANCE[name], expected, device, times, checks, notes)
    if len(checks) > 1 and not any(c["ok"] for c in checks.values()):
        notes["ours"] = "every peer disagrees with ours: ours is the likely culprit (no ratio is reported)"
    measure_checked(CEILING, lambda: ceiling_fn(fp4, a, w, out, device), CEILING_TOLERANCE, expected, device,
                    times, checks, notes)  # fmt: skip
    times["ours"] = median_us(ours_call, device) if expected is not None else None
    return make_row(ours.op, fmt, m, n, k, times, checks, notes, ours_backend(fp4, fmt, ours, m, n, k))


def make_row(
    op: str,
    fmt: str,
    m: int,
    n: int,
    k: int,
    times: dict[str, float | None],
    checks: dict[str, dict],
    notes: dict[str, str],
    backend: str | None,
) -> dict:
    """The JSON row: times in us, our TFLOP/s, ratio_vs_X = X's time / ours, and the engine's bf16 ceiling
    with its ratio to cuBLAS bf16 (a ratio is null unless the methods in it passed their checks)."""
    ours_us = times.get("ours")
    row = {"op": op, "format": fmt, "M": m, "N": n, "K": k, "ours_backend": backend}
    row["ours_us"] = round(ours_us, 2) if ours_us else None
    for name in PEERS:
        row[f"{name}_us"] = round(times[name], 2) if times.get(name) else None
    row["tflops"] = round(2 * m * n * k / ours_us / 1e6, 2) if ours_us else None
    for name in PEERS:
        row[f"ratio_vs_{name}"] = ratio(times, checks, name, ours_us)
    row["ratio_vs_fp8_rowwise"] = row["ratio_vs_scaled_mm_fp8_rowwise"]
    ceiling_us = times.get(CEILING) if passed(checks, CEILING) else None
    row[f"{CEILING}_us"] = round(times[CEILING], 2) if times.get(CEILING) else None
    row[f"{CEILING}_ratio_vs_cublas_bf16"] = ratio(times, checks, "cublas_bf16", ceiling_us)
    row["peer_check"] = {name: checks.get(name) for name in (*PEERS, CEILING)}
    row["notes"] = notes
    return row


def passed(checks: dict[str, dict], name: str) -> bool:
    return (checks.get(name) or {}).get("ok", False)


def ratio(times: dict[str, float | None], checks: dict[str, dict], name: str, base_us: float | None) -> float | None:
    """name's time / base_us, rounded; null without both times or when name failed (or skipped) its check."""
    if not base_us or not times.get(name) or not passed(checks, name):
        return None
    return round(times[name] / base_us, 3)


# ---- the grid -----------------------------------------------------------------------------------


def l2_bytes(device: str) -> int:
    if device != "cuda":
        return DEFAULT_L2_BYTES
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or DEFAULT_L2_BYTES


@dataclass(frozen=True)
class Block:
    """The rows that share one quantized weight: a format and (N, K), every M."""

    fmt: str
    n: int
    k: int

    def name(self) -> str:
        return f"{self.fmt} {self.n}x{self.k}"


def blocks(formats: list[str], shapes: list[tuple[int, int]]) -> list[Block]:
    return [Block(fmt, n, k) for fmt in formats for n, k in shapes]


def timings_per_row() -> int:
    """Medians measured per row: every peer, the engine's bf16 ceiling and ours."""
    return len(PEERS) + 2


def run_block(fp4, block: Block, ms: list[int], nvfp4_op: str, device: str, cache: int, start: float) -> list[dict]:
    ours = ours_for(block.fmt, nvfp4_op)
    a_op, b_op = peers.GEMM_OPERANDS[block.fmt]
    torch.manual_seed(0)
    # weight-like B (std 0.02) and unit activations; the values only matter for the checks
    b = 0.02 * torch.randn(block.n, block.k, device=device, dtype=torch.bfloat16)
    w = Weight.make(Operands.make(fp4, b, b_op, ours), cache)
    rows = []
    for m in ms:
        a = Operands.make(fp4, torch.randn(m, block.k, device=device, dtype=torch.bfloat16), a_op, ours)
        rows.append(measure_row(fp4, block.fmt, ours, a, w, device))
        print(progress_line(rows[-1], time.perf_counter() - start), flush=True)
        del a
    return rows


def run_grid(
    fp4,
    grid: list[Block],
    ms: list[int],
    nvfp4_op: str,
    device: str,
    budget_s: float,
    save: Callable[[list[dict], list[str]], None],
) -> tuple[list[dict], list[str]]:
    """(rows, names of the blocks not run). No block starts after budget_s seconds (device time is
    scarce); `save` gets the rows so far after each block, so a run cut short still leaves its
    measurements on disk."""
    rows: list[dict] = []
    not_run: list[str] = []
    cache = l2_bytes(device)
    start = time.perf_counter()
    for block in grid:
        if time.perf_counter() - start > budget_s:
            not_run.append(block.name())
            continue
        rows += run_block(fp4, block, ms, nvfp4_op, device, cache, start)
        if device == "cuda":
            torch.cuda.empty_cache()
        save(rows, not_run)
    if not_run:
        print(f"budget of {budget_s:.0f} s spent: not run {', '.join(not_run)}", flush=True)
    return rows, not_run


def progress_line(row: dict, elapsed_s: float) -> str:
    def cell(name: str, key: str) -> str:
        value = row[key]
        return f"{name}={value:.2f}x" if value is not None else f"{name}=-"

    ours = f"{row['ours_us']:.1f} us" if row["ours_us"] else "-"
    warning = f"  OURS: {row['notes']['ours']}" if "ours" in row["notes"] else ""
    ratios = [cell(p, f"ratio_vs_{p}") for p in PEERS] + [cell(f"{CEILING}/cublas", f"{CEILING}_ratio_vs_cublas_bf16")]
    return (
        f"[{elapsed_s:6.0f} s] {row['format']:5s} M={row['M']:<5d} N={row['N']:<5d} K={row['K']:<5d} "
        f"ours {ours} ({row['ours_backend']}) " + " ".join(ratios) + warning
    )


# ---- report -------------------------------------------------------------------------------------


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/h200-gemm.json)")
    parser.add_argument("--quick", action="store_true", help=f"M in {QUICK_MS}, (N, K) in {QUICK_SHAPES}")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(DEFAULT_FORMATS))
    parser.add_argument("--ms", nargs="+", type=int, default=None, help=f"default {MS}")
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=None, help="NxK ... (default: the six)")
    parser.add_argument("--nvfp4-op", choices=("dense_gemm", "nvfp4_gemm_bf16"), default="dense_gemm")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: functional dry run only")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="start no (format, N, K) block after this many seconds of measuring")  # fmt: skip
    args = parser.parse_args(argv)
    args.ms = args.ms or list(QUICK_MS if args.quick else MS)
    args.shapes = args.shapes or list(QUICK_SHAPES if args.quick else SHAPES)
    if args.out is None:
        name = "h200-gemm.json" if args.device == "cuda" else "cpu-dryrun-gemm.json"
        args.out = ROOT / "benchmarks" / "results" / name
    return args


def load(device: str) -> object:
    from kernels import get_local_kernel

    if device == "cpu":
        # no GPU: run the Triton peers in Triton's interpreter (read when gemm_peers jits them)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return get_local_kernel(ROOT)


def write_result(out: Path, device: str, rows: list[dict], not_run: list[str], wall_s: float) -> dict:
    """The JSON result and its markdown table (same path, .md)."""
    result = {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run, times meaningless)",
        "torch": torch.__version__,
        "triton": triton_version(),
        "date": datetime.date.today().isoformat(),
        "timing": "median of triton.testing.do_bench (L2 cleared before each run); weight copies rotated",
        "l2_bytes": l2_bytes(device),
        "wall_s": round(wall_s, 1),
        "not_run": not_run or None,
        "peers": PEER_NOTES,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    fp4 = load(args.device)
    grid = blocks(args.formats, args.shapes)
    rows_planned = len(grid) * len(args.ms)
    print(f"{rows_planned} rows, {rows_planned * timings_per_row()} medians, budget {args.budget_s:.0f} s", flush=True)
    started = time.perf_counter()

    def save(rows: list[dict], not_run: list[str]) -> dict:
        return write_result(args.out, args.device, rows, not_run, time.perf_counter() - started)

    result = save(*run_grid(fp4, grid, args.ms, args.nvfp4_op, args.device, args.budget_s, save))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
