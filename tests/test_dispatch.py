"""The dispatch policy: one table (csrc/gemm/dispatch.cpp, op `gemm_dispatch_table`) that picks the
backend of every GEMM, documented row for row in docs/PERFORMANCE.md; backends that only say what
they can serve; gemm_on reaching every backend that can. Host-side: runs without a GPU."""

from __future__ import annotations

import re

import pytest
from cases import require_built
from conftest import ROOT, requires_repo_file

pytestmark = pytest.mark.kernels_ci

BACKENDS = {"skinny", "sm90_swap_ab", "composition", "sm90_engine", "sm100_cutlass", "sm110_cutlass", "sm120_cutlass",
            "e0m3_split", "staged"}  # fmt: skip
NO_LIMIT = 2**63 - 1


def table(fp4) -> list[dict]:
    columns = ("backend", "arch", "grouping", "min_rows", "max_rows", "operands", "condition", "reason", "evidence")
    return [dict(zip(columns, row, strict=True)) for row in zip(*fp4.ops.gemm_dispatch_table(), strict=True)]


def doc_row(row: dict) -> str:
    """The row as docs/PERFORMANCE.md's table shows it."""
    rows = f"{row['min_rows']}.." if row["max_rows"] == NO_LIMIT else f"{row['min_rows']}..{row['max_rows']}"
    condition = f"`{row['condition']}`" if row["condition"] else "-"
    evidence = f"`{row['evidence']}`" if row["evidence"] else "-"
    cells = [f"`{row['backend']}`", row["arch"], row["grouping"], rows, row["operands"], condition, row["reason"],
             evidence]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def test_every_row_names_a_backend_of_the_package(fp4):
    assert {row["backend"] for row in table(fp4)} == BACKENDS
    assert set(fp4.ops.gemm_backend_names()) <= BACKENDS


def test_every_row_gives_its_reason_and_a_result_file_that_exists(fp4):
    results = requires_repo_file("benchmarks/results")
    for row in table(fp4):
        assert row["reason"], row
        assert not row["evidence"] or (results / row["evidence"]).is_file(), row["evidence"]


def test_performance_doc_shows_the_table_as_the_build_has_it(fp4):
    doc = requires_repo_file("docs/PERFORMANCE.md").read_text()
    section = doc.split("## 1. Dispatch: one table", 1)[1].split("\n## ", 1)[0]
    documented = [line for line in section.splitlines() if line.startswith("| `")]
    assert documented == [doc_row(row) for row in table(fp4)]


def test_measured_thresholds_live_in_the_dispatch_file_only():
    """supports() says what a backend can serve; no backend keeps a threshold of the policy."""
    policy = requires_repo_file("csrc/gemm/dispatch.cpp").read_text()
    assert "kCompositionMinRowsSameFormat = 768" in policy and "kWideStreamMaxTileTokens = 1024" in policy
    for backend in ("csrc/gemm/composed/composition.cu", "csrc/gemm/skinny/backend.cu"):
        source = (ROOT / backend).read_text()
        assert not re.search(r"\b(768|1024)\b.*rows|kSameFormatMinRows|kWideStreamMaxTileTokens", source), backend


@pytest.mark.parametrize("m", [1, 16, 17, 64, 256, 768, 4096])
def test_dispatch_choice_is_a_backend_that_can_serve_the_call(fp4, m):
    for cc in (90, 100, 110, 120):
        call = fp4._gemm.described_call("nvfp4", m=m, n=4096, k=4096)
        chosen, served = call.backend(cc), call.backends(cc)
        assert chosen == "" or served[0] == chosen, f"{m=} n=4096 k=4096 sm_{cc}: {chosen} not first of {served}"
        assert len(set(served)) == len(served)


def test_gemm_on_reaches_a_backend_the_table_does_not_pick(fp4):
    """The composition can serve a dense NVFP4 GEMM of 256 rows; on sm_90 the table gives it to the
    engine, and gemm_on still reaches it (tests hold every capable backend to the reference)."""
    require_built(fp4, 90)
    call = fp4._gemm.described_call("nvfp4", m=256, n=4096, k=4096)
    assert call.backend(90) == "sm90_engine" and "composition" in call.backends(90)


def test_capabilities_say_what_each_variant_id_runs_on_each_arch(fp4):
    """flashrt's ids 0, 1, 2 ("default", "widen", "pingpong") name a tile each arch has: sm_90 has no
    pingpong kernel, its id 2 is the 64-row tile."""
    caps = fp4.capabilities()
    explicit = set(caps["variant_names"]) - {-1}
    assert set(caps["variant_tiles"]) == set(caps["variants"])
    assert all(set(tiles) == explicit for tiles in caps["variant_tiles"].values())
    assert caps["variant_tiles"]["sm_90"][2].startswith("64 x 256")
    assert caps["variant_tiles"]["sm_120"][2].startswith("pingpong")
