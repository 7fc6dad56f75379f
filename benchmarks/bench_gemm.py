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
  ours                   the package's public function named in the row's "op"

Formats: mxfp8, mxfp4, nvfp4 (dense_gemm on group_wise_quant operands, or --nvfp4-op nvfp4_gemm_bf16
on quantize_fp4_sfa_bf16 operands) and e0m3 (E0M3 weights, NVFP4 activations: e0m3_weight_gemm_fp16).

Timing: medians of triton.testing.do_bench, which clears L2 before every run; each method also cycles
through copies of its weight operands (gemm_peers.Rotation), so small-M runs stream B from HBM as
decode does. Every peer's output is compared with ours once per row ("peer_check": max |diff| /
max |ours|); a peer that fails the check, or raises (recorded in "notes"), gets no ratio.
ratio_vs_X = X's time / our time: above 1, ours is faster.

    python benchmarks/bench_gemm.py                              # full grid, a few minutes on an H200
    python benchmarks/bench_gemm.py --quick --out /tmp/gemm.json # smoke run
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
from benchmark_gemm import Ours, ours_fn, ours_for, quantize  # noqa: E402

Tensor = torch.Tensor
ROOT = Path(__file__).resolve().parent.parent

FORMATS = ("mxfp8", "mxfp4", "nvfp4", "e0m3")
MS = (1, 16, 256, 2048, 4096, 8192)
SHAPES = ((17408, 5120), (5120, 17408), (12288, 5120), (8192, 8192))
QUICK_MS, QUICK_SHAPES = (16, 256, 4096), ((17408, 5120),)
PEERS = ("cublas_bf16", "scaled_mm_fp8_rowwise", "dequant_mm", "triton_dequant_mm", "triton_dot_scaled")
# max |peer - ours| / max |ours|. The exact peers differ from ours only by fp32 summation order and the
# bf16 rounding of the output. The FP8 peer re-quantizes every element to 3 mantissa bits: 3.4-4.8% in a
# float64 emulation of these formats and K; a broken peer (a transposed or misread scale) is off by O(1).
CHECK_TOLERANCE = dict.fromkeys(PEERS, 1e-2) | {"scaled_mm_fp8_rowwise": 0.15}
DEFAULT_L2_BYTES = 60 * 2**20
PEER_NOTES = {
    "cublas_bf16": "torch.mm(A_bf16, B_bf16.T), operands dequantized exactly once outside the timing",
    "scaled_mm_fp8_rowwise": "torch._scaled_mm e4m3 x e4m3, row-wise fp32 scales, use_fast_accum="
    f"{peers.FP8_FAST_ACCUM}; operands re-quantized from the dequantized bf16 outside the timing",
    "dequant_mm": "PyTorch ops dequantize A and B (table lookup, scale gather by a precomputed index), then torch.mm",
    "triton_dequant_mm": "one Triton kernel dequantizes A then B to bf16 (SfAtom offsets in-kernel), then torch.mm",
    "triton_dot_scaled": "Triton tl.dot_scaled, plain [rows, K/g] scales, one untuned config per M range",
}


def ours_backend(fp4, fmt: str, ours: Ours, m: int, n: int, k: int) -> str | None:
    """Which backend of the package serves this GEMM here ("reference" = the PyTorch fallback), so a
    row never passes off the fallback's time as the engine's; None if the build cannot say."""
    if not torch.cuda.is_available():
        return "reference"
    a_op, b_op = peers.GEMM_OPERANDS[fmt]
    major, minor = torch.cuda.get_device_capability()
    out_format = "fp16" if ours.out_dtype == torch.float16 else "bf16"
    try:
        call = fp4._gemm.described_call(a_op.name, b_op.name, m=m, n=n, k=k, out_format=out_format)
        name = call.backend(10 * major + minor)
    except Exception:  # an older or newer build without this query: say nothing rather than guess
        return None
    return name or "reference"


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


def measure_row(fp4, fmt: str, ours: Ours, a: Operands, w: Weight, device: str) -> dict:
    m, k = a.bf16.shape
    n = w.q.bf16.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)  # shared by the peers
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
        times[name], got = None, None
        try:
            fn = build()
            got = fn()
            sync(device)
            if expected is not None:
                err = relative_error(got, expected)
                checks[name] = {"rel_err": err if math.isfinite(err) else str(err), "ok": err <= CHECK_TOLERANCE[name]}
                if not checks[name]["ok"]:
                    notes[name] = f"check failed: rel err {err:.3g} > {CHECK_TOLERANCE[name]}"
            times[name] = median_us(fn, device)
        except Exception as e:  # a peer that cannot run this case (format, OOM, compile error) is null
            notes[name] = error_text(e)
        del got
    if len(checks) > 1 and not any(c["ok"] for c in checks.values()):
        notes["ours"] = "every peer disagrees with ours: ours is the likely culprit (no ratio is reported)"
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
    """The JSON row: times in us, our TFLOP/s, and ratio_vs_X = X's time / ours (null unless X passed its check)."""
    ours_us = times.get("ours")
    row = {"op": op, "format": fmt, "M": m, "N": n, "K": k, "ours_backend": backend}
    row["ours_us"] = round(ours_us, 2) if ours_us else None
    for name in PEERS:
        row[f"{name}_us"] = round(times[name], 2) if times.get(name) else None
    row["tflops"] = round(2 * m * n * k / ours_us / 1e6, 2) if ours_us else None
    for name in PEERS:
        ok = (checks.get(name) or {}).get("ok", False)
        row[f"ratio_vs_{name}"] = round(times[name] / ours_us, 3) if ours_us and times.get(name) and ok else None
    row["peer_check"] = {name: checks.get(name) for name in PEERS}
    row["notes"] = notes
    return row


# ---- the grid -----------------------------------------------------------------------------------


def l2_bytes(device: str) -> int:
    if device != "cuda":
        return DEFAULT_L2_BYTES
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or DEFAULT_L2_BYTES


def run_grid(
    fp4,
    formats: list[str],
    ms: list[int],
    shapes: list[tuple[int, int]],
    nvfp4_op: str,
    device: str,
    save: Callable[[list[dict]], None],
) -> list[dict]:
    """Every row of the grid; `save` gets the rows so far after each (format, N, K), so a run cut short
    (device time is scarce) still leaves its measurements on disk."""
    rows = []
    cache = l2_bytes(device)
    start = time.perf_counter()
    for fmt in formats:
        ours = ours_for(fmt, nvfp4_op)
        a_op, b_op = peers.GEMM_OPERANDS[fmt]
        for n, k in shapes:
            torch.manual_seed(0)
            # weight-like B (std 0.02) and unit activations; the values only matter for the checks
            w = Weight.make(Operands.make(fp4, 0.02 * torch.randn(n, k, device=device, dtype=torch.bfloat16),
                                          b_op, ours), cache)  # fmt: skip
            for m in ms:
                a = Operands.make(fp4, torch.randn(m, k, device=device, dtype=torch.bfloat16), a_op, ours)
                row = measure_row(fp4, fmt, ours, a, w, device)
                rows.append(row)
                print(progress_line(row, time.perf_counter() - start), flush=True)
                del a
            del w
            if device == "cuda":
                torch.cuda.empty_cache()
            save(rows)
    return rows


def progress_line(row: dict, elapsed_s: float) -> str:
    def cell(name: str) -> str:
        ratio = row[f"ratio_vs_{name}"]
        return f"{name}={ratio:.2f}x" if ratio is not None else f"{name}=-"

    ours = f"{row['ours_us']:.1f} us" if row["ours_us"] else "-"
    warning = f"  OURS: {row['notes']['ours']}" if "ours" in row["notes"] else ""
    return (
        f"[{elapsed_s:6.0f} s] {row['format']:5s} M={row['M']:<5d} N={row['N']:<5d} K={row['K']:<5d} "
        f"ours {ours} ({row['ours_backend']}) " + " ".join(cell(p) for p in PEERS) + warning
    )


# ---- report -------------------------------------------------------------------------------------

TABLE_PEERS = {
    "cublas_bf16": "bf16",
    "scaled_mm_fp8_rowwise": "fp8 row",
    "dequant_mm": "deq+mm",
    "triton_dequant_mm": "triton deq+mm",
    "triton_dot_scaled": "triton dot_scaled",
}


def markdown(result: dict) -> str:
    """The README table: our time and TFLOP/s, then each peer's time / ours (>1: ours faster)."""
    lines = [
        f"{result['gpu']}, torch {result['torch']}, triton {result['triton']}, {result['date']}. "
        "x = peer time / our time (above 1: ours faster); - = not run or failed its check (see the JSON notes).",
        "",
        "| format | op | M | N | K | ours us | TFLOP/s | " + " | ".join(f"vs {v}" for v in TABLE_PEERS.values()) + " |",
        "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(TABLE_PEERS),
    ]
    for r in result["rows"]:
        ratios = [f"{r[f'ratio_vs_{p}']:.2f}" if r[f"ratio_vs_{p}"] is not None else "-" for p in TABLE_PEERS]
        ours = f"{r['ours_us']:.1f}" if r["ours_us"] is not None else "-"
        tflops = f"{r['tflops']:.1f}" if r["tflops"] is not None else "-"
        op = f"`{r['op']}`" + (" (reference)" if r["ours_backend"] == "reference" else "")
        lines.append(f"| {r['format']} | {op} | {r['M']} | {r['N']} | {r['K']} | {ours} | {tflops} | "
                     + " | ".join(ratios) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def parse_shape(text: str) -> tuple[int, int]:
    n, k = text.lower().split("x")
    return int(n), int(k)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/h200-gemm.json)")
    parser.add_argument("--quick", action="store_true", help=f"M in {QUICK_MS}, (N, K) in {QUICK_SHAPES}")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--ms", nargs="+", type=int, default=None, help=f"default {MS}")
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=None, help="NxK ... (default: the four)")
    parser.add_argument("--nvfp4-op", choices=("dense_gemm", "nvfp4_gemm_bf16"), default="dense_gemm")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: functional dry run only")
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


def write_result(out: Path, device: str, rows: list[dict], wall_s: float) -> dict:
    """The JSON result and its markdown table (same path, .md)."""
    result = {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run, times meaningless)",
        "torch": torch.__version__,
        "triton": triton_version(),
        "date": datetime.date.today().isoformat(),
        "timing": "median of triton.testing.do_bench (L2 cleared before each run); weight copies rotated",
        "l2_bytes": l2_bytes(device),
        "wall_s": round(wall_s, 1),
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
    started = time.perf_counter()

    def save(rows: list[dict]) -> dict:
        return write_result(args.out, args.device, rows, time.perf_counter() - started)

    rows = run_grid(fp4, args.formats, args.ms, args.shapes, args.nvfp4_op, args.device, save)
    result = save(rows)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
