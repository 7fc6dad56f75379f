"""PNG plot of a bench_gemm.py result: TFLOP/s against M (both axes logarithmic), one line per method,
one panel per (format, N, K): a row of panels per format, a column per (N, K). The engine's bf16 ceiling
(the Hopper engine on bf16 operands) is drawn dotted; each title says which backend served ours at which M.

    python benchmarks/plot_gemm.py                      # benchmarks/results/h200-gemm.json -> .png
    python benchmarks/plot_gemm.py RESULT.json --out PLOT.png

matplotlib is imported only here (pip install matplotlib): neither the tests nor CI need it. A peer
that failed its correctness check against ours is left out of the plot, as it is out of the ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULT = ROOT / "benchmarks" / "results" / "h200-gemm.json"
FORMAT_ORDER = ("mxfp8", "mxfp4", "nvfp4", "e0m3")
# method -> (label, matplotlib style); bench_gemm.PEERS and bench_gemm.CEILING, without importing torch
METHODS = {
    "ours": ("ours", {"color": "black", "linewidth": 2.4, "marker": "o"}),
    "cublas_bf16": ("cuBLAS bf16 (dequantized)", {"color": "tab:blue", "marker": "s"}),
    "scaled_mm_fp8_rowwise": ("torch._scaled_mm fp8 row-wise", {"color": "tab:cyan", "marker": "v", "linestyle": "--"}),
    "dequant_mm": ("PyTorch dequant + mm", {"color": "tab:orange", "marker": "^"}),
    "triton_dequant_mm": ("Triton dequant + mm", {"color": "tab:green", "marker": "D"}),
    "triton_dot_scaled": ("Triton dot_scaled", {"color": "tab:red", "marker": "x"}),
    "engine_bf16_ceiling": ("engine, bf16 operands (ceiling)", {"color": "gray", "marker": ".", "linestyle": ":"}),
}


def tflops_series(rows: list[dict], method: str) -> tuple[list[int], list[float]]:
    """(M values, TFLOP/s) of one method over rows of one panel; peers that failed their check are skipped."""
    ms, values = [], []
    for r in sorted(rows, key=lambda r: r["M"]):
        us = r.get(f"{method}_us")
        check = (r.get("peer_check") or {}).get(method)
        if not us or (method != "ours" and not (check and check.get("ok"))):
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


def panels(rows: list[dict]) -> tuple[list[str], list[tuple[int, int]]]:
    """Formats (in FORMAT_ORDER) and (N, K) shapes (in order of appearance) present in the rows."""
    formats = [f for f in FORMAT_ORDER if any(r["format"] == f for r in rows)]
    shapes = list(dict.fromkeys((r["N"], r["K"]) for r in rows))
    return formats, shapes


def plot(result: dict, out: Path) -> None:
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit("plot_gemm.py needs matplotlib: pip install matplotlib") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    formats, shapes = panels(rows)
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
    handles, labels = {}, {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
            labels[label] = label
    fig.legend(list(handles.values()), list(labels), loc="upper center", ncol=len(handles), fontsize=9,
               bbox_to_anchor=(0.5, 1.0))  # fmt: skip
    fig.suptitle(f"{result.get('gpu')}, torch {result.get('torch')}, triton {result.get('triton')}, "
                 f"{result.get('date', '')}: TFLOP/s = 2MNK / time", y=1.03, fontsize=11)  # fmt: skip
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, nargs="?", default=DEFAULT_RESULT)
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: the result's path, .png)")
    args = parser.parse_args(argv)
    out = args.out or args.result.with_suffix(".png")
    plot(json.loads(args.result.read_text()), out)
    print(out)
    return out


if __name__ == "__main__":
    main()
