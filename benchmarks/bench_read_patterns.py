"""The weight-read ceiling of the register-streaming kernel's grid: pure reads of a [N, row_bytes]
uint8 weight (no decode, no mma, no scale codes, no activations), with that kernel's work split (a CTA
of W warps owns P consecutive 16-row tiles, its warps split a row into 128-byte steps, two register
sets in turn, non-allocating 16-byte loads), in three access patterns, and a grid-stride linear read:

  0 kernel: lane (g, t) reads rows g and g + 8, chunks 2t and 2t + 1 of a step (the kernel's pattern:
    one load instruction is 64 bytes of each of 8 rows);
  1 lines: one load instruction is a whole 128-byte line of each of 4 rows;
  2 linear: a CTA's 16-row tile is one contiguous region, a warp step reads 2 KB of it in order;
  3 grid-stride: 132 x 8 CTAs of 256 threads, 16 bytes a thread (a copy's read side).

Each is timed two ways: `flush_us`, one call after an L2 clear (triton.testing.do_bench, the method of
bench_gemm_skinny.py), and `graph_us`, 8 calls on 8 weight copies replayed from one CUDA graph (each
copy cold, as in a decode step of many layers), per call. Needs a CUDA compiler (the kernels are built
with torch.utils.cpp_extension.load_inline, ~1 min).

    python benchmarks/bench_read_patterns.py --out benchmarks/results/h200-read-patterns.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
import triton
from bench_common import RESULTS, graph_us, write_results
from torch.utils.cpp_extension import load_inline

COPIES, REPLAYS = 8, 10
# (N, row bytes, tiles per CTA, warps per CTA): the register-streaming kernel's plans for NVFP4 at
# M = 1 on (17408, 5120) (and P = 2), (8192, 8192) and (4096, 7168).
CASES = ((17408, 2560, 3, 5), (17408, 2560, 2, 5), (8192, 4096, 2, 8), (4096, 3584, 1, 7))
PATTERNS = {0: "kernel", 1: "lines", 2: "linear", 3: "grid-stride"}

SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ unsigned fold(const uint4 (&v)[4]) {
  unsigned x = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) x ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  return x;
}

// One warp step: 2 KB of a 16-row tile, as four 16-byte loads a lane.
template <int kPattern>
__device__ __forceinline__ void load_step(const uint8_t* tile, int row_bytes, int step, int lane, uint4 (&v)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* p;
    if (kPattern == 0) {
      p = tile + long((lane >> 2) + 8 * (i >> 1)) * row_bytes + step * 128 + (2 * (lane & 3) + (i & 1)) * 16;
    } else if (kPattern == 1) {
      p = tile + long(i * 4 + lane / 8) * row_bytes + step * 128 + (lane % 8) * 16;
    } else {
      p = tile + long(step) * 2048 + i * 512 + lane * 16;
    }
    v[i] = load_streaming(p);
  }
}

template <int kPattern>
__global__ void __launch_bounds__(256) tile_read(const uint8_t* b, long n, int row_bytes, int tiles_per_cta,
                                                 unsigned* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int steps = row_bytes / 128;
  const int begin = warp * steps / warps, end = (warp + 1) * steps / warps;
  unsigned x = 0;
  for (int p = 0; p < tiles_per_cta; ++p) {
    const long tile = long(blockIdx.x) * tiles_per_cta + p;
    if (tile * 16 >= n) break;
    const uint8_t* base = b + tile * 16 * long(row_bytes);
    uint4 even[4], odd[4];
    if (begin < end) load_step<kPattern>(base, row_bytes, begin, lane, even);
    for (int s = begin; s < end; s += 2) {
      if (s + 1 < end) load_step<kPattern>(base, row_bytes, s + 1, lane, odd);
      x ^= fold(even);
      if (s + 1 < end) {
        if (s + 2 < end) load_step<kPattern>(base, row_bytes, s + 2, lane, even);
        x ^= fold(odd);
      }
    }
  }
  if (x == 0x9E3779B9u) sink[threadIdx.x] = x;  // keeps the loads; practically never true
}

__global__ void grid_stride_read(const uint4* b, long count, unsigned* sink) {
  unsigned x = 0;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < count; i += long(gridDim.x) * blockDim.x) {
    const uint4 v = load_streaming(b + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9E3779B9u) sink[threadIdx.x] = x;
}

void read_weight(torch::Tensor b, int64_t pattern, int64_t tiles_per_cta, int64_t warps, torch::Tensor sink) {
  const long n = b.size(0);
  const int row_bytes = int(b.size(1));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto* values = b.data_ptr<uint8_t>();
  auto* out = reinterpret_cast<unsigned*>(sink.data_ptr<int>());
  const long ctas = (n / 16 + tiles_per_cta - 1) / tiles_per_cta;
  const int threads = int(warps) * 32;
  switch (pattern) {
    case 0: tile_read<0><<<ctas, threads, 0, stream>>>(values, n, row_bytes, int(tiles_per_cta), out); break;
    case 1: tile_read<1><<<ctas, threads, 0, stream>>>(values, n, row_bytes, int(tiles_per_cta), out); break;
    case 2: tile_read<2><<<ctas, threads, 0, stream>>>(values, n, row_bytes, int(tiles_per_cta), out); break;
    default:
      grid_stride_read<<<132 * 8, 256, 0, stream>>>(reinterpret_cast<const uint4*>(values), b.numel() / 16, out);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS / "h200-read-patterns.json")
    args = parser.parse_args()
    declaration = "void read_weight(torch::Tensor b, int64_t pattern, int64_t tiles, int64_t warps, torch::Tensor s);"
    flags = ["-O3", "-gencode=arch=compute_90a,code=sm_90a"]
    module = load_inline("fp4_gemm_read_patterns", cpp_sources=declaration, cuda_sources=SOURCE,
                         functions=["read_weight"], extra_cuda_cflags=flags)  # fmt: skip
    sink = torch.zeros(256, dtype=torch.int32, device="cuda")
    rows = []
    for n, row_bytes, tiles, warps in CASES:
        weights = [torch.randint(0, 255, (n, row_bytes), dtype=torch.uint8, device="cuda") for _ in range(COPIES)]
        for pattern, name in PATTERNS.items():
            calls = [functools.partial(module.read_weight, w, pattern, tiles, warps, sink) for w in weights]
            flush = 1000 * triton.testing.do_bench(calls[0], warmup=10, rep=40, return_mode="median")
            graph = graph_us(calls, REPLAYS)
            rows.append({"N": n, "row_bytes": row_bytes, "tiles_per_cta": tiles, "warps": warps, "pattern": name,
                         "flush_us": round(flush, 2), "graph_us": round(graph, 2),
                         "flush_TBps": round(n * row_bytes / flush / 1e6, 2),
                         "graph_TBps": round(n * row_bytes / graph / 1e6, 2)})  # fmt: skip
            print(rows[-1], flush=True)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
