"""The Hopper engine (sm90_engine, by name) of several builds of the package in one process: an A/B of
kernel changes on the same operands, with the outputs compared bit for bit against the first build.

Each build is a repository path whose build/ holds a variant (tools/build.py writes one); builds of
different sources load side by side (their op namespaces are content hashes). Per row: cuBLAS bf16 on
the exactly dequantized operands, then each build's engine; medians of triton.testing.do_bench (L2
cleared before every run). Ratio = cuBLAS time / the build's time.

    python benchmarks/bench_engine_builds.py base=/path/to/old/repo new=. --json /tmp/ab.json

`--variants 1,2` times each build's engine once per variant (columns build:variant, e.g. the 128 x 256
and the 64 x 256 tiles of one build); outputs are compared bit for bit among the columns of one
variant. `--splits 1,4,8` likewise per GemmCall.splits of the dense rows (columns build:sS: the
skinny kernels' K split over a cluster, or the engine's under experiments/engine-cluster-split-k.patch;
0: dispatch's choice). `--backends sm90_engine,composition` times each build's
dense rows on those backends, by name (columns build:backend; outputs compared among the columns of
one backend): where the fused engine and the composition floor cross. `--shapes 64x4096x7168,...`
(or "" for none) and `--formats nvfp4,mxfp8` replace the default rows; `--no-masked` leaves out the
grouped rows. `--contiguous 64x16,256x64` adds MoE decode rows of group_contiguous_gemm (experts x
tokens, each token routed to 8 random experts, rows sorted by expert; weights CONTIGUOUS_NK; peer
torch._grouped_mm on the bf16 operands), on whichever backend serves them.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import torch
import triton.testing
from bench_gemm_skinny import grouped_mm_bf16
from kernels import get_local_kernel

MODES = {"mxfp8": "w8a8-mxfp8", "mxfp4": "w4a4-mxfp4", "nvfp4": "w4a4-nvfp4"}
FORMATS = ("nvfp4", "mxfp8", "mxfp4", "w4a16")  # w4a16: bf16 activations x NVFP4 weights
SHAPES = (
    (64, 4096, 7168),
    (256, 4096, 7168),
    (64, 17408, 5120),
    (256, 17408, 5120),
    (512, 17408, 5120),
    (1024, 17408, 5120),
    (2048, 17408, 5120),
    (256, 7168, 2048),
    (512, 7168, 2048),
)
MASKED = (8, 256, 4096, 7168)  # experts, rows per expert, N, K
CONTIGUOUS_NK, CONTIGUOUS_TOPK = (2048, 7168), 8


def median_us(fn) -> float:
    return 1000.0 * triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def dense_operands(fp4, ref, fmt: str, xa: torch.Tensor, xb: torch.Tensor):
    """(A, sfa, B, sfb, a_format, b_format, A bf16, B bf16) of one format."""
    if fmt == "w4a16":
        b, sfb = fp4.group_wise_quant(xb, MODES["nvfp4"])
        return xa, None, b, sfb, "bf16", "nvfp4", xa, ref.dequantize(b, sfb, ref.FORMATS["nvfp4"]).to(torch.bfloat16)
    a, sfa = fp4.group_wise_quant(xa, MODES[fmt])
    b, sfb = fp4.group_wise_quant(xb, MODES[fmt])
    dq = [ref.dequantize(v, s, ref.FORMATS[fmt]).to(torch.bfloat16) for v, s in ((a, sfa), (b, sfb))]
    return a, sfa, b, sfb, fmt, fmt, *dq


def timed(builds: dict, make_fn, shape, columns: dict | None = None) -> tuple[dict, bool]:
    """Each (build, column)'s median and whether every build's output equals the first build's of the
    same column bit for bit. columns: {(variant, backend, splits): label suffix}, default the engine as
    is."""
    columns = columns or {(-1, "sm90_engine", 0): ""}
    times, firsts, same = {}, {}, True
    for name, fp4 in builds.items():
        for column, suffix in columns.items():
            out = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
            fn = make_fn(fp4, out, *column)
            fn()
            first = firsts.setdefault(column, out.clone())
            same = same and torch.equal(first.view(torch.int16), out.view(torch.int16))
            times[name + suffix] = median_us(fn)
    return times, same


def column_labels(variants: tuple[int, ...], backends: tuple[str, ...], splits: tuple[int, ...]) -> dict:
    """{(variant, backend, splits): ":variant", ":backend" and/or ":sS" where more than one of them is
    timed}."""
    return {
        (v, b, s): (f":{v}" if len(variants) > 1 else "")
        + (f":{b}" if len(backends) > 1 else "")
        + (f":s{s}" if len(splits) > 1 else "")
        for b in backends
        for v in variants
        for s in splits
    }


def report(tag: str, peer_us: float, times: dict, same: bool, peer: str = "cublas") -> str:
    first = next(iter(times.values()))
    cells = " ".join(f"{k} {v:7.1f} ({peer_us / v:.2f}, {first / v:.3f})" for k, v in times.items())
    return f"{tag} {peer} {peer_us:7.1f} | {cells} | bitwise equal {same}"


def routed_ids(experts: int, tokens: int, seed: int) -> torch.Tensor:
    """Expert ids of tokens x CONTIGUOUS_TOPK rows, each token's experts distinct, sorted."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    picks = torch.rand(tokens, experts, generator=g, device="cuda").argsort(dim=1)[:, :CONTIGUOUS_TOPK]
    return picks.flatten().sort().values.to(torch.int32)


def expert_weights(rows: int, k: int, chunk: int = 1 << 16):
    """bf16 weight rows in chunks of whole 128-row scale tiles (a float32 randn of all would not fit)."""
    for first in range(0, rows, chunk):
        yield (torch.randn(min(chunk, rows - first), k, device="cuda") * 0.05).to(torch.bfloat16)


def contiguous_rows(builds: dict, ref, cases: list[tuple[int, int]], fmt: str = "nvfp4") -> list[dict]:
    """One row per (experts, tokens): group_contiguous_gemm of every build, torch._grouped_mm the peer."""
    fp4 = next(iter(builds.values()))
    n, k = CONTIGUOUS_NK
    rows = []
    for experts, tokens in cases:
        ids = routed_ids(experts, tokens, experts + tokens)
        x = torch.randn(ids.numel(), k, device="cuda").to(torch.bfloat16)
        a, sfa = fp4.group_wise_quant(x, MODES[fmt])
        parts = [fp4.group_wise_quant(w, MODES[fmt]) for w in expert_weights(experts * n, k)]
        b, sfb = torch.cat([v for v, _ in parts]), torch.cat([s for _, s in parts])
        alpha = torch.ones(experts, device="cuda")
        a_bf = ref.dequantize(a, sfa, ref.FORMATS[fmt]).to(torch.bfloat16)
        b_bf = ref.dequantize(b, sfb, ref.FORMATS[fmt]).to(torch.bfloat16).reshape(experts, n, k)
        offs = torch.bincount(ids.long(), minlength=experts).cumsum(0).to(torch.int32)
        peer = median_us(grouped_mm_bf16(a_bf, b_bf, offs))
        b = b.reshape(experts, n, -1)

        def contiguous(mod, out, variant, backend, splits, a=a, sfa=sfa, b=b, sfb=sfb, ids=ids, alpha=alpha):
            return lambda: mod.group_contiguous_gemm(a, b, sfa, sfb, ids, out, alpha=alpha, mode=MODES[fmt])

        times, same = timed(builds, contiguous, (ids.numel(), n))
        rows.append(dict(grouping="contiguous", experts=experts, tokens=tokens, topk=CONTIGUOUS_TOPK, m=ids.numel(),
                         n=n, k=k, fmt=fmt, grouped_mm_us=peer, bitwise_equal=same, us=times))  # fmt: skip
        tag = f"contiguous {experts}x{tokens} m={ids.numel()} {n} {k} {fmt}"
        print(report(tag, peer, times, same, peer="grouped_mm"), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", help="name=repository path, the first is the reference")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--variants", default="-1", help="comma-separated engine variants (GemmCall.variant)")
    parser.add_argument("--backends", default="sm90_engine", help="comma-separated backends of the dense rows")
    parser.add_argument("--splits", default="0", help="comma-separated GemmCall.splits of the dense rows")
    parser.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: SHAPES)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of " + ", ".join(FORMATS))
    parser.add_argument("--no-masked", action="store_true", help="leave out the grouped masked rows")
    parser.add_argument("--contiguous", default="", help="comma-separated EXPERTSxTOKENS decode rows")
    args = parser.parse_args()
    variants = tuple(int(v) for v in args.variants.split(","))
    splits = tuple(int(s) for s in args.splits.split(","))
    columns = column_labels(variants, tuple(args.backends.split(",")), splits)
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",") if s]
    formats = args.formats.split(",")
    builds = {name: get_local_kernel(Path(path)) for name, path in (b.split("=", 1) for b in args.builds)}
    fp4 = next(iter(builds.values()))
    ref = importlib.import_module(fp4.__name__ + ".reference")
    rows = []
    for m, n, k in shapes:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        xa = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        xb = (torch.randn(n, k, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        cublas = None
        for fmt in formats:
            a, sfa, b, sfb, af, bf, a_bf, b_bf = dense_operands(fp4, ref, fmt, xa, xb)
            cublas = cublas or median_us(lambda a_bf=a_bf, b_bf=b_bf: torch.mm(a_bf, b_bf.T))

            def engine(mod, out, variant, backend, splits, a=a, sfa=sfa, b=b, sfb=sfb, af=af, bf=bf):
                call = mod._gemm.GemmCall(a, b, sfa, sfb, af, bf, out=out, variant=variant, splits=splits)
                return lambda: call.run_on(backend)

            times, same = timed(builds, engine, (m, n), columns)
            rows.append(dict(m=m, n=n, k=k, fmt=fmt, cublas_us=cublas, bitwise_equal=same, us=times))
            print(report(f"{m:5d} {n:6d} {k:5d} {fmt:6s}", cublas, times, same), flush=True)
    experts, per, n, k = MASKED
    for fmt in () if args.no_masked else ("nvfp4", "mxfp8"):
        x = torch.randn(experts * per, k, device="cuda").to(torch.bfloat16)
        a, sfa = fp4.group_wise_quant(x, MODES[fmt])
        parts = [
            fp4.group_wise_quant((torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16), MODES[fmt])
            for _ in range(experts)
        ]
        b, sfb = torch.stack([v for v, _ in parts]), torch.cat([s for _, s in parts])
        counts = torch.full((experts,), per, dtype=torch.int32, device="cuda")
        alpha = torch.ones(experts, device="cuda")
        a_bf = ref.dequantize(a, sfa, ref.FORMATS[fmt]).to(torch.bfloat16).reshape(experts, per, k)
        b_bf = torch.stack([ref.dequantize(v, s, ref.FORMATS[fmt]).to(torch.bfloat16) for v, s in parts])
        bmm = median_us(lambda a_bf=a_bf, b_bf=b_bf: torch.bmm(a_bf, b_bf.transpose(1, 2)))

        def masked(mod, out, variant, backend, splits, a=a, sfa=sfa, b=b, sfb=sfb, fmt=fmt, counts=counts, alpha=alpha):
            return lambda: mod.group_masked_gemm(
                a, b, sfa, sfb, counts, out, alpha=alpha, max_m_per_expert=per, mode=MODES[fmt]
            )

        times, same = timed(builds, masked, (experts * per, n))
        rows.append(
            dict(
                grouping="masked",
                experts=experts,
                m=per,
                n=n,
                k=k,
                fmt=fmt,
                cublas_us=bmm,
                bitwise_equal=same,
                us=times,
            )
        )
        print(report(f"masked {experts}x{per} {n} {k} {fmt:6s}", bmm, times, same), flush=True)
    cases = [tuple(map(int, c.split("x"))) for c in args.contiguous.split(",") if c]
    rows += contiguous_rows(builds, ref, cases)
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
