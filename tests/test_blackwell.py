"""The Blackwell backends (csrc/gemm/sm100, sm110, sm120), verified without a Blackwell GPU.

No GPU here runs sm_100f, sm_110a or sm_120f code, so these tests check what can be checked:
- the machine code: the built library holds, for every arch and operand format, the CUTLASS
  kernels of the instantiation table, and each one issues the block-scaled MMA of its format
  (disassembled with cuobjdump + nvdisasm from the PyPI packages of requirements.txt);
- the host-side rules: which problems each arch's backend serves (GemmCall.backends asks the same
  supports() predicate dispatch uses), which kernel the dispatch picks for a problem (its
  CUTLASS-free headers compiled into a small host program), and the scale layout the kernels are
  handed.
Whether the kernels compute the right numbers is for a Blackwell GPU: capabilities() says
"native (compile-verified)" for these archs until one has run them."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from cases import BLACKWELL_CAPABILITIES, STAGED_KINDS, dispatched, require_built
from conftest import ROOT
from machine_code import all_kernels, nvidia_tool

BLACKWELL = BLACKWELL_CAPABILITIES  # cc -> capability: 100 -> "10.0f", ...
FORMATS = ("mxfp8", "mxfp4", "nvfp4")
BACKENDS = {cc: f"sm{cc}_cutlass" for cc in BLACKWELL}


# ---- the instantiation table (csrc/gemm/blackwell/args.h: blackwell_tile_built) -------------------


def kernel_count(dispatch_probe, cc: int, fmt: str) -> int:
    """The kernels the C++ instantiation table builds for an arch and format (the dispatch probe
    below counts blackwell_tile_built and kHasGroupedKernel over every output type and tile)."""
    return dispatch_probe["tables"][(cc, fmt)]


def test_instantiation_table_counts(dispatch_probe):
    """Per output type (bf16, fp16): one kernel per built tile (sm120 alone has pingpong and no MXFP8
    widen tile), plus the grouped (masked and contiguous) kernel; NVFP4 adds the float32 stage of the
    staged backend (default tile) and the stream-K kernel of the streamk functions (bf16)."""
    counts = [kernel_count(dispatch_probe, cc, f) for cc in BLACKWELL for f in FORMATS]
    assert counts == [6, 6, 8, 6, 6, 8, 6, 8, 10]


# ---- machine code -----------------------------------------------------------------------------


# A kernel of these backends: its epilogue's activation functor carries the arch section.
OUR_KERNEL = re.compile(r"BlackwellActivationILN\w*?8GemmArchE(\d+)EE")
# Element and scale types, as they first appear (length-prefixed) in a mangled CUTLASS name.
FORMAT_TYPES = {
    "nvfp4": ("12float_e2m1_t", "13float_ue4m3_t"),
    "mxfp4": ("12float_e2m1_t", "13float_ue8m0_t"),
    "mxfp8": ("12float_e4m3_t", "13float_ue8m0_t"),
}


def kernel_format(name: str) -> str:
    (fmt,) = [f for f, types in FORMAT_TYPES.items() if all(t in name for t in types)]
    return fmt


@functools.cache
def blackwell_kernels(cc: int) -> dict[str, tuple[str, str]]:
    """Mangled name -> (operand format, SASS) of every GEMM kernel of these backends in the arch's cubin."""
    kernels = {}
    for name, body in all_kernels(cc).items():
        tag = OUR_KERNEL.search(name)
        if tag:
            assert int(tag.group(1)) == cc, f"sm_{cc}a holds the sm{tag.group(1)} section's kernel {name[:120]}"
            kernels[name] = (kernel_format(name), body)
    return kernels


# The block-scaled MMA of each (arch family, format), as nvdisasm spells it. sm_100f/sm_110a: the
# tcgen05 UTC*MMA with the A and B scale factors in tensor memory (the operands after the accumulator
# and after the instruction descriptor; .2CTA for the widen tile); 4X is the 16-element NVFP4 scale
# vector, QMMA the 8-bit kind. sm_120f: warp-level MMA with scale factors (.SF), E8 = UE8M0 scales.
SCALED_MMA = {
    (100, "nvfp4"): r"UTCOMMA(\.2CTA)?\.4X gdesc\[\w+\], gdesc\[\w+\], tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], tmem\[",
    (100, "mxfp4"): r"UTCOMMA(\.2CTA)? gdesc\[\w+\], gdesc\[\w+\], tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], tmem\[",
    (100, "mxfp8"): r"UTCQMMA(\.2CTA)? gdesc\[\w+\], gdesc\[\w+\], tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], tmem\[",
    (120, "nvfp4"): r"OMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X ",
    (120, "mxfp4"): r"OMMA\.SF\.16864\.F32\.E2M1\.E2M1\.E8 ",
    (120, "mxfp8"): r"QMMA\.SF\.16832\.F32\.E4M3\.E4M3\.E8 ",
}


def scaled_mma(cc: int, fmt: str) -> re.Pattern:
    return re.compile(SCALED_MMA[(120 if cc == 120 else 100, fmt)])


@pytest.mark.machine_code
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_library_has_each_blackwell_kernel_of_the_table(fp4, dispatch_probe, cc, fmt):
    require_built(fp4, cc)
    formats = [f for f, _ in blackwell_kernels(cc).values()]
    assert formats.count(fmt) == kernel_count(dispatch_probe, cc, fmt), f"sm_{cc}a {fmt}: {formats.count(fmt)}"


@pytest.mark.machine_code
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_each_blackwell_kernel_issues_the_block_scaled_mma_of_its_format(fp4, cc, fmt):
    require_built(fp4, cc)
    pattern = scaled_mma(cc, fmt)
    kernels = {name: sass for name, (f, sass) in blackwell_kernels(cc).items() if f == fmt}
    assert kernels, f"no sm_{cc}a {fmt} kernel"
    for name, sass in kernels.items():
        assert pattern.search(sass), f"sm_{cc}a {fmt}: no {pattern.pattern!r} in {name[:160]}"


@pytest.mark.machine_code
@pytest.mark.parametrize("cc", BLACKWELL)
def test_library_has_one_stream_k_kernel_per_arch_of_nvfp4_to_bf16(fp4, cc):
    """The streamk functions' kernel: GemmUniversal with CUTLASS's stream-K scheduler tag, NVFP4
    operands and bf16 output (its MMA is checked with the other NVFP4 kernels above)."""
    require_built(fp4, cc)
    stream_k = [(name, f) for name, (f, _) in blackwell_kernels(cc).items() if "16StreamKScheduler" in name]
    assert len(stream_k) == 1, f"sm_{cc}a: {len(stream_k)} stream-K kernels"
    ((name, fmt),) = stream_k
    assert fmt == "nvfp4" and "10bfloat16_t" in name, name[:200]


@pytest.mark.machine_code
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_library_has_the_grouped_kernels_and_their_argument_kernels(fp4, cc, fmt):
    """Masked and contiguous groups run CUTLASS's ptr-array kernel (one per output type, shared by
    both groupings) after a small kernel that builds its per-group arguments on the device; groups
    whose scales do not start on 128-row tiles first re-lay them (the portable tile_group_scales
    kernels: from the expert ids, or strided)."""
    require_built(fp4, cc)
    grouped = [name for name, (f, _) in blackwell_kernels(cc).items() if f == fmt and "GroupProblemShape" in name]
    assert len(grouped) == 2, f"sm_{cc}a {fmt}: {len(grouped)} grouped kernels"
    assert any(f"group_argumentsILNS_8GemmArchE{cc}E" in name for name in all_kernels(cc))
    for kernel in ("group_rows_kernel", "strided_rows_kernel", "move_scales_kernel"):
        assert any(kernel in name for name in all_kernels(cc)), f"sm_{cc}a: no {kernel}"


@pytest.mark.machine_code
def test_sm100_and_sm110_kernels_are_distinct_symbols(fp4):
    """The same recipe compiles for sm_100f and sm_110a in two units; distinct kernel types keep each
    section's launches on its own cubin (identical ones would share one host stub)."""
    require_built(fp4, 100, 110)
    assert blackwell_kernels(100).keys().isdisjoint(blackwell_kernels(110).keys())
    argument_kernels = [{n for n in all_kernels(cc) if "group_arguments" in n} for cc in (100, 110)]
    assert argument_kernels[0] and argument_kernels[0].isdisjoint(argument_kernels[1])


# ---- which problems the backends serve (host-side: GemmCall.backends asks supports()) ------------


@pytest.mark.parametrize("out_format", ["bf16", "fp16"])
@pytest.mark.parametrize("activation", ["none", "gelu", "relu2"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_serves_dense_gemms_of_every_format_and_epilogue(fp4, cc, fmt, activation, out_format):
    require_built(fp4, cc)
    assert dispatched(fp4, cc, fmt, m=256, activation=activation, out_format=out_format) == BACKENDS[cc]


@pytest.mark.parametrize("schedule", ["auto", "streamk", "m256"])
@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_serves_every_schedule_of_row_major_weights(fp4, cc, schedule):
    """A schedule picks how a GEMM runs, never what it computes: the tile kernels serve them all."""
    require_built(fp4, cc)
    assert dispatched(fp4, cc, m=512, schedule=schedule) == BACKENDS[cc]


# ---- which kernel the dispatch picks (blackwell/backend.h's visit, choose_blackwell_tile) --------

# A host program over the dispatch headers, with a stand-in kernel table that names what it visits:
# one line per problem kind and arch, "<grouping> <variant> | <kernel, schedule auto> | <kernel,
# schedule streamk>" (BlackwellKernelId's describe()), then the instantiation table's kernel count
# per arch and format. Those headers are CUTLASS-free; nvcc only because they pull in the package's
# launch helpers.
DISPATCH_PROBE = r"""
#include <cstdio>

#include "csrc/gemm/blackwell/backend.h"

using namespace fp4_gemm;

template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile>
struct Visited {
  static constexpr BlackwellKernelId kId{Arch, Format, Out, Tile};
};

template <GemmArch Arch>
void print_choices() {
  constexpr const char* kGroupings[] = {"dense", "batched", "contiguous", "masked"};
  for (OperandFormat format : {OperandFormat::Mxfp8, OperandFormat::Mxfp4, OperandFormat::Nvfp4})
    for (OutFormat out : {OutFormat::Bf16, OutFormat::Fp16, OutFormat::Fp32})
      for (Grouping grouping : {Grouping::Dense, Grouping::Batched, Grouping::Contiguous, Grouping::Masked})
        for (int variant = -1; variant <= 3; ++variant)
          for (int64_t rows : {128, 4096}) {
            GemmProblem p;
            p.m = p.group_rows = rows;
            p.n = p.k = 4096;
            p.a.format = p.b.format = format;
            p.epilogue.out_format = out;
            p.grouping = grouping;
            p.variant = variant;
            const auto visited = [&](Schedule schedule) {
              p.schedule = schedule;
              return describe(visit_blackwell_kernel<Visited, Arch>(p, [](auto k) { return decltype(k)::kId; }));
            };
            std::printf("%s %d | %s | %s\n", kGroupings[static_cast<int>(grouping)], variant,
                        visited(Schedule::Auto).c_str(), visited(Schedule::StreamK).c_str());
          }
}

// "table <cc> <format> <kernels>": the kernels the instantiation table builds for an arch and format.
template <GemmArch Arch>
void print_table() {
  constexpr BlackwellTile kTiles[] = {BlackwellTile::Default, BlackwellTile::Widen, BlackwellTile::Pingpong,
                                      BlackwellTile::StreamK};
  constexpr int kGrouped = kHasGroupedKernel<OutFormat::Bf16, BlackwellTile::Default> +
                           kHasGroupedKernel<OutFormat::Fp16, BlackwellTile::Default> +
                           kHasGroupedKernel<OutFormat::Fp32, BlackwellTile::Default>;
  const char* names[] = {"mxfp8", "mxfp4", "nvfp4"};
  const OperandFormat formats[] = {OperandFormat::Mxfp8, OperandFormat::Mxfp4, OperandFormat::Nvfp4};
  for (int f = 0; f < 3; ++f) {
    int kernels = kGrouped;
    for (OutFormat out : {OutFormat::Bf16, OutFormat::Fp16, OutFormat::Fp32})
      for (BlackwellTile tile : kTiles) kernels += blackwell_tile_built(Arch, formats[f], out, tile);
    std::printf("table %d %s %d\n", static_cast<int>(Arch), names[f], kernels);
  }
}

int main() {
  print_choices<GemmArch::Sm100>();
  print_choices<GemmArch::Sm110>();
  print_choices<GemmArch::Sm120>();
  print_table<GemmArch::Sm100>();
  print_table<GemmArch::Sm110>();
  print_table<GemmArch::Sm120>();
}
"""


@pytest.fixture(scope="module")
def dispatch_probe(tmp_path_factory) -> dict:
    """What the dispatch headers decide, from the probe: "choices", (grouping, kernel with schedule
    auto, kernel with schedule streamk) of every probed kind; "tables", (cc, format) -> kernels built."""
    nvcc = nvidia_tool("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    if not Path(nvcc).is_file():
        pytest.skip("nvcc not found: the dispatch probe compiles the Blackwell dispatch headers")
    work = tmp_path_factory.mktemp("dispatch_probe")
    (work / "probe.cu").write_text(DISPATCH_PROBE)
    command = [nvcc, "-std=c++17", f"-I{ROOT}", str(work / "probe.cu"), "-o", str(work / "probe")]
    subprocess.run(command, check=True, capture_output=True, text=True)
    lines = subprocess.run([str(work / "probe")], check=True, capture_output=True, text=True).stdout.splitlines()
    choices, tables = [], {}
    for line in lines:
        if line.startswith("table "):
            _, cc, fmt, kernels = line.split()
            tables[(int(cc), fmt)] = int(kernels)
            continue
        kind, auto, streamk = (part.strip() for part in line.split("|"))
        choices.append((kind.split()[0], auto, streamk))
    return {"choices": choices, "tables": tables}


@pytest.fixture(scope="module")
def dispatch_choices(dispatch_probe) -> list[tuple[str, str, str]]:
    return dispatch_probe["choices"]


@pytest.mark.parametrize("cc", BLACKWELL)
def test_streamk_kind_runs_the_stream_k_kernel_and_nothing_else_changes(dispatch_choices, cc):
    """Schedule::StreamK picks the stream-K kernel for dense NVFP4 -> bf16 problems, whatever the
    variant; every other kind runs the kernel it runs without it, and no variant (3 included, the
    internal stream-K value) reaches the stream-K kernel."""
    stream_k = f"sm{cc} nvfp4 -> bf16, stream-K tile"
    ours = [c for c in dispatch_choices if c[1].startswith(f"sm{cc} ")]
    assert len(ours) == 3 * 3 * 4 * 5 * 2
    for grouping, auto, streamk in ours:
        assert "stream-K" not in auto, auto
        if grouping == "dense" and auto.startswith(f"sm{cc} nvfp4 -> bf16,"):
            assert streamk == stream_k, f"{grouping}: {auto} -> {streamk}"
        else:
            assert streamk == auto, f"{grouping}: {auto} -> {streamk}"
    assert sum(streamk == stream_k for _, _, streamk in ours) == 5 * 2  # every variant and row count


@pytest.mark.parametrize("kind", STAGED_KINDS)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_nvfp4_outputs_are_staged_through_the_float32_kernel(fp4, cc, kind):
    """The staged backend: the NVFP4 operands' float32 kernel writes alpha * A @ B^T, the rest of the
    epilogue and the package's quantizer run on that stage. MX operands have no float32 kernel."""
    require_built(fp4, cc)
    assert dispatched(fp4, cc, "nvfp4", m=256, **kind) == "staged"
    assert dispatched(fp4, cc, "nvfp4", m=256, n=4104, **kind) == ""  # N_out % 16 != 0
    assert dispatched(fp4, cc, "mxfp8", m=256, **kind) == ""
    assert dispatched(fp4, cc, "mxfp4", m=256, **kind) == ""


@pytest.mark.parametrize("grouping", ["batched", "masked"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_serves_groups_of_any_rows_and_n(fp4, cc, fmt, grouping):
    """A grouped query is 8 groups of m rows. Where m or N is not a multiple of 128 a group's scales
    do not start on a 128-row SfAtom tile: they are re-laid per group first (tile_group_scales)."""
    require_built(fp4, cc)
    for m, n in [(256, 4096), (128, 128), (200, 4096), (256, 4104), (1, 8), (77, 200)]:
        assert dispatched(fp4, cc, fmt, m=m, n=n, grouping=grouping) == BACKENDS[cc], f"{m=} {n=}"
    assert dispatched(fp4, cc, fmt, m=256, k=48, grouping=grouping) != BACKENDS[cc]  # 24-byte NVFP4 rows


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_serves_contiguous_groups_of_any_rows(fp4, cc, fmt):
    """Contiguous experts start anywhere: their A scales are re-laid onto tiles of their own first
    (tile_group_scales from the expert ids), and the weights' too where N is not a multiple of 128."""
    require_built(fp4, cc)
    for m in (256, 200, 100_000):
        assert dispatched(fp4, cc, fmt, m=m, grouping="contiguous") == BACKENDS[cc], f"{m=}"
    # one row per expert on average is the decode step: the skinny kernels take it on every arch
    assert dispatched(fp4, cc, fmt, m=1, grouping="contiguous") == "skinny"
    assert dispatched(fp4, cc, fmt, m=256, n=4104, grouping="contiguous") == BACKENDS[cc]
    assert dispatched(fp4, cc, fmt, m=256, k=48, grouping="contiguous") != BACKENDS[cc]  # 24-byte NVFP4 rows


@pytest.mark.parametrize("b_format", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("grouping", ["batched", "masked", "contiguous"])
@pytest.mark.parametrize("cc", BLACKWELL)
def test_grouped_w4a16_of_any_rows_per_group_runs_the_skinny_kernel_in_16_row_chunks(fp4, cc, grouping, b_format):
    """No Blackwell kernel reads a bf16 A: the skinny kernel walks each group in 16-row chunks."""
    require_built(fp4, cc)
    for m in (1, 16, 17, 64, 256):
        assert dispatched(fp4, cc, "bf16", b_format, m=m, grouping=grouping) == "skinny", f"{m=}"


@pytest.mark.parametrize("grouping", ["masked", "contiguous"])
@pytest.mark.parametrize("cc", BLACKWELL)
def test_grouped_nvfp4_outputs_stay_with_the_reference(fp4, cc, grouping):
    """The staged backend's quantizer would write the rows a group does not own; batched problems own
    every row."""
    require_built(fp4, cc)
    assert dispatched(fp4, cc, m=256, grouping="batched", out_format="nvfp4_from_fp16") == "staged"
    assert dispatched(fp4, cc, m=256, grouping=grouping, out_format="nvfp4_from_fp16") == ""


@pytest.mark.parametrize(
    "kind",
    [
        {"out_format": "nvfp4"},  # the staged backend's (a float32 stage)
        {"activation": "geglu", "out_format": "nvfp4_from_fp16"},  # the staged backend's
        {"activation": "geglu"},  # pairs columns: not per element
        {"b_interleaved": True, "m": 1},  # the streaming weight layout
        {"a_format": "nvfp4", "b_format": "e0m3", "out_format": "fp16"},  # no E0M3 MMA
        {"a_format": "mxfp8", "b_format": "mxfp4"},  # mixed operand formats
    ],
)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_leaves_other_kinds_to_other_backends(fp4, cc, kind):
    require_built(fp4, cc)
    kind = {"m": 256} | kind
    assert dispatched(fp4, cc, **kind) != BACKENDS[cc], f"sm_{cc} {kind}"


@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_needs_16_byte_tma_rows(fp4, cc):
    require_built(fp4, cc)
    assert dispatched(fp4, cc, m=256, k=48) != BACKENDS[cc]  # 24-byte NVFP4 rows of A and B
    assert dispatched(fp4, cc, m=256, k=32) == BACKENDS[cc]
    assert dispatched(fp4, cc, m=256, n=12) != BACKENDS[cc]  # 24-byte bf16 rows of D
    assert dispatched(fp4, cc, m=256, n=8) == BACKENDS[cc]


@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_serves_every_m_above_the_skinny_tier(fp4, cc):
    """M <= 16 goes to the skinny kernels first (lower priority number) where they serve it."""
    require_built(fp4, cc)
    assert [dispatched(fp4, cc, m=m) for m in (17, 128, 129, 100_000)] == [BACKENDS[cc]] * 4
    assert dispatched(fp4, cc, m=1) != ""


@pytest.mark.parametrize("cc", BLACKWELL)
def test_backends_run_only_on_their_own_arch(fp4, cc):
    require_built(fp4, cc)
    assert dispatched(fp4, 90, m=256, unbuilt=True) != BACKENDS[cc]
    assert all(dispatched(fp4, other, m=256, unbuilt=True) != BACKENDS[cc] for other in BLACKWELL if other != cc)


@pytest.mark.parametrize(
    "function",
    [
        "dense_gemm",
        "nvfp4_gemm_bf16",
        "nvfp4_gemm_residual_bf16",
        "batch_gemm",
        "group_masked_gemm",
        "group_contiguous_gemm",
    ],
)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_capabilities_call_the_served_functions_compile_verified(fp4, cc, function):
    require_built(fp4, cc)
    assert fp4.capabilities()["functions"][function][f"sm_{cc}"] == "native (compile-verified)"


@pytest.mark.parametrize("bias", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("out_format", ["bf16", "fp16"])
@pytest.mark.parametrize("grouping", ["dense", "batched", "masked", "contiguous"])
@pytest.mark.parametrize("cc", BLACKWELL)
def test_backend_serves_every_bias_dtype_in_every_output_type(fp4, cc, grouping, out_format, bias):
    """The epilogue reads the bias as float32, a bf16 or fp16 one widened into scratch first."""
    require_built(fp4, cc)
    assert dispatched(fp4, cc, m=256, grouping=grouping, out_format=out_format, bias=bias) == BACKENDS[cc]


@pytest.mark.parametrize(
    "function", ["nvfp4_gemm_bias_bf16", "nvfp4_gemm_bias_residual_fp16", "nvfp4_gemm_streamk_bias_bf16"]
)
@pytest.mark.parametrize("cc", BLACKWELL)
def test_capabilities_call_bias_functions_compile_verified_for_every_bias_dtype(fp4, cc, function):
    require_built(fp4, cc)
    calls = fp4._capabilities.gemm_calls(function)
    assert {call.bias.dtype for call in calls} == {torch.bfloat16, torch.float16, torch.float32}
    assert all(call.backend(cc) != "" for call in calls)
    assert fp4.capabilities()["functions"][function][f"sm_{cc}"] == "native (compile-verified)"


# ---- the scale layout handed to CUTLASS --------------------------------------------------------


def cutlass_sf_offset(m: int, kb: int, batch: int, rows: int, nkb: int) -> int:
    """CUTLASS's Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA in plain Python: the SfAtom
    ((32, 4), 4) : ((16, 4), 1) tiled over (rows, K blocks, L), K tiles fastest, then row tiles,
    then batches, every extent padded up to whole atoms."""
    row_tiles, k_tiles = -(-rows // 128), -(-nkb // 4)
    atom = (m % 32) * 16 + (m % 128) // 32 * 4 + kb % 4
    return atom + 512 * (kb // 4 + k_tiles * (m // 128 + row_tiles * batch))


@pytest.mark.parametrize("rows, nkb", [(256, 10), (384, 4), (128, 7), (200, 5), (1, 3)])
def test_cutlass_scale_layout_is_the_swizzled_buffer_of_batches_on_whole_tiles(ref, rows, nkb):
    """CUTLASS's L-strided scales are the swizzled buffer of all batches' rows, each batch padded to
    whole 128-row tiles: the flattened buffer itself for 128-row multiples, else what
    tile_group_scales's strided groups write (the C++ recipes check the same identity at compile
    time against CUTLASS's own layout, for 200-row batches)."""
    padded = -(-rows // 128) * 128
    for batch in range(2):
        for m in range(rows):
            for kb in range(nkb):
                expected = ref.sf_offset(batch * padded + m, kb, nkb)
                assert cutlass_sf_offset(m, kb, batch, rows, nkb) == expected, f"{m=} {kb=} {batch=}"
