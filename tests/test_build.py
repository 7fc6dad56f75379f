"""build.toml, flake.nix, the local build tool and the built variant agree with each other and HUB.md.

The ecosystem's own checkers do the generic checks: kernels' build.toml parser (kernels-data's
`Build.open`, which `kernel-builder check-config` runs), its metadata.json reader (what
`kernel-builder check-builds` runs), and `kernel-abi-check` (what `kernel-builder check-abi` runs) on
the built library. The asserts written here are this project's own rules.
"""

from __future__ import annotations

import base64
import filecmp
import hashlib
import os
import re
import shutil
import subprocess

import pytest
from conftest import REPO_ID, ROOT, build_config, load_module, requires_repo_file, variant_dir, variant_metadata
from machine_code import cuobjdump, library

pytestmark = pytest.mark.kernels_ci

ARCH_SECTIONS = {
    "common": ["9.0a", "10.0f", "11.0a", "12.0f"],
    "sm90": ["9.0a"],
    "sm100": ["10.0f"],
    "sm110": ["11.0a"],
    "sm120": ["12.0f"],
}
# kernel-builder's default CUDA arch list for CUDA >= 13.0 (its templates/torch/preamble.cmake): an
# `a` or `f` capability of build.toml survives its utils.cmake intersection only where its base is here.
KERNEL_BUILDER_CUDA13_ARCHS = {"7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "11.0", "12.0", "12.1"}


def load_build_tool():
    return load_module("fp4_gemm_build_tool", requires_repo_file("tools/build.py"))


def all_capabilities(config: dict) -> set[str]:
    return {c for kernel in config["kernel"].values() for c in kernel["cuda-capabilities"]}


def test_build_toml_passes_kernel_builders_config_check(capfd):
    """kernels-common's parser, as the 0.19 client bundles it (kernel-builder check-config runs the same
    code; no public entry point exists). It reads editions 4 and 5 too, upgrading them in memory with a
    warning on stderr: an edition 6 file parses without one."""
    from kernels._rust import Build

    build = Build.open(ROOT)  # raises ValueError naming the field on any schema violation
    assert [str(backend) for backend in build.general.backends] == ["cuda"]
    assert "edition" not in capfd.readouterr().err


def test_build_toml_general_follows_hub_conventions():
    general = build_config()["general"]
    assert general["name"] == "fp4-gemm" and general["version"] == 1 and general["edition"] == 6
    assert general["license"] == "Apache-2.0" and general["backends"] == ["cuda"]
    assert general["build-layout"] == "files"
    assert general["cuda"]["minver"] == "12.8"
    assert general["hub"]["repo-id"] == REPO_ID == "org/fp4-gemm"


def test_build_toml_has_one_section_per_arch_family():
    kernels = build_config()["kernel"]
    assert {name: k["cuda-capabilities"] for name, k in kernels.items()} == ARCH_SECTIONS
    assert kernels["sm110"]["cuda-minver"] == "13.0"
    assert all(k["language"] == "cpp-cuda" for k in kernels.values())


def test_build_toml_capabilities_are_arch_or_family_specific():
    """wgmma, tcgen05 and the block-scaled MMA exist only in `a` (one capability) or `f` (a family:
    10.0f runs on B200 and B300, 12.0f on the RTX 50 series and DGX Spark) code."""
    assert all(c.endswith(("a", "f")) for c in all_capabilities(build_config()))


@pytest.mark.parametrize("capability", sorted(all_capabilities(build_config())))
def test_build_toml_capability_survives_kernel_builders_arch_filter(capability):
    """kernel-builder drops an `a`/`f` capability whose base is not in its CUDA 13 arch list (10.3a is
    dropped there: B300 gets its code from 10.0f instead)."""
    assert capability[:-1] in KERNEL_BUILDER_CUDA13_ARCHS


def test_build_toml_sources_exist_and_units_compile_in_one_section():
    config = build_config()
    sources = list(config["torch"]["src"]) + [s for k in config["kernel"].values() for s in k["src"]]
    assert [s for s in sources if not (ROOT / s).is_file()] == []
    units = [s for k in config["kernel"].values() for s in k["src"] if s.endswith((".cu", ".cpp"))]
    assert len(units) == len(set(units))


def included_sources(files: list[str]) -> set[str]:
    """The files and every csrc/ header they include, transitively."""
    seen, todo = set(), list(files)
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += re.findall(r'#include "(csrc/[^"]+)"', (ROOT / path).read_text())
    return seen


@pytest.mark.parametrize("section", sorted(build_config()["kernel"]))
def test_build_toml_section_lists_every_source_its_units_include(section):
    kernel = build_config()["kernel"][section]
    units = [s for s in kernel["src"] if s.endswith((".cu", ".cpp"))]
    assert included_sources(units) == set(kernel["src"]), section


def test_every_csrc_file_is_listed_in_build_toml():
    config = build_config()
    listed = {s for k in config["kernel"].values() for s in k["src"]}
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*") if p.is_file()}
    assert on_disk - listed == set()


def test_flake_uses_kernel_builder_on_this_directory():
    flake = requires_repo_file("flake.nix").read_text()
    assert "kernel-builder.lib.genKernelFlakeOutputs" in flake
    assert re.search(r"path\s*=\s*\./\.;", flake)


def test_flake_pins_the_kernel_builder_release_of_the_tested_client():
    """No flake.lock can be made without Nix: the input URL names the release tag of requirements.txt's
    kernels client, whose parser reads build.toml edition 6."""
    flake = requires_repo_file("flake.nix").read_text()
    client = re.search(r"^kernels==(\S+)", requires_repo_file("requirements.txt").read_text(), re.M).group(1)
    assert f'kernel-builder.url = "github:huggingface/kernels/v{client}";' in flake


def test_build_tool_default_builds_every_arch():
    tool = load_build_tool()
    config = build_config()
    sections = tool.load_sections(config, None, (13, 0))
    assert {c for s in sections for c in s.capabilities} == all_capabilities(config)


def test_build_tool_skips_sections_newer_than_the_toolkit():
    tool = load_build_tool()
    names = [s.name for s in tool.load_sections(build_config(), None, (12, 8))]
    assert "sm110" not in names and "common" in names


def test_build_tool_defaults_to_the_gpus_arch():
    wanted, why = load_build_tool().default_archs(build_config(), (9, 0))
    assert wanted == {"9.0a"} and "9.0a" in why


def test_build_tool_defaults_to_the_family_target_of_a_family_member():
    wanted, _ = load_build_tool().default_archs(build_config(), (10, 3))  # B300 runs 10.0f code
    assert wanted == {"10.0f"}


def torch_env(tool, version: str, cuda: str):
    return tool.TorchEnv(
        python="python", version=version, cuda=cuda, cxx11_abi=True, machine="x86_64", includes=(),
        library_dir="", python_include="", cuda_wheel_include=None, gpu=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "version, cuda, variant, standard",
    [
        ("2.14.1+cu130", "13.0", "torch214-cxx11-cu130-x86_64-linux", "c++20"),
        ("2.13.0", "13.2", "torch213-cxx11-cu132-x86_64-linux", "c++20"),
        ("2.12.0+cu126", "12.6", "torch212-cxx11-cu126-x86_64-linux", "c++20"),
        ("2.11.0+cu130", "13.0", "torch211-cxx11-cu130-x86_64-linux", "c++17"),
    ],
)
def test_build_tool_names_variants_and_picks_the_binding_standard_as_kernel_builder(version, cuda, variant, standard):
    env = torch_env(load_build_tool(), version, cuda)
    assert (env.variant, env.cxx_standard) == (variant, standard)


def test_build_tool_and_tests_agree_on_this_torchs_variant():
    import sys

    from conftest import running_variant_name

    assert load_build_tool().read_torch_env(sys.executable).variant == running_variant_name()


def test_build_tool_defaults_to_every_arch_without_a_gpu():
    wanted, why = load_build_tool().default_archs(build_config(), None)
    assert wanted is None and "every arch" in why


def test_build_tool_defaults_to_every_arch_on_a_gpu_build_toml_lacks():
    wanted, why = load_build_tool().default_archs(build_config(), (8, 9))
    assert wanted is None and "8.9" in why


def test_build_tool_archs_all_builds_every_arch():
    assert load_build_tool().wanted_archs("all", build_config())[0] is None


def test_build_tool_archs_subset_keeps_matching_sections_only():
    tool = load_build_tool()
    sections = tool.load_sections(build_config(), {"9.0a"}, (13, 0))
    assert {s.name: s.capabilities for s in sections} == {"common": ("9.0a",), "sm90": ("9.0a",)}


def test_variant_layout_matches_hub():
    """What kernel-builder's output holds too (its ci-test runs this on that output)."""
    variant = variant_dir()
    assert re.fullmatch(r"torch\d\d+-cxx11-cu\d+-x86_64-linux", variant.name)
    meta = variant_metadata()
    for name in ("__init__.py", "_ops.py", "metadata.json", f"{meta['id']}.abi3.so"):
        assert (variant / name).is_file(), name
    for source in (ROOT / "torch-ext" / "fp4_gemm").glob("*.py"):
        assert filecmp.cmp(source, variant / source.name, shallow=False), source.name


def test_variant_has_no_compat_package():
    """kernel-builder stopped writing <variant>/fp4_gemm/ (the package is the variant directory)."""
    assert not (variant_dir() / "fp4_gemm").exists()


def test_variant_metadata_is_read_by_kernels():
    from kernels import Metadata

    metadata = Metadata.read_from_file(variant_dir() / "metadata.json")
    assert str(metadata.backend.backend_type) == "cuda"
    assert metadata.backend.archs == variant_metadata()["backend"]["archs"]


def test_variant_metadata_matches_build_toml():
    meta, general = variant_metadata(), build_config()["general"]
    assert meta["name"] == general["name"] and meta["version"] == general["version"]
    assert meta["license"] == general["license"] and meta["python-depends"] == []
    assert meta["build-layout"] == general["build-layout"] and meta["kernel-depends"] == []
    assert meta["backend"]["type"] == "cuda"
    assert set(meta["backend"]["archs"]) <= all_capabilities(build_config())
    assert meta["backend"]["archs"] == sorted(meta["backend"]["archs"])  # kernel-builder's string sort


def test_variant_metadata_digest_covers_every_file_as_kernel_builder_hashes_it():
    """kernels-common's digest: SHA-256 per file, padded base64, every file but metadata.json."""
    variant = variant_dir()
    files = variant_metadata()["digest"]["files"]
    on_disk = sorted(
        str(p.relative_to(variant)) for p in variant.rglob("*")
        if p.is_file() and p.name != "metadata.json" and "__pycache__" not in p.parts
    )  # fmt: skip
    assert variant_metadata()["digest"]["algorithm"] == "sha256" and sorted(files) == on_disk
    hello = base64.b64encode(hashlib.sha256(b"hello world").digest()).decode()
    assert hello == "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="  # kernels-common's own test vector
    for name in on_disk:
        assert files[name] == base64.b64encode(hashlib.sha256((variant / name).read_bytes()).digest()).decode()


def test_variant_metadata_records_the_source_revision():
    provenance = variant_metadata()["provenance"]
    assert provenance["kernel-builder"]["version"]
    if "kernel" in provenance:  # absent where the build did not come from a git checkout
        assert re.fullmatch(r"[0-9a-f]{40}", provenance["kernel"]["commit"])
        assert isinstance(provenance["kernel"]["dirty"], bool)


def abi_checked_library():
    checker = pytest.importorskip("kernel_abi_check", reason="pip install kernel-abi-check (requirements.txt)")
    return checker.ObjectFile(library())


def test_variant_library_is_abi3_for_python_3_9():
    assert abi_checked_library().check_python_abi("3.9") == []


# Symbols a local build takes from this machine's glibc (>= 2.34) headers and kernel-builder's glibc
# 2.28 toolchain does not: GCC's shared_ptr refcounts read `__libc_single_threaded` (glibc 2.32),
# and glibc 2.34 moved dlopen/dlsym into libc with new symbol versions.
LOCAL_GLIBC_SYMBOLS = {("__libc_single_threaded", "GLIBC", "2.32"), ("dlopen", "GLIBC", "2.34"),
                       ("dlsym", "GLIBC", "2.34")}  # fmt: skip


def test_variant_library_is_manylinux_2_28_but_for_the_local_glibc_symbols():
    """Release builds come from kernel-builder's glibc 2.28 toolchain. Any violation but
    LOCAL_GLIBC_SYMBOLS fails; those alone make an expected failure that names them."""
    violations = {(v.name, v.dep, v.version) for v in abi_checked_library().check_manylinux("manylinux_2_28")}
    unexpected = sorted(violations - LOCAL_GLIBC_SYMBOLS)
    assert not unexpected, "manylinux_2_28 violations: " + ", ".join(f"{n} ({d} {v})" for n, d, v in unexpected)
    if violations:
        found = ", ".join(f"{n} ({d} {v})" for n, d, v in sorted(violations))
        glibc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "unknown glibc"
        pytest.xfail(f"a local build ({glibc}) links this machine's glibc symbols: {found}")


# what a Hub kernel may link besides the C/C++ runtime: torch and the CUDA runtime
ALLOWED_LIBRARIES = re.compile(r"lib(c10|c10_cuda|torch|torch_cpu|torch_cuda|cudart)\.so.*")
SYSTEM_LIBRARIES = re.compile(r"(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so.*|ld-linux.*")


def test_variant_library_has_no_gnu_unique_symbols():
    """-fno-gnu-unique, as kernel-builder compiles: a STB_GNU_UNIQUE symbol pins the library in the
    process, so a second build of the package could not load beside it."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    symbols = subprocess.run([readelf, "-Ws", str(library())], capture_output=True, text=True, check=True).stdout
    assert [line for line in symbols.splitlines() if " UNIQUE " in line] == []


def test_variant_library_links_only_torch_and_the_cuda_runtime():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run([readelf, "-d", str(library())], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert needed and [n for n in needed if not (ALLOWED_LIBRARIES.fullmatch(n) or SYSTEM_LIBRARIES.fullmatch(n))] == []


@pytest.mark.machine_code
def test_variant_library_has_a_cubin_for_every_built_arch():
    meta = variant_metadata()
    listing = subprocess.run([cuobjdump(), "--list-elf", str(library())], capture_output=True, text=True, check=True)
    cubin_archs = set(re.findall(r"\.sm_(\d+a?)\.cubin", listing.stdout))
    # cuobjdump names an `a` cubin sm_90a, a family (`f`) cubin by its base: sm_100
    expected = {c.replace(".", "").rstrip("f") for c in meta["backend"]["archs"]}
    assert expected <= cubin_archs, listing.stdout


def test_ci_test_copies_kernel_builders_source_set():
    """tools/ci_test.py's source set, as nix-builder/lib/source-set.nix selects it: build.toml, every
    source of [torch] and [kernel.*], the *.py of torch-ext/ and tests/, nothing else."""
    tool = load_module("fp4_gemm_ci_test", requires_repo_file("tools/ci_test.py"))
    config = build_config()
    files = set(tool.source_set(ROOT, config))
    listed = {"build.toml", *config["torch"]["src"], *(s for k in config["kernel"].values() for s in k["src"])}
    python = {str(p.relative_to(ROOT)) for d in ("torch-ext", "tests") for p in (ROOT / d).rglob("*.py")}
    assert files == listed | {p for p in python if "__pycache__" not in p}
    assert not files & {"pytest.ini", "flake.nix", "CARD.md", "tools/build.py", "benchmarks/benchmark.py"}
