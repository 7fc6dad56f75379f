"""capabilities(): its structure, and that what it says is true of this build.

Statuses are checked against the build's metadata.json and against the op each function really
dispatches (recorded on a CPU call) and that op's CUDA registration; the scale layout against
sfa_size_bytes and the bytes a quantizer writes; variants and tiers against what the validation
accepts and rejects.
"""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch
from api_cases import CASES, make_call, nvfp4_operand
from cases import ARCH_CAPABILITIES, build_capabilities, compute_capability, require_built
from checks import OpRecorder
from conftest import variant_metadata

pytestmark = pytest.mark.kernels_ci

ARCHS = ARCH_CAPABILITIES  # "sm_90": "9.0a", ... from build.toml
PLACES = (*ARCHS, "cpu")
STATUSES = ("native", "native (compile-verified)", "reference", "unsupported")
RUN_ARCH = "sm_90"  # the arch whose kernels ran in this package's tests (an H200)

NATIVE = (
    "group_wise_quant",
    "quantize_fp4_sfa_fp16",
    "quantize_fp4_sfa_bf16",
    "quantize_fp4_sfa_bf16_pdl",
    "quantize_fp4_sfa_mse_fp16",
    "quantize_fp4_sfa_mse_bf16",
    "quantize_e0m3_sfa_fp16",
    "pack_nvfp4_weight_bf16",
    "quantize_fp4_sfa_padded_bf16",
    "dequantize_fp4_sfa_fp16",
    "fused_swiglu_quant",
    "prefill_permute_to_masked_gemm",
    # the M <= 16 kernels (csrc/gemm/skinny) serve these tiers on every arch, and the repack feeding the GEMV
    "fp4_repack_b_interleaved_sm120",
    "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
    "fp4_w4a4_gemm_warpsplit_mrows_bf16",
    "fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16",
    "fp4_w4a4_gemv_warpsplit_bf16",
)
HOST_ONLY = (
    "sfa_size_bytes",
    "capabilities",
    "nvfp4_gemm_m256_workspace_size",
    "aligned_fp4_dim",
    "allocate_w4a16_marlin_workspace",
    "adopt_nvfp4_w4a16_marlin",
)
# every other GEMM: its status depends on the arch's backends (csrc/gemm/dispatch)
GEMMS = tuple(sorted(set(CASES) - set(NATIVE) - set(HOST_ONLY)))
WITH_OPS = NATIVE + GEMMS
# the dense and grouped GEMMs with 16-bit outputs, which the Hopper engine serves
HOPPER_ENGINE = (
    "batch_gemm",
    "dense_gemm",
    "group_contiguous_gemm",
    "group_masked_gemm",
    "e0m3_weight_gemm_fp16",
    "fp4_w4a16_linear_bf16",
    "nvfp4_gemm_bf16",
    "nvfp4_gemm_bias_bf16",
    "nvfp4_gemm_bias_gelu_bf16",
    "nvfp4_gemm_bias_residual_bf16",
    "nvfp4_gemm_bias_residual_fp16",
    "nvfp4_gemm_fp16",
    "nvfp4_gemm_m256_bf16",
    "nvfp4_gemm_residual_bf16",
    "nvfp4_gemm_streamk_bf16",
    "nvfp4_gemm_streamk_bias_bf16",
    "nvfp4_gemm_variant_bf16",
    "nvfp4_w4a16_marlin_bf16",
)
# the NVFP4-output and GeGLU GEMMs, which the staged backend serves from a float32 result of the
# Hopper engine (on sm_100/110/120 from the Blackwell kernels' float32 stage)
STAGED = (
    "cutlass_fp4_gemm_geglu_il_hw_v10",
    "nvfp4_gemm_bias_gelu_nvfp4",
    "nvfp4_gemm_bias_gelu_nvfp4_fp16",
    "nvfp4_gemm_geglu_nvfp4_fp16",
    "nvfp4_gemm_nvfp4",
    "nvfp4_gemm_relu2_nvfp4",
)

# the grouped GEMMs the Blackwell backends serve with CUTLASS's grouped (ptr-array) or L-mode kernels
BLACKWELL = tuple(arch for arch in ARCHS if arch != RUN_ARCH)
BLACKWELL_GROUPED = ("batch_gemm", "group_contiguous_gemm", "group_masked_gemm")


def built_archs() -> set[str]:
    """The archs (sm_90, ...) compiled into the build under test."""
    capabilities = set(variant_metadata()["backend"]["archs"])
    return {arch for arch, cc in ARCHS.items() if cc in capabilities}


def ops_called(fp4, name: str) -> list[str]:
    args, kwargs = make_call(name, "cpu")
    with OpRecorder(fp4.ops.name) as recorder:
        getattr(fp4, name)(*args, **kwargs)
    return recorder.called


def cuda_registration(fp4, op: str) -> str:
    """The dispatcher's line for the op's CUDA kernel: where it was registered."""
    dump = torch._C._dispatch_dump(getattr(fp4.ops, op).default.name())
    return next(line for line in dump.splitlines() if line.startswith("CUDA:"))


def evaluate(formula: str, **names: object) -> object:
    """A formula string of capabilities(), with ceil and the given names and nothing else."""
    return eval(formula, {"__builtins__": {}, "ceil": math.ceil}, names)


# ---- functions: structure ---------------------------------------------------------------------


def public_functions(fp4) -> set[str]:
    """__all__ but the layers module and the flashrt constants (NVFP4_BLOCK_SIZE, ...)."""
    return {name for name in fp4.__all__ if not name.isupper()} - {"layers"}


def test_capabilities_functions_cover_the_public_api(fp4):
    assert set(fp4.capabilities()["functions"]) == public_functions(fp4)


def test_capabilities_function_groups_partition_the_public_api(fp4):
    groups = [set(NATIVE), set(HOST_ONLY), set(GEMMS)]
    assert set().union(*groups) == public_functions(fp4)
    assert sum(len(g) for g in groups) == len(public_functions(fp4))


@pytest.mark.parametrize("name", sorted(NATIVE + HOST_ONLY + GEMMS))
def test_capabilities_function_status_names_every_arch_and_cpu(fp4, name):
    status = fp4.capabilities()["functions"][name]
    assert tuple(status) == PLACES, name
    assert set(status.values()) <= set(STATUSES), f"{name}: {status}"


# ---- functions: what each status says ---------------------------------------------------------


@pytest.mark.parametrize("name", NATIVE)
def test_capabilities_quantizers_are_native_on_every_built_arch(fp4, name):
    built = built_archs()
    expected = {
        arch: ("native" if arch == RUN_ARCH else "native (compile-verified)") if arch in built else "unsupported"
        for arch in ARCHS
    }
    status = fp4.capabilities()["functions"][name]
    assert {arch: status[arch] for arch in ARCHS} == expected, f"{name} (built: {sorted(built)})"


@pytest.mark.parametrize("name", GEMMS)
def test_capabilities_hopper_engine_and_staged_gemms_are_native_on_sm90_and_the_rest_reference(fp4, name):
    require_built(fp4, 90)
    expected = "native" if name in HOPPER_ENGINE + STAGED else "reference"
    assert fp4.capabilities()["functions"][name]["sm_90"] == expected, name


@pytest.mark.parametrize("arch", BLACKWELL)
@pytest.mark.parametrize("name", BLACKWELL_GROUPED)
def test_capabilities_grouped_gemms_are_compile_verified_on_blackwell(fp4, name, arch):
    # the backend query gives grouped kinds a group geometry (8 groups of 256 rows), as a real call has
    require_built(fp4, compute_capability(ARCHS[arch]))
    assert fp4.capabilities()["functions"][name][arch] == "native (compile-verified)", f"{name} on {arch}"


@pytest.mark.parametrize("name", GEMMS)
def test_capabilities_gemm_status_is_the_backend_query_on_every_built_arch(fp4, name):
    # "native" exactly where a compiled backend serves every kind of problem the function issues
    status = fp4.capabilities()["functions"][name]
    for arch in ARCHS:
        if arch not in built_archs():
            assert status[arch] == "unsupported", f"{name} on {arch}"
            continue
        served = all(call.backend(int(arch[3:])) for call in fp4._capabilities.gemm_calls(name))
        assert status[arch].startswith("native") == served, f"{name} on {arch}: {status[arch]}"


@pytest.mark.parametrize("name", WITH_OPS)
def test_capabilities_cpu_status_is_reference(fp4, name):
    assert fp4.capabilities()["functions"][name]["cpu"] == "reference"


@pytest.mark.parametrize("name", HOST_ONLY)
def test_capabilities_host_only_functions_are_native_everywhere(fp4, name):
    assert fp4.capabilities()["functions"][name] == dict.fromkeys(PLACES, "native")


@pytest.mark.parametrize("name", ["sfa_size_bytes", "nvfp4_gemm_m256_workspace_size"])
def test_host_only_functions_dispatch_no_op(fp4, name):
    assert ops_called(fp4, name) == []


@pytest.mark.parametrize("name", WITH_OPS)
def test_capabilities_status_agrees_with_the_registration_of_the_op_it_dispatches(fp4, name):
    called = ops_called(fp4, name)
    assert len(called) == 1, f"{name} dispatched {called}"
    op = called[0]
    native_op = op in fp4.ops.native_cuda_ops()
    registration = cuda_registration(fp4, op)
    in_extension = re.search(r"registered at \S+\.(cpp|cc|cu):\d+", registration) is not None
    assert torch._C._dispatch_has_kernel_for_dispatch_key(getattr(fp4.ops, op).default.name(), "CUDA"), op
    assert in_extension == native_op, f"{name} -> {op}: native_cuda_ops says {native_op}, {registration}"
    if op == "gemm":
        return  # per kind of problem: test_capabilities_gemm_status_is_the_backend_query_on_every_built_arch
    status = fp4.capabilities()["functions"][name]
    for arch in sorted(built_archs()):
        assert status[arch].startswith("native") == native_op, f"{name} -> {op} on {arch}: {status[arch]}"


# ---- archs ------------------------------------------------------------------------------------


def test_supported_cuda_capabilities_are_build_toml_s(fp4):
    assert fp4._capabilities.SUPPORTED_CUDA_CAPABILITIES == build_capabilities()
    assert fp4._capabilities.ARCHS == ARCHS


def test_gemm_backend_archs_are_the_built_capabilities(fp4):
    built = variant_metadata()["backend"]["archs"]
    assert set(fp4.ops.gemm_backend_archs()) == {compute_capability(cap) for cap in built}


def test_capabilities_name_every_member_of_a_built_family(fp4):
    """10.0f code runs on B200 and B300, 12.0f on the RTX 50 series and DGX Spark: all are named."""
    assert {"sm_100", "sm_103", "sm_120", "sm_121"} <= set(ARCHS)
    assert fp4.capabilities()["functions"]["group_wise_quant"].keys() == {*ARCHS, "cpu"}


@pytest.mark.parametrize("family, member", [(100, 103), (120, 121)])
def test_a_family_member_gets_the_backends_of_its_family(fp4, family, member):
    call = fp4._gemm.described_call("nvfp4", m=256, n=4096, k=4096)
    assert call.backends(member) == call.backends(family)


@pytest.mark.parametrize("cc", [75, 80, 86, 89])
def test_a_gpu_without_code_in_this_build_runs_the_reference(fp4, cc):
    """Ampere and Ada (and anything outside build.toml's capabilities): no backend; every op runs its
    `_reference` twin there (loaded with check_arch=False)."""
    for m in (1, 256):
        assert fp4._gemm.described_call("nvfp4", m=m, n=4096, k=4096).backends(cc) == [], f"{m=} n=4096 k=4096"


def test_capabilities_say_other_gpus_run_the_reference(fp4):
    assert fp4.capabilities()["other_cuda_archs"] == "reference"
    assert {"sm_80", "sm_86", "sm_89"}.isdisjoint(fp4.capabilities()["functions"]["dense_gemm"])


def test_every_native_op_has_a_reference_twin_with_its_schema(fp4):
    for op in fp4.ops.native_cuda_ops():
        native, twin = getattr(fp4.ops, op).default._schema, getattr(fp4.ops, f"{op}_reference").default._schema
        assert str(twin).split("(", 1)[1] == str(native).split("(", 1)[1], op
        name = getattr(fp4.ops, f"{op}_reference").default.name()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"), op


def test_capabilities_built_cuda_capabilities_are_the_build_metadata(fp4):
    caps = fp4.capabilities()
    assert caps["built_cuda_capabilities"] == tuple(variant_metadata()["backend"]["archs"])
    assert caps["cuda_capabilities"] == build_capabilities()


def test_capabilities_gemm_backends_are_built_archs(fp4):
    assert set(fp4.capabilities()["gemm_backends"]) <= built_archs()


def test_capabilities_run_archs_is_the_tested_gpu(fp4):
    assert fp4.capabilities()["run_archs"] == (RUN_ARCH,)


# ---- scale layout -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows,dim,size",
    [
        (1, 16, 512),
        (128, 64, 512),
        (129, 64, 1024),
        (128, 80, 1024),
        (256, 128, 2 * 2 * 512),
        (300, 5120, 3 * 80 * 512),
        (40, 100 * 16, 25 * 512),
    ],
)
def test_sfa_size_bytes_hand_computed(fp4, rows, dim, size):
    assert fp4.sfa_size_bytes(rows, dim) == size


def test_capabilities_scale_layout_tiles_are_128_rows_by_4_blocks(fp4):
    layout = fp4.capabilities()["swizzled_scale_layout"]
    assert (layout["tile_rows"], layout["tile_blocks"], layout["tile_bytes"]) == (128, 4, 512)
    assert layout["tile_bytes"] == layout["tile_rows"] * layout["tile_blocks"]  # one byte per scale


@pytest.mark.parametrize("rows,dim", [(1, 16), (40, 128), (128, 64), (129, 80), (300, 5120), (1000, 48)])
def test_capabilities_scale_size_formulas_agree_with_sfa_size_bytes(fp4, rows, dim):
    caps = fp4.capabilities()
    expected = fp4.sfa_size_bytes(rows, dim)
    assert evaluate(caps["swizzled_scale_layout"]["size_bytes"], rows=rows, nkb=dim // caps["block_size"]) == expected
    assert evaluate(caps["scale_size"].removesuffix(" bytes"), rows=rows, dim=dim) == expected


@pytest.mark.parametrize("rows,k", [(40, 128), (200, 144), (129, 16)])
def test_quantizer_scale_buffer_has_sfa_size_bytes(fp4, rows, k):
    _, sfa = fp4.quantize_fp4_sfa_bf16(torch.ones(rows, k, dtype=torch.bfloat16))
    assert sfa.numel() == fp4.sfa_size_bytes(rows, k)


@pytest.mark.parametrize("mode", ["w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4"])
def test_capabilities_scale_layout_offset_locates_every_scale(fp4, mode):
    caps = fp4.capabilities()
    block = caps["formats"][caps["halops_modes"][mode]]["block_size"]
    rows, nkb = 200, 9  # two row tiles, three block tiles, both partly filled
    magnitude = torch.logspace(-3, 3, rows * nkb).reshape(rows, nkb)  # scales that vary block to block
    noise = torch.randn(rows, nkb * block, generator=torch.Generator().manual_seed(0))
    x = (noise * magnitude.repeat_interleave(block, 1)).to(torch.bfloat16)
    _, swizzled = fp4.group_wise_quant(x, mode, use_swizzle=True)
    _, plain = fp4.group_wise_quant(x, mode, use_swizzle=False)
    m, kb = torch.meshgrid(torch.arange(rows), torch.arange(nkb), indexing="ij")
    offset = evaluate(caps["swizzled_scale_layout"]["offset"], m=m, kb=kb, nkb=nkb)
    assert offset.unique().numel() == rows * nkb
    assert evaluate(caps["swizzled_scale_layout"]["size_bytes"], rows=rows, nkb=nkb) == swizzled.numel()
    assert int(offset.max()) < swizzled.numel()
    assert torch.equal(swizzled.flatten()[offset], plain), mode


# ---- formats and alignment --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4"])
def test_capabilities_block_size_is_what_group_wise_quant_enforces(fp4, mode):
    caps = fp4.capabilities()
    fmt = caps["halops_modes"][mode]
    block = caps["formats"][fmt]["block_size"]
    assert caps["alignment"]["k"][fmt] == block
    _, scales = fp4.group_wise_quant(torch.ones(4, 2 * block, dtype=torch.bfloat16), mode, use_swizzle=False)
    assert tuple(scales.shape) == (4, 2)
    with pytest.raises(ValueError, match=f"must be a positive multiple of {block}"):
        fp4.group_wise_quant(torch.ones(4, block + block // 2, dtype=torch.bfloat16), mode)


def test_capabilities_nvfp4_block_size_is_what_sfa_size_bytes_enforces(fp4):
    block = fp4.capabilities()["block_size"]
    assert fp4.sfa_size_bytes(1, block) == 512
    with pytest.raises(ValueError, match=f"must be a positive multiple of {block}"):
        fp4.sfa_size_bytes(1, block + 8)


def test_capabilities_quantizer_padding_is_multiples_of_16_default_32(fp4):
    assert "multiples of 16, default 32" in fp4.capabilities()["alignment"]["quantizer_padding"]
    for name in ("quantize_fp4_sfa_padded_bf16", "pack_nvfp4_weight_bf16"):
        assert inspect.signature(getattr(fp4, name)).parameters["alignment"].default == 32, name
    x = torch.ones(3, 20, dtype=torch.bfloat16)
    packed, _, logical = fp4.quantize_fp4_sfa_padded_bf16(x, alignment=16)
    assert (tuple(packed.shape), logical) == ((3, 16), 20)
    with pytest.raises(ValueError, match="alignment must be a positive multiple of 16"):
        fp4.quantize_fp4_sfa_padded_bf16(x, alignment=8)


# ---- variants ---------------------------------------------------------------------------------


def test_capabilities_variants_are_auto_then_explicit_ids_on_every_arch(fp4):
    caps = fp4.capabilities()
    assert set(caps["variants"]) == set(ARCHS)
    for arch, variants in caps["variants"].items():
        assert variants[0] == -1, arch
        assert list(variants[1:]) == sorted(set(variants[1:])) and min(variants[1:]) >= 0, arch
        assert set(caps["variant_names"]) == set(variants), arch
    assert caps["variant_names"][-1] == "auto"


def test_nvfp4_gemm_variant_bf16_accepts_every_listed_explicit_variant(fp4):
    args, kwargs = make_call("nvfp4_gemm_variant_bf16", "cpu")
    expected = fp4.nvfp4_gemm_bf16(*args)
    for variant in sorted({v for vs in fp4.capabilities()["variants"].values() for v in vs} - {-1}):
        assert torch.equal(fp4.nvfp4_gemm_variant_bf16(*args, variant=variant), expected), f"variant={variant}"


def test_nvfp4_gemm_variant_bf16_rejects_auto_and_unlisted_variants(fp4):
    args, _ = make_call("nvfp4_gemm_variant_bf16", "cpu")
    listed = {v for vs in fp4.capabilities()["variants"].values() for v in vs}
    for variant in (-1, max(listed) + 1):
        with pytest.raises(ValueError, match="capabilities\\(\\)\\['variants'\\]"):
            fp4.nvfp4_gemm_variant_bf16(*args, variant=variant)


def test_nvfp4_gemm_bf16_accepts_auto_and_rejects_unlisted_variants(fp4):
    args, _ = make_call("nvfp4_gemm_bf16", "cpu")
    listed = {v for vs in fp4.capabilities()["variants"].values() for v in vs}
    fp4.nvfp4_gemm_bf16(*args, variant=-1)
    with pytest.raises(ValueError, match="variant must be one of"):
        fp4.nvfp4_gemm_bf16(*args, variant=max(listed) + 1)


# ---- tiers: the numbers are the validation's --------------------------------------------------


def operands(m: int, n: int, k: int) -> list[torch.Tensor]:
    a, sfa = nvfp4_operand(m, k, 1)
    b, sfb = nvfp4_operand(n, k, 2)
    return [a, b, sfa, sfb]


def test_capabilities_tiers_match_the_spec(fp4):
    tiers = fp4.capabilities()["tiers"]
    assert tiers["mrows"]["m"] == (1, 16)
    assert tiers["mrows"]["n_multiple"] == 8 and tiers["mrows"]["k_multiple"] == "64 * warps"
    assert tiers["mrows"]["warps"] == (2, 4, 8) and tiers["mrows"]["stages"] == (1, 8)
    assert tiers["gemv_interleaved"] == {"m": (1, 1), "n_multiple": 8, "k_multiple": 64}
    assert tiers["m256"]["m_min"] == 512


def test_mrows_tier_m_range_is_enforced(fp4):
    low, high = fp4.capabilities()["tiers"]["mrows"]["m"]
    for m in (low, high):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(m, 64, 128))
    for m in (low - 1, high + 1):
        with pytest.raises(ValueError, match=rf"needs {low} <= M <= {high}, got M={m}"):
            fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(m, 64, 128))


def test_mrows_tier_warps_and_k_multiple_are_enforced(fp4):
    tier = fp4.capabilities()["tiers"]["mrows"]
    for warps in tier["warps"]:
        k = evaluate(tier["k_multiple"], warps=warps)
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(4, 64, k), warps=warps)
        with pytest.raises(ValueError, match=rf"K \({k + 64}\) must be a positive multiple of {k}"):
            fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(4, 64, k + 64), warps=warps)
    for warps in (1, 3, 16):
        assert warps not in tier["warps"]
        with pytest.raises(ValueError, match="warps must be one of"):
            fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(4, 64, 1024), warps=warps)


def test_mrows_tier_stages_range_is_enforced(fp4):
    low, high = fp4.capabilities()["tiers"]["mrows"]["stages"]
    for stages in (low, high):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(4, 64, 128), stages=stages)
    for stages in (low - 1, high + 1):
        with pytest.raises(ValueError, match=re.escape(f"stages must be an integer in [{low}, {high}]")):
            fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(4, 64, 128), stages=stages)


def test_mrows_tier_n_multiple_is_enforced(fp4):
    n = fp4.capabilities()["tiers"]["mrows"]["n_multiple"]
    fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(4, n, 128))
    with pytest.raises(ValueError, match=f"N \\({n + n // 2}\\) must be a positive multiple of {n}"):
        fp4.fp4_w4a4_gemm_warpsplit_mrows_bf16(*operands(4, n + n // 2, 128))


def gemv(fp4, m: int, n: int, k: int) -> torch.Tensor:
    a, b, sfa, sfb = operands(m, n, k)
    return fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, fp4.fp4_repack_b_interleaved_sm120(b), sfa, sfb)


def test_gemv_tier_m_n_k_are_enforced(fp4):
    tier = fp4.capabilities()["tiers"]["gemv_interleaved"]
    (m, _), n, k = tier["m"], tier["n_multiple"], tier["k_multiple"]
    assert gemv(fp4, m, n, k).shape == (m, n)
    with pytest.raises(ValueError, match=f"serves M = 1 only, got M={m + 1}"):
        gemv(fp4, m + 1, n, k)
    a, b, sfa, sfb = operands(m, n + n // 2, k)  # the repack itself would refuse this N
    with pytest.raises(ValueError, match=f"N \\({n + n // 2}\\) must be a positive multiple of {n}"):
        fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, b, sfa, sfb)
    a, b, sfa, sfb = operands(m, n, k + k // 2)
    with pytest.raises(ValueError, match=f"K \\({k + k // 2}\\) must be a positive multiple of {k}"):
        fp4.fp4_w4a4_gemv_warpsplit_interleaved_bf16(a, b, sfa, sfb)


def m256_call(fp4, m: int) -> torch.Tensor:
    a, b, sfa, sfb = operands(m, 16, 64)
    workspace = torch.zeros(fp4.nvfp4_gemm_m256_workspace_size(a, b, sfa, sfb), dtype=torch.uint8)
    return fp4.nvfp4_gemm_m256_bf16(a, b, sfa, sfb, workspace=workspace)


def test_m256_tier_m_min_is_enforced(fp4):
    m_min = fp4.capabilities()["tiers"]["m256"]["m_min"]
    assert m256_call(fp4, m_min).shape == (m_min, 16)
    with pytest.raises(ValueError, match=f"needs M >= {m_min}, got M={m_min - 1}"):
        m256_call(fp4, m_min - 1)


@pytest.mark.parametrize("arch", BLACKWELL)
@pytest.mark.parametrize("name", STAGED)
def test_capabilities_staged_gemms_are_compile_verified_on_blackwell(fp4, name, arch):
    require_built(fp4, compute_capability(ARCHS[arch]))
    assert fp4.capabilities()["functions"][name][arch] == "native (compile-verified)", name


# ---- flashrt compatibility (shared/spec/flashrt-head.md) ------------------------------------------

FLASHRT_KEYS = (
    "quantization", "block_size", "scale_layout", "scale_size", "layouts", "cuda_capabilities",
    "public_m_alignment", "raw_sm120_tile_m", "sm120_m256_min_m", "sm120_m256_qualified_nk",
    "sm120_m256_diagnostic_nk", "sm120_interleaved_gemv_m", "sm120_interleaved_weight_layout",
    "sm120_warpsplit_mrows", "sm120_warpsplit_mrows_n_alignment", "sm120_warpsplit_mrows_k_alignment",
    "sm120_w4a16_marlin_m", "sm120_w4a16_marlin_n_alignment", "sm120_w4a16_marlin_k_alignment",
    "sm120_w4a16_marlin_weight_layout", "sm120_w4a16_marlin_scale_layout", "errors",
)  # fmt: skip


def test_capabilities_carry_every_flashrt_key(fp4):
    assert set(FLASHRT_KEYS) <= set(fp4.capabilities())


def test_flashrt_keys_state_this_packages_tiers(fp4):
    caps = fp4.capabilities()
    tiers = caps["tiers"]
    assert caps["errors"] == "exceptions"  # ValueError / RuntimeError: caps["error_types"]
    assert caps["public_m_alignment"] == caps["alignment"]["public_m"] == 1
    assert caps["sm120_m256_min_m"] == tiers["m256"]["m_min"]
    assert caps["sm120_interleaved_gemv_m"] == tiers["gemv_interleaved"]["m"][0]
    assert caps["sm120_interleaved_weight_layout"] in caps["layouts"]
    assert caps["sm120_warpsplit_mrows"] == tiers["mrows"]["m"]
    assert caps["sm120_warpsplit_mrows_n_alignment"] == tiers["mrows"]["n_multiple"]
    assert caps["sm120_warpsplit_mrows_k_alignment"] == tiers["mrows"]["k_multiple"]
    assert caps["raw_sm120_tile_m"] == 128


def test_flashrt_keys_claim_nothing_unmeasured(fp4):
    """No sm_120 GPU has run this package's kernels: no (N, K) is called qualified there."""
    caps = fp4.capabilities()
    assert caps["sm120_m256_qualified_nk"] == caps["sm120_m256_diagnostic_nk"] == ()


def test_flashrt_w4a16_keys_describe_this_packages_tier(fp4):
    caps = fp4.capabilities()
    assert caps["sm120_w4a16_marlin_k_alignment"] == 32 and caps["sm120_w4a16_marlin_n_alignment"] == 1
    assert caps["sm120_w4a16_marlin_weight_layout"] in caps["layouts"]
    assert caps["sm120_w4a16_marlin_scale_layout"] in caps["layouts"]


@pytest.mark.parametrize("variant", [7, 10])
@pytest.mark.parametrize(
    "name", ["nvfp4_gemm_bf16", "nvfp4_gemm_fp16", "nvfp4_gemm_variant_bf16", "fp4_w4a16_linear_bf16"]
)
def test_flashrt_schedule_ids_are_hints_that_run_the_automatic_choice(fp4, name, variant):
    args, _ = make_call(name, "cpu")
    with OpRecorder(fp4.ops.name) as recorder:
        got = getattr(fp4, name)(*args, variant=variant)
    recorded = zip(recorder.called, recorder.arguments, strict=True)
    (call,) = [fp4._gemm.GemmCall.from_op_arguments(*a) for n, a in recorded if n == "gemm"]
    assert call.variant == fp4.capabilities()["variant_hints"][variant] == -1
    auto = fp4.nvfp4_gemm_fp16 if name == "nvfp4_gemm_fp16" else fp4.nvfp4_gemm_bf16
    assert torch.equal(got, auto(*args, variant=-1)), f"{name} variant={variant}"
