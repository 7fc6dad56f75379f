"""Where an engine call's time goes: per-CTA timelines and the kernels of one call.

Two modes, one NVFP4 `dense_gemm` per shape on the Hopper engine (by name), L2 cleared first:

  timeline  a build with benchmarks/experiments/engine-cta-timeline.patch applied: its first consumer
            thread of every CTA prints, after the call, its start and end (globaltimer) and, per
            piece of work (stream-K), the cycles at which the piece began, its first K tile was in
            registers, its K loop ended, its partial was published or gathered, and its epilogue
            ended. This script captures the lines and summarizes them per shape.
  kernels   any build: torch.profiler's CUDA activities of 10 calls, each after an L2 clear (the
            stream-K flags' memset, the engine kernel, and the gaps between them).

    python benchmarks/bench_engine_timeline.py timeline <patched repo> --out /tmp/timeline.txt
    python benchmarks/bench_engine_timeline.py kernels . --out /tmp/kernels.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from kernels import get_local_kernel

SHAPES = (
    (64, 7168, 2048),
    (64, 4096, 7168),
    (256, 7168, 2048),
    (256, 4096, 7168),
    (64, 17408, 5120),
    (256, 17408, 5120),
)
FLUSH_BYTES = 512 << 20
EVENTS = ("begin", "first tile", "K loop", "gather / publish", "epilogue")


def engine_call(fp4, m: int, n: int, k: int) -> Callable[[], object]:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, sfa = fp4.group_wise_quant(torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16), "w4a4-nvfp4")
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    b, sfb = fp4.group_wise_quant(w, "w4a4-nvfp4")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    call = fp4._gemm.GemmCall(a, b, sfa, sfb, "nvfp4", "nvfp4", out=out, variant=-1)
    return lambda: call.run_on("sm90_engine")


def capture_timelines(fp4, out: Path, repeats: int = 3) -> None:
    """The device printf lines of each call into `out`, after a "SHAPE m n k rep r" line."""
    libc = ctypes.CDLL(None)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    fd = os.open(str(out), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for m, n, k in SHAPES:
        fn = engine_call(fp4, m, n, k)
        for rep in range(repeats):
            flush.zero_()
            torch.cuda.synchronize()
            libc.fflush(None)
            os.write(fd, f"SHAPE {m} {n} {k} rep {rep}\n".encode())
            stdout = os.dup(1)
            os.dup2(fd, 1)
            fn()
            torch.cuda.synchronize()
            libc.fflush(None)
            os.dup2(stdout, 1)
            os.close(stdout)
    os.close(fd)


def spread(values: list[float]) -> str:
    v = sorted(values)
    return f"min {v[0]:6.2f} median {statistics.median(v):6.2f} max {v[-1]:6.2f}"


def summarize(path: Path, ghz: float) -> None:
    """Per shape (its last repeat): CTA start, end and lifetime, and each event's delay per piece kind."""
    calls: dict[str, list[list[str]]] = {}
    key = ""
    for line in path.read_text().splitlines():
        if line.startswith("SHAPE"):
            key = line[6:]
            calls[key] = []
        elif line.startswith("TL"):
            calls[key].append(line.replace("|", " ").split())
    last = {k.rsplit(" rep ", 1)[0]: v for k, v in calls.items()}
    for shape, rows in last.items():
        g0 = min(int(r[3]) for r in rows)
        span_us = (max(int(r[4]) for r in rows) - g0) / 1e3
        print(f"== {shape}: {len(rows)} CTAs, {span_us:.2f} us from the first start to the last end")
        print("  start   ", spread([(int(r[3]) - g0) / 1e3 for r in rows]))
        print("  end     ", spread([(int(r[4]) - g0) / 1e3 for r in rows]))
        pieces: dict[tuple[int, str], list[list[float]]] = {}
        for r in rows:
            for i in range(min(int(r[6]), 3)):
                f = [int(x) for x in r[7 + 7 * i : 14 + 7 * i]]
                cycles = [c / ghz / 1e3 for c in f[2:]]
                steps = [cycles[0]] + [b - a for a, b in zip(cycles, cycles[1:], strict=False)]
                pieces.setdefault((i, "owner" if f[0] == 0 else "contributor"), []).append([f[1] - f[0], *steps])
        for (i, kind), v in sorted(pieces.items()):
            print(f"  piece {i} {kind} x{len(v)}: K tiles {spread([x[0] for x in v])}")
            for j, name in enumerate(EVENTS):
                print(f"    {name:18s} {spread([x[j + 1] for x in v])} us")


def kernel_activities(fp4, out: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    result = {}
    for m, n, k in SHAPES:
        fn = engine_call(fp4, m, n, k)
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        spans = sorted(
            (e.name[:80], e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA"
        )
        spans.sort(key=lambda s: s[1])
        result[f"{m}x{n}x{k}"] = spans
        engine = [s for s in spans if "engine_kernel" in s[0]]
        print(f"{m}x{n}x{k}: engine kernel median {statistics.median(s[2] - s[1] for s in engine):.2f} us")
        for name, start, end in spans[-6:]:
            print(f"    {start - spans[-6][1]:8.2f} +{end - start:7.2f} us  {name}")
    out.write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("timeline", "kernels", "summary"))
    parser.add_argument("repo", type=Path, help="repository whose build/ holds a variant (summary: the text file)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/engine-timeline.txt"))
    parser.add_argument("--ghz", type=float, default=1.98, help="SM clock for the cycle counts (summary)")
    args = parser.parse_args()
    if args.mode == "summary":
        summarize(args.repo, args.ghz)
        return
    fp4 = get_local_kernel(args.repo)
    if args.mode == "timeline":
        capture_timelines(fp4, args.out)
        summarize(args.out, args.ghz)
    else:
        kernel_activities(fp4, args.out)


if __name__ == "__main__":
    main()
