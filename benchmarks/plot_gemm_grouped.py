"""PNG plot and Markdown table of a bench_gemm_grouped.py result: for each case and (N, K), the time of
ours and of the peers measured in the same run (bars, microseconds, logarithmic), NVFP4 and MXFP8 rows of
group_masked_gemm.

    python benchmarks/plot_gemm_grouped.py                  # results/h200-gemm-grouped.json -> .png, .md
    python benchmarks/plot_gemm_grouped.py RESULT.json --out PLOT.png

matplotlib is imported only here (pip install matplotlib): neither the tests nor CI need it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULT = ROOT / "benchmarks" / "results" / "h200-gemm-grouped.json"
SERIES = {
    "ours_us": ("ours", "black"),
    "dense_engine_us": ("E serial dense calls (ours)", "tab:gray"),
    "torch_grouped_mm_bf16_us": ("torch._grouped_mm bf16", "tab:blue"),
    "torch_scaled_grouped_mm_fp8_us": ("torch._scaled_grouped_mm fp8 row-wise", "tab:cyan"),
}
TABLE_COLUMNS = (
    "op", "format", "case", "N", "K", "ours_us", "dense_engine_us", "torch_grouped_mm_bf16_us",
    "torch_scaled_grouped_mm_fp8_us", "ratio_vs_dense_engine", "ratio_vs_torch_grouped_mm_bf16",
)  # fmt: skip


def table(rows: list[dict]) -> str:
    """Every row of the result as a Markdown table (x = peer time / our time)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(c) is None else str(r.get(c)) for c in TABLE_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["op"] == "group_masked_gemm"]
    formats = ("nvfp4", "mxfp8")
    fig, axes = plt.subplots(len(formats), 1, figsize=(14, 4.5 * len(formats)), squeeze=False)
    for ax, fmt in zip(axes[:, 0], formats, strict=True):
        panel = [r for r in rows if r["format"] == fmt]
        labels = [f"{r['case']}\n{r['N']}x{r['K']}" for r in panel]
        width = 0.8 / len(SERIES)
        for i, (key, (label, color)) in enumerate(SERIES.items()):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", nargs="?", type=Path, default=DEFAULT_RESULT)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    out = args.out or args.result.with_suffix(".png")
    plot(result, out)
    out.with_suffix(".md").write_text(table(result["rows"]))


if __name__ == "__main__":
    main()
