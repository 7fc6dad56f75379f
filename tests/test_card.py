"""CARD.md is kernel-builder's card template: `kernel-builder fill-card` (run by `nix build .#bundle`;
the upload pushes the result as the Hub README) renders it with minijinja, trim_blocks on, and the
variables of kernel-builder's card.rs: repo_id and version (build.toml), functions (the string entries
of __init__.py's __all__ except "layers"), layers (layers.py's classes, only when __all__ names
"layers"), has_benchmark (benchmarks/benchmark.py exists), upstream and source (build.toml), license
(build.toml, lower-cased). Jinja2 renders the same template language here."""

from __future__ import annotations

import ast
import json
import re

import jinja2
import pytest
from conftest import ROOT, build_config, requires_repo_file

CARD = requires_repo_file("CARD.md")
PACKAGE = ROOT / "torch-ext" / "fp4_gemm"


def module_all(path) -> list[str]:
    """__all__ as card.rs reads it: the first assignment of a list of string constants."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def layer_classes() -> list[str]:
    return [n.name for n in ast.parse((PACKAGE / "layers.py").read_text()).body if isinstance(n, ast.ClassDef)]


def card_context() -> dict:
    general = build_config()["general"]
    names = module_all(PACKAGE / "__init__.py")
    return {
        "repo_id": general["hub"]["repo-id"],
        "version": general["version"],
        "functions": [n for n in names if n != "layers"] or None,
        "layers": layer_classes() if "layers" in names else None,
        "has_benchmark": (ROOT / "benchmarks" / "benchmark.py").exists(),
        "upstream": general.get("upstream"),
        "source": general.get("source"),
        "license": general["license"].lower(),
    }


def rendered() -> str:
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(CARD.read_text()).render(**card_context())


def test_card_renders_with_kernel_builders_variables():
    card, context = rendered(), card_context()
    assert "{{" not in card and "{%" not in card
    assert f'get_kernel("{context["repo_id"]}", version={context["version"]}, trust_remote_code=True)' in card
    assert f"kernels benchmark {context['repo_id']} --version {context['version']}" in card


def test_card_front_matter_is_the_hub_metadata():
    assert rendered().startswith("---\nlibrary_name: kernels\nlicense: apache-2.0\n")


def section(card: str, heading: str) -> str:
    return card.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_card_lists_every_public_function():
    listed = re.findall(r"^- `(\w+)`$", section(rendered(), "Functions"), flags=re.MULTILINE)
    assert listed == card_context()["functions"]


def test_card_names_every_layer_class():
    section = CARD.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    named = [name for name in re.findall(r"`(\w+Linear)`", section) if name in layer_classes()]
    assert sorted(set(named)) == sorted(layer_classes())


def table_rows(card: str, header: str) -> list[list[str]]:
    """The cells of the body rows of the table whose header line starts with `header`."""
    rows = []
    for line in card.split(header, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def test_card_gemm_table_is_the_measured_run():
    result = json.loads((ROOT / "benchmarks" / "results" / "h200-gemm.json").read_text())
    assert result["gpu"] == "NVIDIA H200"
    measured = {(r["format"], str(r["M"]), str(r["N"]), str(r["K"])): r for r in result["rows"]}
    rows = table_rows(rendered(), "| format | M | N | K | backend |")
    assert len(rows) == 15  # three formats x M = 1, 16, 64, 256, 4096
    for fmt, m, n, k, backend, us, tflops, bf16, triton_deq, dot_scaled in rows:
        r = measured[(fmt, m, n, k)]
        expected = [r["ours_backend"], f"{r['ours_us']:.1f}", f"{r['tflops']:.0f}", ratio(r["ratio_vs_cublas_bf16"]),
                    ratio(r["ratio_vs_triton_dequant_mm"]), ratio(r["ratio_vs_triton_dot_scaled"])]  # fmt: skip
        assert [backend, us, tflops, bf16, triton_deq, dot_scaled] == expected, f"{fmt} M={m} N={n} K={k}"


def test_card_quantizer_table_is_the_measured_run():
    result = json.loads((ROOT / "benchmarks" / "results" / "h200-quant.json").read_text())
    measured = {(r["op"], r["mode"]): r for r in result["rows"] if r["shape"] == [16384, 8192]}
    rows = table_rows(rendered(), "| op | mode | us |")
    assert len(rows) == 6
    for op, mode, us, fraction in rows:
        r = measured[(op.strip("`"), mode)]
        assert [us, fraction] == [f"{r['us']:.1f}", f"{r['fraction_of_copy_bw']:.2f}"], f"{op} {mode}"


def test_card_marks_every_blackwell_arch_compile_verified():
    rows = {row[0]: row[1] for row in table_rows(rendered(), "| arch | status |")}
    blackwell = [arch for arch in rows if arch.startswith(("sm_100, sm_103", "sm_110", "sm_120, sm_121"))]
    assert len(blackwell) == 3 and all(rows[arch].startswith("compile-verified") for arch in blackwell)


def test_card_lists_every_layer_and_the_benchmarks():
    """kernel-builder lists the layers only when __all__ names "layers", and shows the benchmark
    section only when benchmarks/benchmark.py exists."""
    card, context = rendered(), card_context()
    assert context["layers"] == ["NVFP4Linear", "MXFP4Linear", "MXFP8Linear", "W4A16NVFP4Linear"]
    assert re.findall(r"^- `(\w+)`$", section(card, "Layers"), flags=re.MULTILINE) == context["layers"]
    assert context["has_benchmark"] and "kernels benchmark" in card


def test_card_plot_exists():
    (plot,) = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", CARD.read_text())
    if not (ROOT / plot).is_file():
        pytest.fail(f"CARD.md shows {plot}, which is not in the repository")
