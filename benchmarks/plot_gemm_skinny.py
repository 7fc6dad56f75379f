"""PNG plot of a bench_gemm_skinny.py result: for each weight shape, the fraction of the copy bandwidth
(measured in the same run) that each format reaches at M = 1 and M = 16, and cuBLAS bf16's at M = 1
(its bytes counted the same way: the bf16 weight it reads).

    python benchmarks/plot_gemm_skinny.py                 # results/h200-gemm-skinny.json -> .png
    python benchmarks/plot_gemm_skinny.py RESULT.json --out PLOT.png
    python benchmarks/plot_gemm_skinny.py --table         # the README's two tables, markdown

matplotlib is imported only here (pip install matplotlib): neither the tests nor CI need it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULT = ROOT / "benchmarks" / "results" / "h200-gemm-skinny.json"
FORMATS = ("nvfp4", "mxfp4", "mxfp8", "w4a16-nvfp4", "w4a16-mxfp4")


def dense_rows(result: dict) -> list[dict]:
    """The dense decode rows (the grouped and streaming-layout rows are left out)."""
    skipped = ("group", "fp4_w4a4_gemv_warpsplit_interleaved")
    return [r for r in result["rows"] if not r["op"].startswith(skipped) and "grouping" not in r]


def row_of(rows: list[dict], shape: tuple[int, int], fmt: str, m: int) -> dict | None:
    """The run's row of one (shape, format, M), None where it has none."""
    hits = [r for r in rows if (r["N"], r["K"]) == shape and r["format"] == fmt and r["M"] == m]
    return hits[0] if hits else None


def fraction(rows: list[dict], shape: tuple[int, int], fmt: str, m: int) -> float:
    """The fraction of copy bandwidth of one (shape, format, M) row, 0 where the run has none."""
    hit = row_of(rows, shape, fmt, m)
    return hit["fraction_of_copy_bw"] if hit else 0.0


def dense_table(result: dict) -> str:
    """Per weight shape: cuBLAS bf16 at M = 1, then each format's M = 1 / 16 times and fractions."""
    rows = dense_rows(result)
    shapes = list(dict.fromkeys((r["N"], r["K"]) for r in rows))  # the run's order
    head = ["(N, K)", "weight MB", "cuBLAS bf16 M=1 us"] + [f"{f} M=1 / 16 us (fraction)" for f in FORMATS]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|" + "---|" * len(FORMATS)]
    for n, k in shapes:
        first = row_of(rows, (n, k), "nvfp4", 1)
        cells = [f"{n}, {k}", f"{n * k / 2 / 1e6:.0f}", f"{first['cublas_bf16_us']:.1f}" if first else "-"]
        for fmt in FORMATS:
            one, sixteen = row_of(rows, (n, k), fmt, 1), row_of(rows, (n, k), fmt, 16)
            if one is None or sixteen is None:
                cells.append("-")
                continue
            cells.append(
                f"{one['ours_us']:.1f} / {sixteen['ours_us']:.1f}"
                f" ({one['fraction_of_copy_bw']:.2f} / {sixteen['fraction_of_copy_bw']:.2f})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def grouped_table(result: dict) -> str:
    """The grouped-decode rows against torch._grouped_mm bf16."""
    head = ["op", "format", "E x rows", "(N, K)", "ours us", "torch._grouped_mm bf16 us", "x grouped_mm"]
    lines = ["| " + " | ".join([*head, "fraction of copy bw"]) + " |", "|---|---|---|---|---:|---:|---:|---:|"]
    for r in (r for r in result["rows"] if "grouping" in r):
        lines.append(
            f"| `{r['op']}` | {r['format']} | {r['E']} x {r['rows_per_group']} | {r['N']}, {r['K']}"
            f" | {r['ours_us']:.0f} | {r['torch_grouped_mm_bf16_us']:.0f} | {r['ratio_vs_torch_grouped_mm_bf16']:.2f}"
            f" | {r['fraction_of_copy_bw']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", nargs="?", type=Path, default=DEFAULT_RESULT)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", action="store_true", help="print the README tables instead of plotting")
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    if args.table:
        print(dense_table(result) + "\n\n" + grouped_table(result))
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = dense_rows(result)
    shapes = sorted({(r["N"], r["K"]) for r in rows}, key=lambda s: -s[0] * s[1])
    fig, ax = plt.subplots(figsize=(15, 5))
    width = 0.8 / (2 * len(FORMATS) + 1)
    for i, (fmt, m) in enumerate((f, m) for f in FORMATS for m in (1, 16)):
        ys = [fraction(rows, s, fmt, m) for s in shapes]
        ax.bar(
            [j + i * width for j in range(len(shapes))], ys, width, label=f"{fmt} M={m}", alpha=1.0 if m == 1 else 0.55
        )
    cublas = []
    for s in shapes:
        r = next(r for r in rows if (r["N"], r["K"]) == s and r["M"] == 1)
        cublas.append(2 * s[0] * s[1] / r["cublas_bf16_us"] / 1e3 / r["copy_bw"])
    ax.bar(
        [j + 2 * len(FORMATS) * width for j in range(len(shapes))], cublas, width, label="cuBLAS bf16 M=1", color="gray"
    )
    ax.axhline(0.8, color="red", linestyle="--", linewidth=1, label="target on >= 40 MB weights (0.8)")
    ax.set_xticks([j + 0.4 for j in range(len(shapes))], [f"{n}x{k}" for n, k in shapes], fontsize=8)
    ax.set_ylabel("fraction of copy bandwidth")
    ax.set_title(f"M <= 16 decode, weights from HBM; {result['gpu']}, copy {result['copy_bw_GBps']:.0f} GB/s")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(args.out or args.result.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
