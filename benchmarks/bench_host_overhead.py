"""Host cost per call of every public GEMM and quantizer against torch.mm, on tiny shapes.

At M = 16, N = 64, K = 128 the kernels are tiny, and what a call costs is the host's work: the Python
layer (validation, output allocation, building the op call), the op's dispatch, the C++ host code
(backend choice, launch planning) and the launches. `host_us_per_call`: the time to issue
ISSUED_CALLS calls while the GPU is held busy by a sleep kernel queued before them, so that no call
waits for the device and the launch queue never fills (checked: the sleep is still running when
the last call returns); median over ISSUE_REPEATS. torch.mm on bf16 operands of the same shape is timed
the same way, alternating with the function in the same process (the host's speed drifts), and
`vs_torch_mm` is the median of the per-repeat ratios. Caller output buffers are passed where a
function takes them (as the hot path should); `torch_mm_out` is torch.mm with `out=`.

Three more columns say where the time goes. `back_to_back_us_per_call`: CALLS calls back to back,
then one synchronize, per call: the rate of an eager loop, which the device bounds where a call's
kernels take longer than its host work (`gpu_us_per_call`: the device's time per call, from
GRAPH_CALLS calls captured in one CUDA graph and replayed, no host work). `python_us_per_call`:
back-to-back timing after every op of the package got a CUDA kernel that does nothing (stub_ops):
the Python layer and the dispatcher's parse of the op's arguments, without the C++ host code behind
the op. The difference to host_us_per_call is that C++ host code and the launches.

    python benchmarks/bench_host_overhead.py --out benchmarks/results/h200-host-overhead.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_common import RESULTS, load, write_results
from torch.utils.cpp_extension import load_inline

M, N, K = 16, 64, 128
CALLS, REPEATS = 2000, 7
ISSUED_CALLS, ISSUE_REPEATS = 200, 15  # 200 calls of up to 3 launches each stay inside the launch queue
SLEEP_CYCLES = 30_000_000  # ~15 ms of GPU clock: longer than issuing ISSUED_CALLS calls of ~30 us
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
    torch.utils.cpp_extension.load_inline writes); else it is built now (a C++ compiler, ~30 s)."""
    if library is not None:
        torch.ops.load_library(str(library))
    else:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-host-overhead.json")
    parser.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only checks the script")
    parser.add_argument("--stubs", type=Path, help="STUBS built beforehand (else built for python_us_per_call)")
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    device = args.device
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    wt = torch.randn(K, N, device=device, dtype=torch.bfloat16)
    mm_out = torch.empty(M, N, device=device, dtype=torch.bfloat16)

    def mm() -> torch.Tensor:
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
        stub_ops(fp4, "CUDA" if device == "cuda" else "CPU", args.stubs)  # from here on no op does its work
    except (OSError, RuntimeError) as error:  # no prebuilt stubs and no compiler: the column stays out
        print(f"no python_us_per_call: the no-op kernels did not load ({error})")
    else:
        by_name = {row["function"]: row for row in rows}
        for functions in calls.values():
            for name, fn in functions.items():
                by_name[name]["python_us_per_call"] = round(per_call_us(fn, device), 2)
                print(f"{name:44s} python layer and dispatch {by_name[name]['python_us_per_call']:7.2f} us")
    if device == "cuda":
        write_results(
            args.out, rows, issued_calls=ISSUED_CALLS, issue_repeats=ISSUE_REPEATS, calls_per_timing=CALLS,
            repeats=REPEATS, graph_calls=GRAPH_CALLS,
            torch_mm_gpu_us=None if mm_gpu_us is None else round(mm_gpu_us, 2),
        )  # fmt: skip


if __name__ == "__main__":
    main()
