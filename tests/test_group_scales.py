"""tile_group_scales: a grouping's experts, and their scales re-laid onto whole 128-row SfAtom
tiles (csrc/gemm/blackwell/group_scales.h; reference.tile_group_scales_into), which the Blackwell grouped and
batched GEMMs run before CUTLASS's kernels: contiguous groups from the expert ids, strided groups
(g owns rows [g R, (g + 1) R)) from R alone.

On the CPU: the reference against hand-computed layouts and the workspace bound that callers size
from shapes alone. On a GPU: the CUDA op against the CPU op bit for bit, in poisoned buffers (tiles
past the last expert's are not written), also for ids a valid call never has.
"""

from __future__ import annotations

import pytest
import torch
from checks import POISON_BYTE, assert_bitwise_equal
from conftest import requires_arch


def swizzled(ref, rows: int, nkb: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random plain scale bytes [rows, nkb] (never 0 or the poison) and their swizzled buffer."""
    generator = torch.Generator().manual_seed(seed)
    plain = torch.randint(1, 255, (rows, nkb), generator=generator, dtype=torch.uint8)
    plain[plain == POISON_BYTE] = 1
    return plain, ref.swizzle_scales(plain)


def ids_of(counts: list[int], gaps: dict[int, int] | None = None) -> torch.Tensor:
    """Expert e's counts[e] rows in order, with gaps[e] padding rows (-1) before expert e."""
    ids = []
    for expert, count in enumerate(counts):
        ids += [-1] * (gaps or {}).get(expert, 0) + [expert] * count
    return torch.tensor(ids, dtype=torch.int32)


def relay(op, ids: torch.Tensor | None, scales: torch.Tensor, groups: int, nkb: int, tiles: int, group_rows: int = 0):
    """op's layout and re-laid scales, written into poisoned buffers (ids None: strided groups)."""
    layout = torch.full((3, groups), -7, dtype=torch.int32, device=scales.device)
    out = torch.full((tiles * -(-nkb // 4) * 512,), POISON_BYTE, dtype=torch.uint8, device=scales.device)
    op(ids, group_rows, scales, groups, nkb, layout, out)
    return layout, out


# ---- the reference (CPU) ----------------------------------------------------------------------


def test_group_scale_tiles_is_rows_over_128_plus_groups(ref):
    assert [ref.group_scale_tiles(m, e) for m, e in [(1, 1), (128, 1), (129, 1), (300, 8), (0, 4)]] == [2, 2, 3, 11, 4]


def test_tile_group_scales_hand_computed_layout(ref):
    # expert 0: rows 3..132 (130 rows, 2 tiles); expert 1: none; expert 2: rows 135..139 (1 tile);
    # expert 3: rows 140..146; id 5 is outside [0, 4): no expert's; -1 rows are padding
    ids = torch.tensor([-1] * 3 + [0] * 130 + [-1] * 2 + [2] * 5 + [3] * 7 + [5] * 2 + [-1], dtype=torch.int32)
    m, groups, nkb = ids.numel(), 4, 6
    plain, scales = swizzled(ref, m, nkb, seed=1)
    layout, out = relay(ref.tile_group_scales_into, ids, scales, groups, nkb, ref.group_scale_tiles(m, groups))
    assert layout.tolist() == [[3, 0, 135, 140], [130, 0, 5, 7], [0, 2, 2, 3]]
    tile_bytes = 2 * 512  # nkt = 2
    for (first, rows, tile), tiles in zip(layout.T.tolist(), [2, 0, 1, 1], strict=True):
        if rows == 0:
            continue
        block = out[tile * tile_bytes : (tile + tiles) * tile_bytes]
        every = ref.unswizzle_scales(block, tiles * 128, 8)  # the padding rows and columns too
        assert torch.equal(every[:rows, :nkb], plain[first : first + rows]), f"{first=} {rows=}"
        assert (every[rows:] == 0).all() and (every[:, nkb:] == 0).all(), f"{first=}: padding is not 0"
    assert (out[4 * tile_bytes :] == POISON_BYTE).all(), "tiles past the last expert's were written"


@pytest.mark.parametrize("seed", range(6))
def test_tile_group_scales_stay_within_the_bound_and_keep_every_scale(ref, seed):
    generator = torch.Generator().manual_seed(seed)
    groups = int(torch.randint(1, 40, (1,), generator=generator))
    counts = torch.randint(0, 300, (groups,), generator=generator).tolist()
    gaps = {e: int(g) for e, g in enumerate(torch.randint(0, 3, (groups,), generator=generator))}
    ids = ids_of(counts, gaps) if sum(counts) else torch.tensor([-1], dtype=torch.int32)
    m, nkb = ids.numel(), 3 + seed
    plain, scales = swizzled(ref, m, nkb, seed)
    capacity = ref.group_scale_tiles(m, groups)
    layout, out = relay(ref.tile_group_scales_into, ids, scales, groups, nkb, capacity)
    first, rows, tile = layout.long()
    assert torch.equal(rows, torch.tensor(counts)), f"{seed=}"
    used = int((-(-rows // 128)).sum())
    assert used <= capacity and torch.equal(tile, torch.cumsum(-(-rows // 128), 0) - (-(-rows // 128)))
    relaid = ref.unswizzle_scales(out[: used * -(-nkb // 4) * 512], used * 128, nkb)
    for e in range(groups):
        expected = plain[first[e] : first[e] + rows[e]]
        assert torch.equal(relaid[tile[e] * 128 : tile[e] * 128 + rows[e]], expected), f"{seed=} expert {e}"


def test_tile_group_scales_worst_case_fills_the_bound(ref):
    # one row per expert: every expert a tile of its own, as the bound allows
    groups = 300
    ids = torch.arange(groups, dtype=torch.int32)
    _, scales = swizzled(ref, groups, 4, seed=3)
    layout, _ = relay(ref.tile_group_scales_into, ids, scales, groups, 4, ref.group_scale_tiles(groups, groups))
    assert layout[2].tolist() == list(range(groups)) and ref.group_scale_tiles(groups, groups) >= groups


def test_strided_groups_hand_computed_layout(ref):
    groups, group_rows, nkb = 3, 130, 6
    m = groups * group_rows
    plain, scales = swizzled(ref, m, nkb, seed=2)
    layout, out = relay(ref.tile_group_scales_into, None, scales, groups, nkb, ref.group_scale_tiles(m, groups), 130)
    assert layout.tolist() == [[0, 130, 260], [130, 130, 130], [0, 2, 4]]
    every = ref.unswizzle_scales(out[: 6 * 2 * 512], 6 * 128, 8)
    for g in range(groups):
        rows = every[g * 256 : (g + 1) * 256]
        assert torch.equal(rows[:130, :nkb], plain[g * 130 : (g + 1) * 130]), f"group {g}"
        assert (rows[130:] == 0).all() and (rows[:, nkb:] == 0).all(), f"group {g}: padding is not 0"


def test_tile_group_scales_op_on_cpu_is_the_reference(fp4, ref):
    ids = ids_of([5, 0, 140, 3], {2: 4})
    m, groups, nkb = ids.numel(), 4, 5
    _, scales = swizzled(ref, m, nkb, seed=4)
    tiles = ref.group_scale_tiles(m, groups)
    expected = relay(ref.tile_group_scales_into, ids, scales, groups, nkb, tiles)
    actual = relay(fp4.ops.tile_group_scales, ids, scales, groups, nkb, tiles)
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])


# ---- the CUDA kernels against the reference ---------------------------------------------------

GPU_CASES = {
    # name: (ids, groups, nkb)
    "padding-around-and-between": (ids_of([50, 0, 30, 200, 1], {0: 3, 2: 10, 4: 1}), 5, 7),
    "one-expert": (ids_of([1000]), 1, 4),
    "rows-on-tile-boundaries": (ids_of([128, 256, 128]), 3, 8),
    "out-of-range-ids": (torch.tensor([0] * 40 + [9] * 5 + [2] * 90 + [-5] * 3, dtype=torch.int32), 4, 2),
    "more-experts-than-threads": (ids_of([(e * 7) % 5 for e in range(3000)]), 3000, 9),
    "many-rows": (ids_of([(e * 977) % 3001 for e in range(40)], {e: e % 3 for e in range(40)}), 40, 112),
    # not a valid call (an expert's rows interleaved with another's): in bounds and deterministic
    "overlapping-ranges": (torch.tensor([0, 1] * 150, dtype=torch.int32), 2, 4),
}


@requires_arch()
@pytest.mark.parametrize("case", GPU_CASES)
def test_tile_group_scales_cuda_matches_the_reference(fp4, ref, device, case):
    ids, groups, nkb = GPU_CASES[case]
    m = ids.numel()
    _, scales = swizzled(ref, m, nkb, seed=len(case))
    tiles = ref.group_scale_tiles(m, groups)
    expected = relay(ref.tile_group_scales_into, ids, scales, groups, nkb, tiles)
    for run in range(2):  # deterministic: no result depends on the order of atomics
        actual = relay(fp4.ops.tile_group_scales, ids.to(device), scales.to(device), groups, nkb, tiles)
        torch.cuda.synchronize()
        assert_bitwise_equal(actual[0].cpu(), expected[0], f"{case} layout, run {run}")
        assert_bitwise_equal(actual[1].cpu(), expected[1], f"{case} scales, run {run}")


STRIDED_CASES = {
    # name: (groups, group_rows, nkb)
    "rows-over-a-tile": (3, 130, 7),
    "one-row-groups": (8, 1, 4),
    "whole-tiles": (5, 128, 3),
    "wide-k": (2, 300, 112),
    "many-small-groups": (1000, 5, 2),
}


@requires_arch()
@pytest.mark.parametrize("case", STRIDED_CASES)
def test_strided_tile_group_scales_cuda_matches_the_reference(fp4, ref, device, case):
    groups, group_rows, nkb = STRIDED_CASES[case]
    m = groups * group_rows
    _, scales = swizzled(ref, m, nkb, seed=len(case))
    tiles = ref.group_scale_tiles(m, groups)
    expected = relay(ref.tile_group_scales_into, None, scales, groups, nkb, tiles, group_rows)
    actual = relay(fp4.ops.tile_group_scales, None, scales.to(device), groups, nkb, tiles, group_rows)
    torch.cuda.synchronize()
    assert_bitwise_equal(actual[0].cpu(), expected[0], f"{case} layout")
    assert_bitwise_equal(actual[1].cpu(), expected[1], f"{case} scales")


@requires_arch()
def test_tile_group_scales_cuda_graph_replay(fp4, ref, device):
    ids, groups, nkb = GPU_CASES["padding-around-and-between"]
    m = ids.numel()
    _, scales = swizzled(ref, m, nkb, seed=9)
    tiles = ref.group_scale_tiles(m, groups)
    expected = relay(ref.tile_group_scales_into, ids, scales, groups, nkb, tiles)
    ids_d, scales_d = ids.to(device), scales.to(device)
    layout = torch.full((3, groups), -7, dtype=torch.int32, device=device)
    out = torch.full_like(expected[1], POISON_BYTE, device=device)
    fp4.ops.tile_group_scales(ids_d, 0, scales_d, groups, nkb, layout, out)  # warm-up outside the capture
    layout.fill_(-7), out.fill_(POISON_BYTE)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4.ops.tile_group_scales(ids_d, 0, scales_d, groups, nkb, layout, out)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(layout.cpu(), expected[0], "layout after replay")
    assert_bitwise_equal(out.cpu(), expected[1], "scales after replay")
