"""What every benchmark script shares: loading the package, timing, and writing the results JSON."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import triton.testing
from kernels import get_kernel, get_local_kernel
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def load() -> object:
    """The package: the local build (build/), or the Hub's with LOCAL_KERNELS set (kernels' override)."""
    if "LOCAL_KERNELS" in os.environ:
        return get_kernel("org/fp4-gemm", version=1, trust_remote_code=True)
    return get_local_kernel(ROOT)


class _ReferenceOps(TorchDispatchMode):
    """Runs the package's registered ops with their reference implementations (PyTorch ops on the
    tensors' device) instead of its kernels."""

    def __init__(self, fp4) -> None:
        super().__init__()
        self.namespace, self.impls = fp4.ops.name, fp4._registry.REFERENCE_IMPLS

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == self.namespace:
            return self.impls[func._opname](*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def on_reference(fp4, function: Callable) -> Callable:
    """The public function with its op run by the reference on the GPU: the peer "the same op done
    with PyTorch ops" (the public function's own validation and allocation included)."""

    def call(*args: object, **kwargs: object) -> object:
        with _ReferenceOps(fp4):
            return function(*args, **kwargs)

    return call


def median_us(fn: Callable[[], object], warmup: int = 25, rep: int = 200) -> float:
    """Median of CUDA-event timings, microseconds."""
    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def events_us(run: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over `repeats` of run()'s CUDA-event time, per call of the `calls` it makes, after one
    warm-up run."""
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def graph_us(calls: Sequence[Callable[[], object]], repeats: int) -> float:
    """The calls captured in one CUDA graph (warmed up off the capture stream, as torch.cuda.graph
    asks) and replayed: events_us of a replay, per call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return events_us(graph.replay, len(calls), repeats)


def write_results(path: Path, rows: list, **extra: object) -> None:
    """{"gpu": <this GPU's name>, **extra, "rows": rows} as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), **extra, "rows": rows}
    path.write_text(json.dumps(result, indent=1) + "\n")


def run(default_name: str, collect: Callable[[object], list]) -> None:
    """A script's main: --out (default results/<default_name>), then collect(package) on seed 0, written."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / default_name)
    args = parser.parse_args()
    fp4 = load()
    torch.manual_seed(0)
    write_results(args.out, collect(fp4))
