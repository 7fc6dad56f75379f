"""Markdown tables of a bench_gemm.py result: every row (the result's .md) and the README excerpt.

    python benchmarks/gemm_table.py                        # README excerpt of results/h200-gemm.json
    python benchmarks/gemm_table.py RESULT.json --shapes 17408x5120 4096x7168
    python benchmarks/gemm_table.py RESULT.json --all      # every row, as bench_gemm.py writes the .md

x = peer time / our time (above 1: ours faster); "-" = not run or failed its check (the JSON's notes
say which). Imports neither torch nor matplotlib: it reads the JSON only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULT = ROOT / "benchmarks" / "results" / "h200-gemm.json"
# the README's excerpt: two of the qualification shapes and both MoE expert shapes
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


def ratio(peer: str, header: str) -> Column:
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
    ratio("cublas_bf16", "bf16"), ratio("fp8_rowwise", "fp8 row"), ratio("dequant_mm", "deq+mm"),
    ratio("triton_dequant_mm", "triton deq+mm"), ratio("triton_dot_scaled", "triton dot_scaled"), *CEILING,
)  # fmt: skip

README_COLUMNS = (
    FORMAT, *SHAPE, BACKEND, OURS_US, Column("TFLOP/s", number("tflops", 0)),
    ratio("cublas_bf16", "cuBLAS bf16"), ratio("fp8_rowwise", "fp8 row-wise"),
    ratio("triton_dequant_mm", "Triton deq+mm"), ratio("triton_dot_scaled", "Triton dot_scaled"), *CEILING,
)  # fmt: skip


def table(rows: list[dict], columns: tuple[Column, ...]) -> str:
    lines = [
        "| " + " | ".join(c.header for c in columns) + " |",
        "|" + "".join("---:|" if c.numeric else "---|" for c in columns),
    ]
    lines += ["| " + " | ".join(c.cell(row) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def caption(result: dict) -> str:
    return (
        f"{result['gpu']}, torch {result['torch']}, triton {result['triton']}, {result['date']}. "
        "x = peer time / our time (above 1: ours faster); - = not run or failed its check (see the JSON notes). "
        "engine bf16 = the Hopper engine on bf16 operands (no decode): the ceiling of its pipeline."
    )


def markdown(result: dict) -> str:
    """Every row: the .md bench_gemm.py writes beside its JSON."""
    return caption(result) + "\n\n" + table(result["rows"], FULL_COLUMNS)


def readme_table(result: dict, shapes: tuple[tuple[int, int], ...] = README_SHAPES) -> str:
    """The README excerpt: the rows of the given (N, K) shapes, in the JSON's order."""
    wanted = set(shapes)
    return table([r for r in result["rows"] if (r["N"], r["K"]) in wanted], README_COLUMNS)


def parse_shape(value: str) -> tuple[int, int]:
    n, k = value.lower().split("x")
    return int(n), int(k)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, nargs="?", default=DEFAULT_RESULT)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=list(README_SHAPES), help="NxK ...")
    parser.add_argument("--all", action="store_true", help="every row and column (the result's .md)")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    rendered = markdown(result) if args.all else readme_table(result, tuple(args.shapes))
    print(rendered, end="")
    return rendered


if __name__ == "__main__":
    main()
