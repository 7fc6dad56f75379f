"""Side-by-side measurements of the package against what a user runs instead: the one entry point of every
number the docs cite. Same process, same inputs, peers first and ours last, medians of CUDA-event timings
(triton.testing.do_bench), weights rotated past L2 where a run is memory-bound (docs/PERFORMANCE.md, "How
to measure"). Each subcommand writes one JSON under benchmarks/results/ (--out to change it):

    python benchmarks/peers.py gemm        # dense GEMMs against six peers: h200-gemm.json and .md
    python benchmarks/peers.py grouped     # MoE grouped GEMMs: h200-gemm-grouped.json
    python benchmarks/peers.py skinny      # M <= 16 decode GEMMs: h200-gemm-skinny.json
    python benchmarks/peers.py w4a16       # W4A16 above the decode rows: h200-gemm-w4a16.json
    python benchmarks/peers.py stream      # decode layers back to back in a CUDA graph: h200-gemm-stream.json
    python benchmarks/peers.py staged      # NVFP4-output and GeGLU GEMMs: h200-gemm-staged.json
    python benchmarks/peers.py e0m3-split  # the E0M3 split backend: h200-gemm-e0m3-split.json
    python benchmarks/peers.py quant       # quantizers and MoE data movement: h200-quant.json
    python benchmarks/peers.py host        # host cost per call: h200-host-overhead.json
    python benchmarks/peers.py gemm --table [--all]  # README excerpt (every row) of the result at --out
    python benchmarks/peers.py gemm --plot           # its plot, .png beside the JSON (also grouped, skinny)

`python benchmarks/peers.py <subcommand> --help` says what each one measures and what its rows hold. The
peers and the dense GEMM grid are in gemm_peers.py, the other side-by-side measurements in suites.py; this
file loads the package, writes the results, measures host cost and renders the tables and plots. The
workloads of `kernels benchmark` are benchmark.py and benchmark_quantize.py.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings, however this file is loaded
import gemm_peers as grid  # noqa: E402
import suites  # noqa: E402

Tensor = torch.Tensor
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def load(device: str = "cuda") -> object:
    """The package: the local build (build/), or the Hub's with LOCAL_KERNELS set (kernels' override).
    On "cpu" (the GEMM dry run) the Triton peers run in Triton's interpreter."""
    from kernels import get_kernel, get_local_kernel

    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when gemm_peers jits its kernels
    if "LOCAL_KERNELS" in os.environ:
        return get_kernel("org/fp4-gemm", version=1, trust_remote_code=True)
    return get_local_kernel(ROOT)


def write_results(path: Path, rows: list, gpu: str | None = None, **extra: object) -> dict:
    """{"gpu": <this GPU's name>, **extra, "rows": rows} as indented JSON; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"gpu": gpu or torch.cuda.get_device_name(), **extra, "rows": rows}
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


# ---- the measurements (their docstrings are their --help) ---------------------------------------


def gemm(args: argparse.Namespace) -> dict:
    """Dense block-scaled GEMMs against six peers and the engine's bf16 ceiling.

    Ours against what a Hopper user has instead, in one process, on the same data.

    For each format, (N, K) and M, random bf16 A [M, K] and B [N, K] are quantized with the package and
    every method multiplies those same bytes; the peers are timed first, ours last:

      cublas_bf16            torch.mm on A and B dequantized exactly to bf16 once, outside the timing
      scaled_mm_fp8_rowwise  torch._scaled_mm on e4m3 operands with row-wise float32 scales (re-quantized
                             outside the timing): another recipe, the FP8 ceiling
      dequant_mm             PyTorch ops dequantize A (unless bf16) and B, then torch.mm; all of it timed
      triton_dequant_mm      one Triton kernel dequantizes A (unless bf16), then B, then torch.mm; all timed
      triton_dot_scaled      Triton tl.dot_scaled on plain [rows, K/g] scales (unswizzled beforehand)
      humming                W4A16 rows: humming-kernels' W4A16 GEMM, a HummingLayer loaded with the same
                             weight bytes (ModelOpt NVFP4 / MXFP4 layout) and transformed once; offline
                             install: python -m pip install --no-index --find-links .whl/humming humming-kernels
      ours                   the public function in the row's "op"; "ours_backend" names the backend
      engine_bf16_ceiling    not a peer: the Hopper engine by name on the dequantized bf16 operands, the
                             same pipeline without any decode: what ours could reach

    Formats: mxfp8, mxfp4, nvfp4 (dense_gemm on group_wise_quant operands, or --nvfp4-op nvfp4_gemm_bf16),
    w4a16-nvfp4 and w4a16-mxfp4 (bf16 activations as they are, dense_gemm's W4A16 modes; --w4a16 runs only
    these) and e0m3 (e0m3_weight_gemm_fp16; only with --formats). Shapes (N, K): four large layers and two MoE
    experts'. Timing: do_bench medians; each method cycles through copies of its weight operands, so
    small-M runs stream B from HBM. Every peer's output is checked against ours once per row
    ("peer_check": max |diff| / max |ours|); a peer that fails the check, or raises ("notes"), gets no
    ratio; humming runs on the W4A16 rows only (elsewhere null, without a note). ratio_vs_X = X's time /
    ours (above 1: ours faster); ratio_vs_fp8_rowwise is
    ratio_vs_scaled_mm_fp8_rowwise under its short name. No (format, N, K) block starts after --budget-s
    seconds; the blocks left out are the JSON's "not_run". --device cpu is a functional dry run (Triton
    interpreted, timings meaningless). Also writes the result's table (.md beside the JSON).
    """
    fp4 = load(args.device)
    blocks = [grid.Block(fmt, n, k) for fmt in args.formats for n, k in args.shapes]
    planned = len(blocks) * len(args.ms)
    print(f"{planned} rows, {planned * (len(grid.PEERS) + 2)} medians, budget {args.budget_s:.0f} s", flush=True)
    started = time.perf_counter()

    def save(rows: list[dict], not_run: list[str]) -> dict:
        result = write_results(
            args.out, rows, None if args.device == "cuda" else "cpu (dry run, times meaningless)",
            torch=torch.__version__, triton=grid.triton_version(), date=datetime.date.today().isoformat(),
            timing="median of triton.testing.do_bench (L2 cleared before each run); weight copies rotated",
            l2_bytes=grid.l2_bytes(args.device), wall_s=round(time.perf_counter() - started, 1),
            not_run=not_run or None, peers=grid.PEER_NOTES,
        )  # fmt: skip
        args.out.with_suffix(".md").write_text(gemm_markdown(result))
        return result

    result = save(*grid.run_grid(fp4, blocks, args.ms, args.nvfp4_op, args.device, args.budget_s, save))
    print(gemm_markdown(result))
    return result


def grouped(args: argparse.Namespace) -> dict:
    """MoE grouped GEMMs against torch._grouped_mm, torch._scaled_grouped_mm, bmm and serial dense calls.

    Ours (batch_gemm, group_masked_gemm, group_contiguous_gemm) against what a Hopper user runs instead, in
    one process, on the same shapes.

    For each case (E experts x rows per expert, or a skewed routing) and (N, K), random bf16 activations
    [E * rows, K] and weights [E, N, K] are made once; ours quantizes them with group_wise_quant (mode of
    the row's format), the peers use them as they are:

      torch_grouped_mm_bf16         torch._grouped_mm on the bf16 activations and weights, offs = row ends
      torch_scaled_grouped_mm_fp8   torch._scaled_grouped_mm, e4m3 with row-wise float32 scales
                                    (re-quantized outside the timing): another recipe, the FP8 ceiling
      cublas_bf16_bmm               torch.bmm on [E, rows, K] x [E, K, N] (balanced cases)
      dense_engine                  our dense_gemm on one group's shape, times E (skewed: the sum over the
                                    groups' shapes): E serial dense calls
      ours                          the grouped function of the row's "op"

    Timing: do_bench medians; every weight set is larger than L2. ratio_vs_X = X's time / ours. A peer
    that raises is recorded in "notes" and gets no ratio. The last row times the MoE layer of
    tests/test_gemm_grouped.py (permute -> group_masked_gemm -> fused_swiglu_quant -> group_masked_gemm,
    MXFP8) against the same layer in bf16 with torch._grouped_mm.
    """
    fp4 = load()
    cases = suites.GROUPED_QUICK_CASES if args.quick else suites.GROUPED_CASES
    rows = suites.grouped_rows(fp4, cases, args.formats.split(","))
    rows.append(suites.moe_layer_row(fp4))
    return write_results(args.out, rows)


def skinny(args: argparse.Namespace) -> dict:
    """Decode and speculative-verify GEMMs (M <= 16 rows) against cuBLAS bf16 and torch._grouped_mm bf16.

    M <= 16 rows, per group for the grouped ones: ours against cuBLAS bf16 on the dequantized weight and
    torch._grouped_mm bf16, in one process, the peer first.

    Dense rows: for each format, (N, K) and M, random bf16 activations [M, K] and weights [N, K]; the
    W4A4/W8A8 formats quantize both with group_wise_quant, the W4A16 ones ("w4a16-nvfp4", "w4a16-mxfp4")
    only the weight and run the `gemm` op with bf16 activations. cuBLAS multiplies the exactly dequantized
    bf16 operands. Both cycle through copies of their weight worth more than twice the L2, and do_bench
    clears the L2 before every run: each run streams the weight from HBM, as decode does. Grouped rows: E
    experts x R rows each (group_masked_gemm; W4A16 by the gemm op), (N, K) = (4096, 7168), against
    torch._grouped_mm on the bf16 weights with the same row offsets.

    Per row: bytes = the (active) weights' values and scales + the activations' values and scales + the
    bf16 output; GBps = bytes / ours_us; copy_bw = a 1 GiB device-to-device copy measured at the start
    (bytes read + written, GB/s); fraction_of_copy_bw = GBps / copy_bw; target_us = 1.25 * bytes /
    copy_bw; ratio_vs_cublas_bf16 = cuBLAS time / ours; check = max |ours - peer| / max |peer|. --sweep
    also times the kernel's knobs (warps, stages) on a few shapes, written to --sweep-out.
    """
    fp4 = load()
    torch.manual_seed(0)
    copy_bw = suites.copy_bandwidth_gbps()
    print(f"device-to-device copy: {copy_bw:.0f} GB/s", flush=True)
    if args.sweep:
        write_results(args.sweep_out, suites.sweep_rows(fp4, copy_bw), copy_bw_GBps=round(copy_bw, 1))
    rows = []
    for n, k in suites.SKINNY_SHAPES[args.shapes]:
        rows += suites.decode_rows(fp4, n, k, copy_bw)
        torch.cuda.empty_cache()
    if args.grouped:
        rows += suites.grouped_decode_rows(fp4, copy_bw)
    return write_results(args.out, rows, copy_bw_GBps=round(copy_bw, 1))


def stream(args: argparse.Namespace) -> dict:
    """Decode layers back to back in a CUDA graph, weights rotated past L2: how a model's decode step runs.

    For the grid's weights of at least 30 MB, M = 1 and 16 and each format of `skinny`: our public function
    (dense_gemm, its default launch options, PDL included) on each copy of its weight in turn (together more
    than twice the L2), the sequence captured four times in one CUDA graph and replayed; the same for
    cuBLAS bf16 on the exactly dequantized copies. Per call: the median replay over the calls. Columns as
    `skinny`'s: fraction_of_copy_bw is what a layer streams its weight at, back to back.
    """
    fp4 = load()
    torch.manual_seed(0)
    copy_bw = suites.copy_bandwidth_gbps()
    print(f"device-to-device copy: {copy_bw:.0f} GB/s", flush=True)
    rows = []
    for n, k in suites.STREAM_SHAPES:
        rows += suites.stream_rows(fp4, n, k, copy_bw)
        torch.cuda.empty_cache()
    return write_results(args.out, rows, copy_bw_GBps=round(copy_bw, 1))


def w4a16(args: argparse.Namespace) -> dict:
    """W4A16 above the decode rows (M = 32 .. 4096) against cuBLAS bf16.

    bf16 activations x a 4-bit weight (dense_gemm's w4a16-nvfp4 and w4a16-mxfp4 modes, default dispatch)
    against cuBLAS bf16 on the weight's exact bf16 values, in one process on the same data. Weights rotate
    through copies worth twice the L2. Each row names the backend dispatch gave the call, so a row never
    passes one backend's time off as another's.
    """
    fp4 = load()
    torch.manual_seed(0)
    return write_results(args.out, suites.w4a16_rows(fp4))


def staged(args: argparse.Namespace) -> dict:
    """NVFP4-output and GeGLU GEMMs against the same GEMM with a bf16 output and against the reference.

    The staged backend (csrc/gemm/composed/staged.cu): what staging costs over the same GEMM with a bf16 output,
    and the speed-up over the reference these functions ran before (float64 math with PyTorch ops on the
    GPU). The reference first, then ours.
    """
    fp4 = load()
    torch.manual_seed(0)
    return write_results(args.out, suites.staged_rows(fp4))


def e0m3_split(args: argparse.Namespace) -> dict:
    """The E0M3 split backend against the Hopper engine.

    The split backend (csrc/gemm/composed/e0m3_split.cu), run by name: what splitting each E0M3 integer into two
    E2M1 values costs against the Hopper engine, which reads E0M3 itself, and how much of it is the NVFP4
    GEMM over K' (the same GEMM alone, on operands split once; the difference is the split kernels plus
    the spread between two separately timed medians). The engine first.
    """
    fp4 = load()
    torch.manual_seed(0)
    return write_results(args.out, suites.e0m3_split_rows(fp4))


def quant(args: argparse.Namespace) -> dict:
    """Quantizers, dequantizer, fused SwiGLU+quant and MoE permute against the reference's PyTorch ops.

    Ours against the same op done with PyTorch ops on the GPU (the reference), in one process, on the
    same data.

    Each row: median of CUDA-event timings after warm-up, bytes = bytes read + bytes written by the op,
    GBps = bytes / time, fraction_of_copy_bw = GBps / 4250 (the device-to-device copy bandwidth measured
    on the H200), speedup_vs_torch = reference time / our time. Inputs are 100 MB or more, so the 60 MB
    L2 holds no useful part of them between runs.
    """
    fp4 = load()
    torch.manual_seed(0)
    return write_results(args.out, suites.quant_rows(fp4), copy_bw_GBps=suites.COPY_BW_GBPS)


def host(args: argparse.Namespace) -> dict | None:
    """Host cost per call of every public GEMM and quantizer against torch.mm, on tiny shapes.

    At M = 16, N = 64, K = 128 what a call costs is the host's work: the Python layer, the op's dispatch,
    the C++ host code and the launches. host_us_per_call: the time to issue 200 calls while the GPU is
    held busy by a sleep kernel queued before them (checked: the sleep outlasts the last call), median
    over 15 repeats; torch.mm on bf16 operands of the same shape is timed the same way, alternating with
    the function, and vs_torch_mm is the median of the per-repeat ratios. Caller output buffers are
    passed where a function takes them. back_to_back_us_per_call: 2000 calls back to back, then one
    synchronize, per call; gpu_us_per_call: the device's time per call from calls captured in one CUDA
    graph and replayed. python_us_per_call: back to back after every op of the package got a CUDA kernel
    that does nothing (no-op kernels built with a C++ compiler, or --stubs): the Python layer and the
    dispatcher without the C++ host code behind the op. --device cpu only checks the script (no JSON).
    """
    fp4 = load()
    torch.manual_seed(0)
    rows, mm_gpu_us = host_rows(fp4, args.device, args.stubs)
    if args.device != "cuda":
        return None
    return write_results(
        args.out, rows, issued_calls=ISSUED_CALLS, issue_repeats=ISSUE_REPEATS,
        calls_per_timing=CALLS, repeats=REPEATS, graph_calls=GRAPH_CALLS,
        torch_mm_gpu_us=None if mm_gpu_us is None else round(mm_gpu_us, 2),
    )  # fmt: skip


# ---- host: host cost per call against torch.mm ------------------------------------------------

M, N, K = 16, 64, 128
CALLS, REPEATS = 2000, 7
ISSUED_CALLS, ISSUE_REPEATS = 200, 15  # 200 calls of up to 3 launches each stay inside the launch queue
SLEEP_CYCLES = 30_000_000  # GPU clock cycles of the sleep: it must outlast issuing ISSUED_CALLS calls
GRAPH_CALLS, GRAPH_REPLAYS = 20, 10

STUBS = """
#include <torch/library.h>
#include <memory>
void no_op(const c10::OperatorHandle&, torch::jit::Stack* stack) { stack->clear(); }
// No-op kernels for the named ops of namespace ns under a dispatch key (CPU, CUDA),
// registered for the rest of the process.
void install(const std::string& ns, const std::vector<std::string>& names, const std::string& key) {
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::parseDispatchKey(key), __FILE__,
                                                  __LINE__);
  for (const auto& name : names) {
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&no_op>());
  }
  libraries.push_back(std::move(library));
}
TORCH_LIBRARY(fp4_gemm_host_cost_stubs, m) { m.def("install(str ns, str[] names, str key) -> ()", &install); }
"""


def stub_ops(fp4, key: str, library: Path | None = None) -> None:
    """No-op kernels for every op of the package (they all write their arguments) under the dispatch
    key `key`, for the rest of the process. `library`: STUBS built beforehand (the .so that
    torch.utils.cpp_extension.load_inline writes); else it is built now (with a C++ compiler)."""
    if library is not None:
        torch.ops.load_library(str(library))
    else:
        from torch.utils.cpp_extension import load_inline

        load_inline("fp4_gemm_host_cost_stubs", STUBS, is_python_module=False)
    torch.ops.fp4_gemm_host_cost_stubs.install(fp4.ops.name, list(fp4._registry.REFERENCE_IMPLS), key)


def per_call_us(fn: Callable[[], object], device: str) -> float:
    """Median over REPEATS of the time per call of CALLS back-to-back calls (after a warm-up)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(200):
        fn()
    sync()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        sync()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(times)


def issue_us(fn: Callable[[], object], device: str) -> float:
    """The host's time per call to issue ISSUED_CALLS calls behind a sleeping GPU (on the CPU: back
    to back). RuntimeError if the sleep ended before the last call returned (a call waited for the
    device, or the queue filled)."""
    if device != "cuda":
        start = time.perf_counter()
        for _ in range(ISSUED_CALLS):
            fn()
        return (time.perf_counter() - start) / ISSUED_CALLS * 1e6
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    slept = torch.cuda.Event()
    slept.record()
    start = time.perf_counter()
    for _ in range(ISSUED_CALLS):
        fn()
    elapsed = time.perf_counter() - start
    if slept.query():
        raise RuntimeError("the GPU's sleep ended before the calls were issued: raise SLEEP_CYCLES")
    torch.cuda.synchronize()
    return elapsed / ISSUED_CALLS * 1e6


def paired_issue_us(fn: Callable[[], object], mm: Callable[[], object], device: str) -> tuple[float, float, float]:
    """(fn's, torch.mm's, median ratio) of issue_us, ISSUE_REPEATS times each, alternating which
    goes first, after a warm-up."""
    for _ in range(50):
        fn()
        mm()
    ours, theirs, ratios = [], [], []
    for repeat in range(ISSUE_REPEATS):
        pair = (fn, mm) if repeat % 2 == 0 else (mm, fn)
        first, second = (issue_us(f, device) for f in pair)
        us, mm_us = (first, second) if repeat % 2 == 0 else (second, first)
        ours.append(us)
        theirs.append(mm_us)
        ratios.append(us / mm_us)
    return statistics.median(ours), statistics.median(theirs), statistics.median(ratios)


def gpu_us_per_call(fn: Callable[[], object]) -> float | None:
    """The device's time per call: median over REPEATS of GRAPH_REPLAYS replays of a CUDA graph of
    GRAPH_CALLS calls (None, with the reason printed, where the call cannot be captured)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
    except RuntimeError as error:
        print(f"    not captured: {error}")
        torch.cuda.synchronize()
        return None
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPEATS):
        start.record()
        for _ in range(GRAPH_REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (GRAPH_REPLAYS * GRAPH_CALLS))
    return statistics.median(times)


def gemm_calls(fp4, device: str) -> dict[str, Callable[[], object]]:
    """One call of every public GEMM on NVFP4 (halops: each mode) operands of M x N x K."""
    bf16, fp16, u8 = torch.bfloat16, torch.float16, torch.uint8
    x, w = torch.randn(M, K, device=device, dtype=bf16), torch.randn(N, K, device=device, dtype=bf16)
    a, sfa = fp4.quantize_fp4_sfa_bf16(x)
    b, sfb = fp4.quantize_fp4_sfa_bf16(w)
    a1, sfa1 = fp4.quantize_fp4_sfa_bf16(x[:1].contiguous())
    bi = fp4.fp4_repack_b_interleaved_sm120(b)
    ae, sfae = fp4.quantize_e0m3_sfa_fp16(x.half())
    be, sfbe = fp4.quantize_e0m3_sfa_fp16(w.half())
    big = torch.randn(512, K, device=device, dtype=bf16)
    am, sfam = fp4.quantize_fp4_sfa_bf16(big)
    workspace = torch.zeros(fp4.nvfp4_gemm_m256_workspace_size(am, b, sfam, sfb), device=device, dtype=u8)
    block_scales = torch.ones(N, K // 16, device=device).to(torch.float8_e4m3fn)  # ModelOpt's plain UE4M3 scales
    w4a16 = fp4.adopt_nvfp4_w4a16_marlin(b, block_scales, torch.ones(1, device=device))
    out, out16, out1 = (torch.empty(rows, N, device=device, dtype=t) for rows, t in ((M, bf16), (M, fp16), (1, bf16)))
    out_m = torch.empty(512, N, device=device, dtype=bf16)
    packed, scales = torch.empty(M, N // 2, device=device, dtype=u8), torch.empty(512, device=device, dtype=u8)
    packed_glu = torch.empty(M, N // 4, device=device, dtype=u8)
    bias, bias16 = torch.randn(N, device=device, dtype=bf16), torch.randn(N, device=device, dtype=fp16)
    residual, residual16 = torch.randn(M, N, device=device, dtype=bf16), torch.randn(M, N, device=device, dtype=fp16)
    ops = (a, b, sfa, sfb)
    calls = {
        "nvfp4_gemm_bf16": lambda: fp4.nvfp4_gemm_bf16(*ops, out=out),
        "nvfp4_gemm_fp16": lambda: fp4.nvfp4_gemm_fp16(*ops, out=out16),
        "nvfp4_gemm_variant_bf16": lambda: fp4.nvfp4_gemm_variant_bf16(*ops, out=out, variant=1),
        "fp4_w4a16_linear_bf16": lambda: fp4.fp4_w4a16_linear_bf16(*ops, out=out),
        "nvfp4_gemm_streamk_bf16": lambda: fp4.nvfp4_gemm_streamk_bf16(*ops, out=out),
        "nvfp4_gemm_streamk_bias_bf16": lambda: fp4.nvfp4_gemm_streamk_bias_bf16(*ops, bias, out=out),
        "nvfp4_gemm_bias_bf16": lambda: fp4.nvfp4_gemm_bias_bf16(*ops, bias, out=out),
        "nvfp4_gemm_residual_bf16": lambda: fp4.nvfp4_gemm_residual_bf16(*ops, residual, out=out),
        "nvfp4_gemm_bias_residual_bf16": lambda: fp4.nvfp4_gemm_bias_residual_bf16(*ops, bias, residual, out=out),
        "nvfp4_gemm_bias_residual_fp16": lambda: fp4.nvfp4_gemm_bias_residual_fp16(*ops, bias16, residual16, out=out16),
        "nvfp4_gemm_bias_gelu_bf16": lambda: fp4.nvfp4_gemm_bias_gelu_bf16(*ops, bias, out=out),
        "nvfp4_gemm_nvfp4": lambda: fp4.nvfp4_gemm_nvfp4(*ops, out_packed=packed, out_sfa=scales),
        "nvfp4_gemm_relu2_nvfp4": lambda: fp4.nvfp4_gemm_relu2_nvfp4(*ops, out_packed=packed, out_sfa=scales),
        "nvfp4_gemm_bias_gelu_nvfp4": lambda: fp4.nvfp4_gemm_bias_gelu_nvfp4(
            *ops, bias, out_packed=packed, out_sfa=scales
        ),
        "nvfp4_gemm_bias_gelu_nvfp4_fp16": lambda: fp4.nvfp4_gemm_bias_gelu_nvfp4_fp16(
            *ops, bias16, out_packed=packed, out_sfa=scales
        ),
        "nvfp4_gemm_geglu_nvfp4_fp16": lambda: fp4.nvfp4_gemm_geglu_nvfp4_fp16(
            *ops, out_packed=packed_glu, out_sfa=scales
        ),
        "cutlass_fp4_gemm_geglu_il_hw_v10": lambda: fp4.cutlass_fp4_gemm_geglu_il_hw_v10(
            *ops, out_packed=packed_glu, out_sfa=scales
        ),
        "e0m3_weight_gemm_fp16": lambda: fp4.e0m3_weight_gemm_fp16(ae, be, sfae, sfbe, a_format=0, out=out16),
        "fp4_w4a4_gemv_warpsplit_interleaved_bf16": lambda: fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(
            a1, bi, sfa1, sfb, out=out1
        ),
        "fp4_w4a4_gemv_warpsplit_bf16": lambda: fp4.fp4_w4a4_gemv_warpsplit_bf16(a1, b, sfa1, sfb, out=out1),
        "fp4_w4a4_gemm_warpsplit_mrows_bf16": lambda: fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*ops, out=out),
        "nvfp4_w4a16_marlin_bf16": lambda: fp4.nvfp4_w4a16_marlin_bf16(x, *w4a16[:3], workspace=w4a16[3], out=out),
        "nvfp4_gemm_m256_bf16": lambda: fp4.nvfp4_gemm_m256_bf16(am, b, sfam, sfb, workspace=workspace, out=out_m),
    }
    calls.update(halops_calls(fp4, device))
    return calls


def halops_calls(fp4, device: str) -> dict[str, Callable[[], object]]:
    """dense, batched (2 items), contiguous and masked (2 experts of M rows) GEMMs in w4a4-nvfp4."""
    mode, e = "w4a4-nvfp4", 2
    bf16 = torch.bfloat16

    def quantized(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        return fp4.group_wise_quant(torch.randn(rows, K, device=device, dtype=bf16), mode)

    a, sfa = quantized(M)
    w, sfb = quantized(N)
    ga, gsfa = quantized(e * M)
    gw, gsfb = quantized(e * N)
    gw = gw.reshape(e, N, -1)
    out, gout = torch.empty(M, N, device=device, dtype=bf16), torch.empty(e * M, N, device=device, dtype=bf16)
    alpha, galpha = torch.ones(1, device=device), torch.ones(e, device=device)
    ids = torch.arange(e * M, device=device, dtype=torch.int32) // M
    counts = torch.full((e,), M, device=device, dtype=torch.int32)
    bout, ga3 = gout.reshape(e, M, N), ga.reshape(e, M, -1)  # batch_gemm's [B, M, ...] views, made once
    return {
        "dense_gemm": lambda: fp4.dense_gemm(a, w, sfa, sfb, out, alpha=alpha, mode=mode),
        "batch_gemm": lambda: fp4.batch_gemm(ga3, gw, gsfa, gsfb, bout, alpha=galpha, mode=mode),
        "group_contiguous_gemm": lambda: fp4.group_contiguous_gemm(
            ga, gw, gsfa, gsfb, ids, gout, alpha=galpha, mode=mode
        ),
        "group_masked_gemm": lambda: fp4.group_masked_gemm(
            ga, gw, gsfa, gsfb, counts, gout, alpha=galpha, max_m_per_expert=M, mode=mode
        ),
    }


def quantizer_calls(fp4, device: str) -> dict[str, Callable[[], object]]:
    """Every public quantizer (caller buffers where it takes them) and the dequantizer, on [M, K]."""
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    xh = x.half()
    packed = torch.empty(M, K // 2, device=device, dtype=torch.uint8)
    sfa = torch.empty(fp4.sfa_size_bytes(M, K), device=device, dtype=torch.uint8)
    q, s = fp4.quantize_fp4_sfa_bf16(x)
    out = torch.empty(M, K, device=device, dtype=torch.float16)
    return {
        "group_wise_quant (w8a8-mxfp8)": lambda: fp4.group_wise_quant(x, "w8a8-mxfp8"),
        "group_wise_quant (w4a4-mxfp4)": lambda: fp4.group_wise_quant(x, "w4a4-mxfp4"),
        "group_wise_quant (w4a4-nvfp4)": lambda: fp4.group_wise_quant(x, "w4a4-nvfp4"),
        "quantize_fp4_sfa_bf16": lambda: fp4.quantize_fp4_sfa_bf16(x, packed, sfa),
        "quantize_fp4_sfa_fp16": lambda: fp4.quantize_fp4_sfa_fp16(xh, packed, sfa),
        "quantize_fp4_sfa_mse_bf16": lambda: fp4.quantize_fp4_sfa_mse_bf16(x, packed, sfa),
        "quantize_fp4_sfa_mse_fp16": lambda: fp4.quantize_fp4_sfa_mse_fp16(xh, packed, sfa),
        "quantize_e0m3_sfa_fp16": lambda: fp4.quantize_e0m3_sfa_fp16(xh, packed, sfa),
        "quantize_fp4_sfa_padded_bf16": lambda: fp4.quantize_fp4_sfa_padded_bf16(x),
        "pack_nvfp4_weight_bf16": lambda: fp4.pack_nvfp4_weight_bf16(x),
        "dequantize_fp4_sfa_fp16": lambda: fp4.dequantize_fp4_sfa_fp16(q, s, out),
    }


def host_rows(fp4, device: str, stubs: Path | None) -> tuple[list[dict], float | None]:
    """(rows, torch.mm's device time per call): every public GEMM and quantizer, paired with torch.mm."""
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    wt = torch.randn(K, N, device=device, dtype=torch.bfloat16)
    mm_out = torch.empty(M, N, device=device, dtype=torch.bfloat16)

    def mm() -> Tensor:
        return torch.mm(x, wt)

    mm_us = per_call_us(mm, device)
    mm_out_us = per_call_us(lambda: torch.mm(x, wt, out=mm_out), device)
    mm_gpu_us = gpu_us_per_call(lambda: torch.mm(x, wt, out=mm_out)) if device == "cuda" else None
    print(f"{'torch.mm':44s} back to back {mm_us:7.2f} us   out=: {mm_out_us:7.2f} us   gpu: {mm_gpu_us}")
    rows = []
    calls = {"gemm": gemm_calls(fp4, device), "quantizer": quantizer_calls(fp4, device)}
    for kind, functions in calls.items():
        for name, fn in functions.items():
            host_us, mm_host_us, ratio = paired_issue_us(fn, mm, device)
            back_to_back_us = per_call_us(fn, device)
            gpu_us = gpu_us_per_call(fn) if device == "cuda" else None
            rows.append(
                {
                    "function": name,
                    "kind": kind,
                    "shape": [M, N, K] if kind == "gemm" else [M, K],
                    "host_us_per_call": round(host_us, 2),
                    "torch_mm_host_us": round(mm_host_us, 2),
                    "vs_torch_mm": round(ratio, 2),
                    "back_to_back_us_per_call": round(back_to_back_us, 2),
                    "torch_mm_back_to_back_us": round(mm_us, 2),
                    "torch_mm_out_back_to_back_us": round(mm_out_us, 2),
                    "gpu_us_per_call": None if gpu_us is None else round(gpu_us, 2),
                }
            )
            shown = "-" if gpu_us is None else f"{gpu_us:6.2f}"
            print(
                f"{name:44s} host {host_us:6.2f} us (torch.mm {mm_host_us:6.2f}) x{ratio:5.2f}   "
                f"back to back {back_to_back_us:7.2f} us   gpu {shown} us",
                flush=True,
            )
    try:
        stub_ops(fp4, "CUDA" if device == "cuda" else "CPU", stubs)  # from here on no op does its work
    except (OSError, RuntimeError) as error:  # no prebuilt stubs and no compiler: the column stays out
        print(f"no python_us_per_call: the no-op kernels did not load ({error})")
    else:
        by_name = {row["function"]: row for row in rows}
        for functions in calls.values():
            for name, fn in functions.items():
                by_name[name]["python_us_per_call"] = round(per_call_us(fn, device), 2)
                print(f"{name:44s} python layer and dispatch {by_name[name]['python_us_per_call']:7.2f} us")
    return rows, mm_gpu_us


# ---- tables and plots of the results (JSON in; matplotlib imported only to plot) ----------------

# the README's excerpt of the gemm result: two of the qualification shapes and both MoE expert shapes
README_SHAPES = ((17408, 5120), (8192, 8192), (4096, 7168), (7168, 2048))


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict], str]
    numeric: bool = True


def number(key: str, digits: int) -> Callable[[dict], str]:
    """The row's value at key with `digits` decimals, "-" where it is null or absent."""
    return lambda row: "-" if row.get(key) is None else f"{row[key]:.{digits}f}"


def text(key: str) -> Callable[[dict], str]:
    return lambda row: str(row.get(key) or "-")


def ratio_column(peer: str, header: str) -> Column:
    return Column(f"vs {header}", number(f"ratio_vs_{peer}", 2))


FORMAT = Column("format", text("format"), numeric=False)
OP = Column("op", lambda row: f"`{row['op']}`", numeric=False)
BACKEND = Column("backend", text("ours_backend"), numeric=False)
SHAPE = (Column("M", text("M")), Column("N", text("N")), Column("K", text("K")))
OURS_US = Column("ours us", number("ours_us", 1))
CEILING = (
    Column("engine bf16 us", number("engine_bf16_ceiling_us", 1)),
    Column("engine bf16 vs cuBLAS bf16", number("engine_bf16_ceiling_ratio_vs_cublas_bf16", 2)),
)
FULL_COLUMNS = (
    FORMAT, OP, BACKEND, *SHAPE, OURS_US, Column("TFLOP/s", number("tflops", 1)),
    ratio_column("cublas_bf16", "bf16"), ratio_column("fp8_rowwise", "fp8 row"), ratio_column("dequant_mm", "deq+mm"),
    ratio_column("triton_dequant_mm", "triton deq+mm"), ratio_column("triton_dot_scaled", "triton dot_scaled"),
    ratio_column("humming", "humming"), *CEILING,
)  # fmt: skip
README_COLUMNS = (
    FORMAT, *SHAPE, BACKEND, OURS_US, Column("TFLOP/s", number("tflops", 0)),
    ratio_column("cublas_bf16", "cuBLAS bf16"), ratio_column("fp8_rowwise", "fp8 row-wise"),
    ratio_column("triton_dequant_mm", "Triton deq+mm"), ratio_column("triton_dot_scaled", "Triton dot_scaled"),
    ratio_column("humming", "humming"), *CEILING,
)  # fmt: skip


def table(rows: list[dict], columns: tuple[Column, ...]) -> str:
    lines = [
        "| " + " | ".join(c.header for c in columns) + " |",
        "|" + "".join("---:|" if c.numeric else "---|" for c in columns),
    ]
    lines += ["| " + " | ".join(c.cell(row) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def gemm_markdown(result: dict) -> str:
    """Every row of a gemm result: the .md written beside its JSON."""
    caption = (
        f"{result['gpu']}, torch {result['torch']}, triton {result['triton']}, {result['date']}. "
        "x = peer time / our time (above 1: ours faster); - = not run or failed its check (see the JSON notes). "
        "engine bf16 = the Hopper engine on bf16 operands (no decode): the ceiling of its pipeline."
    )
    return caption + "\n\n" + table(result["rows"], FULL_COLUMNS)


def readme_table(result: dict, shapes: tuple[tuple[int, int], ...] = README_SHAPES) -> str:
    """The README excerpt of a gemm result: the rows of the given (N, K) shapes, in the JSON's order."""
    wanted = set(shapes)
    return table([r for r in result["rows"] if (r["N"], r["K"]) in wanted], README_COLUMNS)


def pyplot() -> object:
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# method -> (label, matplotlib style) of the gemm plot: ours, gemm_peers.PEERS and gemm_peers.CEILING
METHODS = {
    "ours": ("ours", {"color": "black", "linewidth": 2.4, "marker": "o"}),
    "cublas_bf16": ("cuBLAS bf16 (dequantized)", {"color": "tab:blue", "marker": "s"}),
    "scaled_mm_fp8_rowwise": ("torch._scaled_mm fp8 row-wise", {"color": "tab:cyan", "marker": "v", "linestyle": "--"}),
    "dequant_mm": ("PyTorch dequant + mm", {"color": "tab:orange", "marker": "^"}),
    "triton_dequant_mm": ("Triton dequant + mm", {"color": "tab:green", "marker": "D"}),
    "triton_dot_scaled": ("Triton dot_scaled", {"color": "tab:red", "marker": "x"}),
    "humming": ("humming-kernels W4A16", {"color": "tab:purple", "marker": "P"}),
    "engine_bf16_ceiling": ("engine, bf16 operands (ceiling)", {"color": "gray", "marker": ".", "linestyle": ":"}),
}


def tflops_series(rows: list[dict], method: str) -> tuple[list[int], list[float]]:
    """(M values, TFLOP/s) of one method over rows of one panel; peers that failed their check are skipped."""
    ms, values = [], []
    for r in sorted(rows, key=lambda r: r["M"]):
        us = r.get(f"{method}_us")
        checked = (r.get("peer_check") or {}).get(method)
        if not us or (method != "ours" and not (checked and checked.get("ok"))):
            continue
        ms.append(r["M"])
        values.append(2 * r["M"] * r["N"] * r["K"] / us / 1e6)
    return ms, values


def m_label(m: int) -> str:
    """2048 -> "2k": neighbouring powers of two stay readable on a log axis."""
    return f"{m // 1024}k" if m >= 1024 and m % 1024 == 0 else str(m)


def backend_spans(rows: list[dict]) -> str:
    """Which backend served ours over which M, in M order: "skinny 1-16, sm90_engine 64-256, composition 1k-4k"."""
    spans: list[list] = []  # [backend, first M, last M]
    for r in sorted(rows, key=lambda r: r["M"]):
        backend = r.get("ours_backend") or "?"
        if spans and spans[-1][0] == backend:
            spans[-1][2] = r["M"]
        else:
            spans.append([backend, r["M"], r["M"]])
    return ", ".join(f"{b} {m_label(lo)}" + (f"-{m_label(hi)}" if hi != lo else "") for b, lo, hi in spans)


def plot_gemm(result: dict, out: Path) -> None:
    """TFLOP/s against M (both axes logarithmic), one line per method, a row of panels per format and a
    column per (N, K); the ceiling dotted; each title says which backend served ours at which M. A peer
    that failed its check against ours is left out, as it is out of the ratios."""
    plt = pyplot()
    rows = result["rows"]
    formats = [f for f in grid.FORMATS if any(r["format"] == f for r in rows)]
    shapes = list(dict.fromkeys((r["N"], r["K"]) for r in rows))
    fig, axes = plt.subplots(len(formats), len(shapes), figsize=(4.2 * len(shapes), 3.3 * len(formats)),
                             squeeze=False, sharex=True)  # fmt: skip
    for i, fmt in enumerate(formats):
        for j, (n, k) in enumerate(shapes):
            ax = axes[i][j]
            here = [r for r in rows if r["format"] == fmt and (r["N"], r["K"]) == (n, k)]
            for method, (label, style) in METHODS.items():
                ms, values = tflops_series(here, method)
                if ms:
                    ax.plot(ms, values, label=label, **style)
            op = here[0]["op"] if here else ""
            ax.set_title(f"{fmt}: N={n}, K={k}, ours = {op}\n{backend_spans(here)}", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ms = sorted({r["M"] for r in here})
            if ms:
                ax.set_xticks(ms, [m_label(m) for m in ms])
            if i == len(formats) - 1:
                ax.set_xlabel("M")
            if j == 0:
                ax.set_ylabel("TFLOP/s")
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), fontsize=9,
               bbox_to_anchor=(0.5, 1.0))  # fmt: skip
    fig.suptitle(f"{result.get('gpu')}, torch {result.get('torch')}, triton {result.get('triton')}, "
                 f"{result.get('date', '')}: TFLOP/s = 2MNK / time", y=1.03, fontsize=11)  # fmt: skip
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


GROUPED_SERIES = {
    "ours_us": ("ours", "black"),
    "dense_engine_us": ("E serial dense calls (ours)", "tab:gray"),
    "torch_grouped_mm_bf16_us": ("torch._grouped_mm bf16", "tab:blue"),
    "torch_scaled_grouped_mm_fp8_us": ("torch._scaled_grouped_mm fp8 row-wise", "tab:cyan"),
}
GROUPED_COLUMNS = (
    "op", "format", "case", "N", "K", "ours_us", "dense_engine_us", "torch_grouped_mm_bf16_us",
    "torch_scaled_grouped_mm_fp8_us", "ratio_vs_dense_engine", "ratio_vs_torch_grouped_mm_bf16",
)  # fmt: skip


def grouped_table(result: dict) -> str:
    """Every row of a grouped result as a Markdown table (x = peer time / our time)."""
    lines = ["| " + " | ".join(GROUPED_COLUMNS) + " |", "|" + "---|" * len(GROUPED_COLUMNS)]
    for r in result["rows"]:
        lines.append("| " + " | ".join("-" if r.get(c) is None else str(r.get(c)) for c in GROUPED_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def plot_grouped(result: dict, out: Path) -> None:
    """Bars of the time of ours and of the peers (microseconds, logarithmic) per case and (N, K), NVFP4
    and MXFP8 rows of group_masked_gemm; the table is written beside the plot (.md)."""
    plt = pyplot()
    rows = [r for r in result["rows"] if r["op"] == "group_masked_gemm"]
    formats = ("nvfp4", "mxfp8")
    fig, axes = plt.subplots(len(formats), 1, figsize=(14, 4.5 * len(formats)), squeeze=False)
    for ax, fmt in zip(axes[:, 0], formats, strict=True):
        panel = [r for r in rows if r["format"] == fmt]
        labels = [f"{r['case']}\n{r['N']}x{r['K']}" for r in panel]
        width = 0.8 / len(GROUPED_SERIES)
        for i, (key, (label, color)) in enumerate(GROUPED_SERIES.items()):
            xs = [j + i * width for j, r in enumerate(panel) if r.get(key)]
            ys = [r[key] for r in panel if r.get(key)]
            ax.bar(xs, ys, width, label=label, color=color)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(panel))], labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("us (lower is better)")
        ax.set_title(f"group_masked_gemm {fmt}, E experts x rows per expert, (N, K); {result['gpu']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    out.with_suffix(".md").write_text(grouped_table(result))


def skinny_dense_rows(result: dict) -> list[dict]:
    """The dense decode rows of a skinny result (the grouped and streaming-layout rows left out)."""
    skipped = ("group", "fp4_w4a4_gemv_warpsplit_interleaved")
    return [r for r in result["rows"] if not r["op"].startswith(skipped) and "grouping" not in r]


def row_of(rows: list[dict], shape: tuple[int, int], fmt: str, m: int) -> dict | None:
    hits = [r for r in rows if (r["N"], r["K"]) == shape and r["format"] == fmt and r["M"] == m]
    return hits[0] if hits else None


def skinny_table(result: dict) -> str:
    """The README's two tables of a skinny result: per weight shape, cuBLAS bf16 at M = 1 and each format's
    M = 1 / 16 times and fractions of copy bandwidth; then the grouped rows against torch._grouped_mm."""
    rows = skinny_dense_rows(result)
    formats = suites.SKINNY_FORMATS
    head = ["(N, K)", "weight MB", "cuBLAS bf16 M=1 us"] + [f"{f} M=1 / 16 us (fraction)" for f in formats]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|" + "---|" * len(formats)]
    for n, k in dict.fromkeys((r["N"], r["K"]) for r in rows):  # the run's order
        first = row_of(rows, (n, k), "nvfp4", 1)
        cells = [f"{n}, {k}", f"{n * k / 2 / 1e6:.0f}", f"{first['cublas_bf16_us']:.1f}" if first else "-"]
        for fmt in formats:
            one, sixteen = row_of(rows, (n, k), fmt, 1), row_of(rows, (n, k), fmt, 16)
            if one is None or sixteen is None:
                cells.append("-")
                continue
            cells.append(f"{one['ours_us']:.1f} / {sixteen['ours_us']:.1f}"
                         f" ({one['fraction_of_copy_bw']:.2f} / {sixteen['fraction_of_copy_bw']:.2f})")  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    head = ["op", "format", "E x rows", "(N, K)", "ours us", "torch._grouped_mm bf16 us", "x grouped_mm"]
    lines += ["", "| " + " | ".join([*head, "fraction of copy bw"]) + " |", "|---|---|---|---|---:|---:|---:|---:|"]
    for r in (r for r in result["rows"] if "grouping" in r):
        lines.append(
            f"| `{r['op']}` | {r['format']} | {r['E']} x {r['rows_per_group']} | {r['N']}, {r['K']}"
            f" | {r['ours_us']:.0f} | {r['torch_grouped_mm_bf16_us']:.0f} | {r['ratio_vs_torch_grouped_mm_bf16']:.2f}"
            f" | {r['fraction_of_copy_bw']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot_skinny(result: dict, out: Path) -> None:
    """Per weight shape, the fraction of the copy bandwidth (measured in the same run) each format reaches
    at M = 1 and M = 16, and cuBLAS bf16's at M = 1 (its bytes counted the same way: the bf16 weight)."""
    plt = pyplot()
    rows = skinny_dense_rows(result)
    formats = suites.SKINNY_FORMATS
    shapes = sorted({(r["N"], r["K"]) for r in rows}, key=lambda s: -s[0] * s[1])
    fig, ax = plt.subplots(figsize=(15, 5))
    width = 0.8 / (2 * len(formats) + 1)
    for i, (fmt, m) in enumerate((f, m) for f in formats for m in (1, 16)):
        ys = [(row_of(rows, s, fmt, m) or {"fraction_of_copy_bw": 0.0})["fraction_of_copy_bw"] for s in shapes]
        xs = [j + i * width for j in range(len(shapes))]
        ax.bar(xs, ys, width, label=f"{fmt} M={m}", alpha=1.0 if m == 1 else 0.55)
    cublas = []
    for s in shapes:
        r = next(r for r in rows if (r["N"], r["K"]) == s and r["M"] == 1)
        cublas.append(2 * s[0] * s[1] / r["cublas_bf16_us"] / 1e3 / r["copy_bw"])
    xs = [j + 2 * len(formats) * width for j in range(len(shapes))]
    ax.bar(xs, cublas, width, label="cuBLAS bf16 M=1", color="gray")
    ax.axhline(0.8, color="red", linestyle="--", linewidth=1, label="target on >= 40 MB weights (0.8)")
    ax.set_xticks([j + 0.4 for j in range(len(shapes))], [f"{n}x{k}" for n, k in shapes], fontsize=8)
    ax.set_ylabel("fraction of copy bandwidth")
    ax.set_title(f"M <= 16 decode, weights from HBM; {result['gpu']}, copy {result['copy_bw_GBps']:.0f} GB/s")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def gemm_table(result: dict, args: argparse.Namespace) -> str:
    return gemm_markdown(result) if args.all else readme_table(result, tuple(args.shapes or README_SHAPES))


TABLES = {"gemm": gemm_table, "grouped": lambda result, args: grouped_table(result),
          "skinny": lambda result, args: skinny_table(result)}  # fmt: skip
PLOTS = {"gemm": plot_gemm, "grouped": plot_grouped, "skinny": plot_skinny}


# ---- the command line ---------------------------------------------------------------------------


def parse_shape(value: str) -> tuple[int, int]:
    n, k = value.lower().split("x")
    return int(n), int(k)


def subcommand(sub: argparse._SubParsersAction, run: Callable, out: str | None) -> argparse.ArgumentParser:
    """A subcommand running `run` (its docstring is the help), writing --out (default results/<out>)."""
    name = run.__name__.replace("_", "-")
    doc = inspect.cleandoc(run.__doc__)
    parser = sub.add_parser(name, help=" ".join(doc.split("\n\n")[0].split()), description=doc,
                            formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    default = "the device's default" if out is None else f"benchmarks/results/{out}"
    parser.add_argument("--out", type=Path, default=out and RESULTS / out, help=f"result JSON (default {default})")
    parser.set_defaults(run=run, command=name)
    if name in PLOTS:
        parser.add_argument("--table", action="store_true", help="print the Markdown table of --out; measure nothing")
        parser.add_argument("--plot", action="store_true", help="plot --out (PNG); measure nothing")
        parser.add_argument("--png", type=Path, help="the plot's path (default: --out with .png)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(required=True, metavar="subcommand")
    p = subcommand(sub, gemm, None)
    p.add_argument("--quick", action="store_true", help=f"M in {grid.QUICK_MS}, (N, K) in {grid.QUICK_SHAPES}")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--formats", nargs="+", choices=grid.FORMATS, default=list(grid.DEFAULT_FORMATS))
    which.add_argument(
        "--w4a16", action="store_true", help=f"W4A16 rows only: --formats {' '.join(grid.W4A16_FORMATS)}"
    )
    p.add_argument("--ms", nargs="+", type=int, default=None, help=f"default {grid.MS}")
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=None,
                   help="NxK ... (default: the six; with --table, the README's four)")  # fmt: skip
    p.add_argument("--nvfp4-op", choices=("dense_gemm", "nvfp4_gemm_bf16"), default="dense_gemm")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: functional dry run only")
    p.add_argument("--budget-s", type=float, default=grid.DEFAULT_BUDGET_S,
                   help="start no (format, N, K) block after this many seconds of measuring")  # fmt: skip
    p.add_argument("--all", action="store_true", help="with --table: every row and column (the result's .md)")
    p = subcommand(sub, grouped, "h200-gemm-grouped.json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--formats", default="nvfp4,mxfp8,mxfp4")
    p = subcommand(sub, skinny, "h200-gemm-skinny.json")
    p.add_argument("--shapes", choices=tuple(suites.SKINNY_SHAPES), default="all")
    p.add_argument("--grouped", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--sweep-out", type=Path, default=RESULTS / "h200-gemm-skinny-knobs.json")
    subcommand(sub, w4a16, "h200-gemm-w4a16.json")
    subcommand(sub, stream, "h200-gemm-stream.json")
    subcommand(sub, staged, "h200-gemm-staged.json")
    subcommand(sub, e0m3_split, "h200-gemm-e0m3-split.json")
    subcommand(sub, quant, "h200-quant.json")
    p = subcommand(sub, host, "h200-host-overhead.json")
    p.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only checks the script")
    p.add_argument("--stubs", type=Path, help="the no-op kernels built beforehand (else built for python_us_per_call)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.command == "gemm":
        measuring = not (args.table or args.plot)
        if args.w4a16:
            args.formats = list(grid.W4A16_FORMATS)
        if measuring:
            args.ms = args.ms or list(grid.QUICK_MS if args.quick else grid.MS)
            args.shapes = args.shapes or list(grid.QUICK_SHAPES if args.quick else grid.SHAPES)
        if args.out is None:
            name = "h200-gemm.json" if args.device == "cuda" or not measuring else "cpu-dryrun-gemm.json"
            args.out = RESULTS / name
    return args


def main(argv: list[str] | None = None) -> object:
    args = parse_args(argv)
    if getattr(args, "table", False):
        rendered = TABLES[args.command](json.loads(args.out.read_text()), args)
        print(rendered, end="")
        return rendered
    if getattr(args, "plot", False):
        png = args.png or args.out.with_suffix(".png")
        PLOTS[args.command](json.loads(args.out.read_text()), png)
        print(png)
        return png
    return args.run(args)


if __name__ == "__main__":
    main()
