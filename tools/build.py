#!/usr/bin/env python3
"""Build the kernels-hub variant of fp4-gemm locally, without Nix.

Reads build.toml, compiles every kernel section for its own CUDA capabilities (torch.utils.cpp_extension
paths + ninja, against the installed torch and the CUTLASS headers of the PyPI package nvidia-cutlass),
links one abi3 extension and writes the Hub layout that kernel-builder produces:

    build/torch<MAJ><MIN>-cxx11-cu<CUDA>-x86_64-linux/
        __init__.py ... (torch-ext/fp4_gemm/)   _ops.py (generated)   _fp4_gemm_<id>.abi3.so
        metadata.json                           fp4_gemm/__init__.py (compat entry)

    python tools/build.py                 # this machine's GPU arch; without a GPU, every arch
    python tools/build.py --archs all     # every arch in build.toml (what CI and releases build)
    python tools/build.py --archs 9.0a    # a subset
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")  # before torch guesses a wrong one

import torch  # noqa: E402
import torch.utils.cpp_extension as cpp_extension  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fp4_gemm"
PY_LIMITED_API = "0x03090000"  # abi3: loads in any CPython >= 3.9
SOURCE_SUFFIXES = (".cu", ".cpp", ".cc")


@dataclass(frozen=True)
class Section:
    """One [kernel.*] section of build.toml, reduced to what this build compiles."""

    name: str
    capabilities: tuple[str, ...]
    sources: tuple[str, ...]
    includes: tuple[str, ...]
    cuda_flags: tuple[str, ...]
    uses_cutlass: bool


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--archs",
        help="comma- or space-separated capabilities to build, e.g. '9.0a', or 'all' (default: the GPU's "
        "capability when torch sees a GPU, else all)",
    )
    parser.add_argument("-j", "--jobs", type=int, default=2, help="parallel compilations (a CUTLASS unit needs ~5 GB)")
    parser.add_argument(
        "--build-dir", type=Path, default=ROOT / "build", help="where the variant goes (default build/)"
    )
    return parser.parse_args()


def build_toml_capabilities(config: dict) -> list[str]:
    caps = {c for kernel in config.get("kernel", {}).values() for c in kernel["cuda-capabilities"]}
    return sorted(caps, key=capability_key)


def default_archs(config: dict, gpu: tuple[int, int] | None) -> tuple[set[str] | None, str]:
    """What to build without --archs, and why: the GPU's own capability when build.toml lists it
    (one arch compiles in a fraction of the time), else every arch (None)."""
    if gpu is None:
        return None, "no GPU visible to torch: every arch in build.toml"
    matching = [c for c in build_toml_capabilities(config) if capability_key(c) == gpu]
    if not matching:
        return None, f"this GPU's capability {gpu[0]}.{gpu[1]} is not in build.toml: every arch"
    return set(matching), f"this machine's GPU (capability {gpu[0]}.{gpu[1]}): {', '.join(matching)} only"


def wanted_archs(archs: str | None, config: dict) -> tuple[set[str] | None, str]:
    """The --archs selection (None = every arch in build.toml) and a line saying how it was chosen."""
    if archs is None:
        gpu = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
        wanted, why = default_archs(config, gpu)
        return wanted, f"{why} (--archs all builds every arch)"
    if archs.strip() == "all":
        return None, "--archs all: every arch in build.toml"
    return set(re.split(r"[,\s]+", archs.strip())), f"--archs {archs}"


def nvcc_path() -> Path:
    return Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc"


def nvcc_version() -> tuple[int, int]:
    out = subprocess.run([str(nvcc_path()), "--version"], check=True, capture_output=True, text=True).stdout
    major, minor = re.search(r"release (\d+)\.(\d+)", out).groups()
    return int(major), int(minor)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def load_sections(config: dict, wanted: set[str] | None, cuda: tuple[int, int]) -> list[Section]:
    sections = []
    for name, kernel in config.get("kernel", {}).items():
        caps = tuple(c for c in kernel["cuda-capabilities"] if wanted is None or c in wanted)
        minver = kernel.get("cuda-minver")
        if minver and cuda < version_tuple(minver)[:2]:
            print(f"skip [kernel.{name}]: needs CUDA >= {minver}, nvcc is {cuda[0]}.{cuda[1]}")
            continue
        if not caps:
            continue
        sections.append(
            Section(
                name=name,
                capabilities=caps,
                sources=tuple(s for s in kernel["src"] if s.endswith(SOURCE_SUFFIXES)),
                includes=tuple(kernel.get("include", [])),
                cuda_flags=tuple(kernel.get("cuda-flags", [])),
                uses_cutlass=any(d.startswith("cutlass") for d in kernel.get("depends", [])),
            )
        )
    compiled = [s for section in sections for s in section.sources]
    duplicates = sorted({s for s in compiled if compiled.count(s) > 1})
    if duplicates:
        sys.exit(f"build.toml lists these sources in more than one section: {duplicates}")
    return sections


def unique_id(config: dict) -> str:
    """Content hash of everything that goes into the variant, so two builds never share a namespace."""
    digest = hashlib.sha256((ROOT / "build.toml").read_bytes())
    files = [ROOT / p for p in config["torch"]["src"]]
    for kernel in config.get("kernel", {}).values():
        files += [ROOT / p for p in kernel["src"]]
    files += sorted((ROOT / "torch-ext" / PACKAGE).glob("*.py"))
    for path in sorted(set(files)):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def variant_name(cuda: tuple[int, int]) -> str:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    return f"torch{major}{minor}-{abi}-cu{cuda[0]}{cuda[1]}-{platform.machine()}-linux"


def capability_key(capability: str) -> tuple[int, int]:
    major, minor = capability.rstrip("af").split(".")
    return int(major), int(minor)


def gencode(capability: str) -> str:
    digits = capability.replace(".", "")
    return f"-gencode=arch=compute_{digits},code=sm_{digits}"


def cutlass_includes() -> list[str]:
    import cutlass_library

    source = Path(cutlass_library.__file__).parent / "source"
    return [str(source / "include"), str(source / "tools" / "util" / "include")]


def cuda_includes() -> list[str]:
    """The toolkit's headers, plus the torch wheel's CUDA libraries (cublas_v2.h, cusparse.h, ...)."""
    includes = [str(Path(cpp_extension.CUDA_HOME) / "include")]
    wheel = Path(torch.__file__).parent.parent / "nvidia" / f"cu{torch.version.cuda.split('.')[0]}" / "include"
    if wheel.is_dir():
        includes.append(str(wheel))
    return includes


REGISTRATION_H = """\
// Generated by tools/build.py: the local equivalent of kernel-builder's registration.h.
#pragma once

#include <Python.h>

#define FP4_GEMM_CONCAT_(A, B) A##B
#define FP4_GEMM_CONCAT(A, B) FP4_GEMM_CONCAT_(A, B)
#define FP4_GEMM_STRINGIFY_(A) #A
#define FP4_GEMM_STRINGIFY(A) FP4_GEMM_STRINGIFY_(A)

// TORCH_LIBRARY with a macro-expanded namespace.
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)

// A bare module through the limited API, so `from . import <name>` loads the library (abi3).
#define REGISTER_EXTENSION(NAME)                                                             \\
  PyMODINIT_FUNC FP4_GEMM_CONCAT(PyInit_, NAME)() {                                          \\
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, FP4_GEMM_STRINGIFY(NAME),     \\
                                        nullptr, 0, nullptr};                                \\
    return PyModule_Create(&module);                                                         \\
  }
"""

OPS_PY = '''\
# Generated by tools/build.py: the op namespace of this build.
import torch

from . import {ops_name}  # noqa: F401  (loads the library, which registers the ops)

ops = torch.ops.{ops_name}


def add_op_namespace_prefix(op_name: str) -> str:
    """Prefix op by namespace."""
    return f"{ops_name}::{{op_name}}"
'''

COMPAT_INIT = """\
# Generated by tools/build.py: entry for loaders that import `<variant>/{package}/`.
# The package is the variant directory itself; load it under this name and expose everything it
# has: __all__, and the rest (ops, reference, layers, the submodules) as the package module does.
import importlib.util
import sys
from pathlib import Path

_root = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    f"{{__name__}}._variant", _root / "__init__.py", submodule_search_locations=[str(_root)]
)
_variant = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _variant
_spec.loader.exec_module(_variant)
__all__ = list(_variant.__all__)
globals().update({{name: value for name, value in vars(_variant).items() if not name.startswith("__")}})
"""


def cudart_ldflags() -> list[str]:
    """Link flags for the toolkit's CUDA runtime: lib64/libcudart.so of a system toolkit, or the
    versioned lib/libcudart.so.<major> that the PyPI nvidia-cuda-runtime wheel ships."""
    home = Path(cpp_extension.CUDA_HOME)
    for lib in (home / "lib64", home / "lib"):
        if (lib / "libcudart.so").exists():
            return [f"-L{lib}", "-lcudart"]
        versioned = sorted(lib.glob("libcudart.so.[0-9]*"))
        if versioned:
            return [f"-L{lib}", f"-l:{versioned[0].name}"]
    sys.exit(f"no libcudart under {home}/lib64 or {home}/lib (set CUDA_HOME to a CUDA toolkit)")


def ninja_escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def write_ninja(sections: list[Section], torch_sources: list[str], ops_name: str, work: Path, library: Path) -> None:
    base = ["-std=c++17", "-O3", "-DNDEBUG", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"]
    includes = [str(ROOT), str(work / "gen"), *cuda_includes()]
    torch_includes = [p for p in cpp_extension.include_paths("cuda") if p not in includes]
    torch_includes.append(sysconfig.get_paths()["include"])
    any_cutlass = any(section.uses_cutlass for section in sections)
    extra = cutlass_includes() if any_cutlass else []

    def flags(items: list[str]) -> str:
        return " ".join(shlex.quote(item) for item in items)

    def inc(paths: list[str]) -> list[str]:
        return [f"-I{p}" for p in paths]

    lines = [
        "ninja_required_version = 1.3",
        f"cxx = {shlex.quote(os.environ.get('CXX', 'c++'))}",
        f"nvcc = {shlex.quote(str(nvcc_path()))}",
        "rule cxx",
        "  command = $cxx -MMD -MF $out.d $flags -fPIC -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CXX $in",
        "rule nvcc",
        "  command = $nvcc -MD -MF $out.d $flags -Xcompiler -fPIC -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = NVCC $in",
        "rule link",
        "  command = $cxx -shared $in -o $out $ldflags",
        "  description = LINK $out",
    ]
    objects = []

    def add_unit(source: str, section: str, unit_flags: list[str]) -> None:
        obj = work / "obj" / section / (source + ".o")
        rule = "nvcc" if source.endswith(".cu") else "cxx"
        lines.append(f"build {ninja_escape(str(obj))}: {rule} {ninja_escape(str(ROOT / source))}")
        lines.append(f"  flags = {flags(unit_flags)}")
        objects.append(str(obj))

    for source in torch_sources:
        unit = [*base, f"-DTORCH_EXTENSION_NAME={ops_name}", f"-DPy_LIMITED_API={PY_LIMITED_API}"]
        add_unit(source, "torch", unit + inc(includes + torch_includes))
    for section in sections:
        section_includes = includes + [str(ROOT / i) for i in section.includes]
        if section.uses_cutlass:
            section_includes += extra
        for source in section.sources:
            if source.endswith(".cu"):
                arch = [gencode(c) for c in section.capabilities]
                unit = [*base, "--expt-relaxed-constexpr", *arch, *section.cuda_flags]
            else:
                unit = list(base)
            add_unit(source, section.name, unit + inc(section_includes))

    torch_lib = cpp_extension.library_paths("cuda")[0]
    ldflags = [f"-L{torch_lib}", "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", *cudart_ldflags()]
    lines.append(f"build {ninja_escape(str(library))}: link {' '.join(ninja_escape(o) for o in objects)}")
    lines.append(f"  ldflags = {flags(ldflags)}")
    (work / "build.ninja").write_text("\n".join(lines) + "\n")


def ninja_log_lines(work: Path) -> list[str]:
    log = work / ".ninja_log"
    return log.read_text().splitlines() if log.exists() else []


def run_ninja(work: Path, jobs: int) -> None:
    """Run ninja and print how long each unit it compiled took (read back from ninja's own log)."""
    seen = len(ninja_log_lines(work))
    if subprocess.run(["ninja", "-C", str(work), "-j", str(jobs)]).returncode != 0:
        sys.exit("build failed (the compiler's message is above)")
    entries = [line.split("\t") for line in ninja_log_lines(work)[seen:] if not line.startswith("#")]
    if not entries:
        print("nothing to compile: the build is up to date")
    for start, end, _mtime, output, *_ in sorted(entries, key=lambda entry: int(entry[0])):
        name = os.path.relpath(output, work / "obj") if "/obj/" in output else Path(output).name
        print(f"  {(int(end) - int(start)) / 1000:7.1f} s  {name}")


def write_variant(variant: Path, library: Path, ops_name: str, config: dict, archs: list[str]) -> None:
    if variant.exists():
        shutil.rmtree(variant)
    variant.mkdir(parents=True)
    for source in sorted((ROOT / "torch-ext" / PACKAGE).glob("*.py")):
        shutil.copy2(source, variant / source.name)
    (variant / "_ops.py").write_text(OPS_PY.format(ops_name=ops_name))
    shutil.copy2(library, variant / library.name)
    general = config["general"]
    metadata = {
        "id": ops_name,
        "name": general["name"],
        "version": general["version"],
        "license": general["license"],
        "python-depends": [],
        "backend": {"type": "cuda", "archs": archs},
    }
    (variant / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    compat = variant / PACKAGE
    compat.mkdir()
    (compat / "__init__.py").write_text(COMPAT_INIT.format(package=PACKAGE))


def main() -> None:
    args = parse_args()
    config = tomllib.loads((ROOT / "build.toml").read_text())
    wanted, why = wanted_archs(args.archs, config)
    print(f"archs: {why}")
    cuda = nvcc_version()
    sections = load_sections(config, wanted, cuda)
    if not sections:
        sys.exit(f"no kernel section of build.toml matches --archs {args.archs}")
    archs = sorted({c for section in sections for c in section.capabilities}, key=capability_key)
    ops_name = f"_{PACKAGE}_{unique_id(config)}"
    print(f"building {ops_name} for {', '.join(archs)} with nvcc {cuda[0]}.{cuda[1]}, torch {torch.__version__}")
    for section in sections:
        print(f"  [kernel.{section.name}] {' '.join(section.capabilities)}: {len(section.sources)} unit(s)")

    build = args.build_dir.resolve()
    work = build / "_work"
    (work / "gen").mkdir(parents=True, exist_ok=True)
    (work / "gen" / "registration.h").write_text(REGISTRATION_H)
    for stale in work.glob("_fp4_gemm_*.abi3.so"):
        stale.unlink()
    library = work / f"{ops_name}.abi3.so"
    torch_sources = [s for s in config["torch"]["src"] if s.endswith(SOURCE_SUFFIXES)]
    write_ninja(sections, torch_sources, ops_name, work, library)

    started = time.time()
    run_ninja(work, args.jobs)
    elapsed = time.time() - started

    variant = build / variant_name(cuda)
    write_variant(variant, library, ops_name, config, archs)
    print(f"build time {elapsed:.1f} s -> {variant}")


if __name__ == "__main__":
    main()
