#!/usr/bin/env python3
"""Build the kernels-hub variants of fp4-gemm locally, without Nix.

Reads build.toml and writes the Hub layout kernel-builder writes, one variant per torch:

    build/torch<MAJ><MIN>-cxx11-cu<CUDA>-<machine>-linux/
        __init__.py ... (torch-ext/fp4_gemm/)   _ops.py (generated)   _fp4_gemm_cuda_<id>.abi3.so
        metadata.json (name, id, backend archs, digest of every file, provenance)

csrc/ includes no torch header, so its units are compiled once per arch set (C++20, the standard of
every torch in the release matrix) and shared by every variant; only torch-ext/torch_binding.cpp is
compiled per torch, with the C++ standard kernel-builder gives that torch (C++17 below 2.12, C++20
from 2.12). `<CUDA>` is the torch's own CUDA (torch.version.cuda), as kernel-builder names it.

    python tools/build.py                            # this interpreter's torch; the GPU's arch, else all
    python tools/build.py --archs all                # every arch in build.toml
    python tools/build.py --archs 9.0a               # a subset
    python tools/build.py --torch .venv/bin/python --torch .venv-torch213/bin/python   # two variants

Compiler flags follow kernel-builder's CMake templates: -O3 -DNDEBUG (its Release build type),
--expt-relaxed-constexpr, one -gencode per capability of the section, -fno-gnu-unique on host code
(so two builds of the package can live in one process), an abi3 module for CPython >= 3.9.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fp4_gemm"
BACKEND = "cuda"
PY_LIMITED_API = "0x03090000"  # abi3: loads in any CPython >= 3.9
SOURCE_SUFFIXES = (".cu", ".cpp", ".cc")
CSRC_STANDARD = "c++20"
FIRST_CXX20_TORCH = (2, 12)  # kernel-builder's utils.cmake: CXX_STANDARD 17 below torch 2.12, else 20
# The metadata format this build writes: kernel-builder 0.19's (build-layout, kernels-minver, digest,
# provenance); kernels-minver is its baseline for a package without kernel dependencies.
LAYOUT_VERSION = "0.19.1"
KERNELS_MINVER = "0.14.0"
HOST_FLAGS = ("-fno-gnu-unique",)


@dataclass(frozen=True)
class Section:
    """One [kernel.*] section of build.toml, reduced to what this build compiles."""

    name: str
    capabilities: tuple[str, ...]
    sources: tuple[str, ...]
    includes: tuple[str, ...]
    cuda_flags: tuple[str, ...]
    uses_cutlass: bool


@dataclass(frozen=True)
class TorchEnv:
    """What one torch installation gives the build (read by running its interpreter)."""

    python: str
    version: str  # "2.14.1"
    cuda: str  # torch.version.cuda, "13.0"
    cxx11_abi: bool
    machine: str
    includes: tuple[str, ...]  # torch's headers
    library_dir: str
    python_include: str
    cuda_wheel_include: str | None  # cublasLt.h and friends from the nvidia-* wheels torch depends on
    gpu: tuple[int, int] | None

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor = self.version.split("+")[0].split(".")[:2]
        return int(major), int(minor)

    @property
    def tag(self) -> str:
        return "torch{}{}".format(*self.major_minor)

    @property
    def variant(self) -> str:
        return f"{self.tag}-cxx11-cu{self.cuda.replace('.', '')}-{self.machine}-linux"

    @property
    def cxx_standard(self) -> str:
        return "c++20" if self.major_minor >= FIRST_CXX20_TORCH else "c++17"


TORCH_QUERY = """\
import json, platform, sysconfig
from pathlib import Path
import torch
import torch.utils.cpp_extension as cpp_extension
wheel = Path(torch.__file__).parent.parent / "nvidia" / f"cu{(torch.version.cuda or '0').split('.')[0]}" / "include"
print(json.dumps({
    "version": torch.__version__,
    "cuda": torch.version.cuda,
    "cxx11_abi": torch.compiled_with_cxx11_abi(),
    "machine": platform.machine(),
    "includes": cpp_extension.include_paths("cuda"),
    "library_dir": cpp_extension.library_paths("cuda")[0],
    "python_include": sysconfig.get_paths()["include"],
    "cuda_wheel_include": str(wheel) if wheel.is_dir() else None,
    "gpu": list(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None,
}))
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--archs",
        help="comma- or space-separated capabilities to build, e.g. '9.0a', or 'all' (default: the GPU's "
        "capability when torch sees a GPU, else all)",
    )
    parser.add_argument(
        "--torch",
        action="append",
        dest="pythons",
        metavar="PYTHON",
        help="a Python interpreter whose torch gets a variant (repeat for several; default: this one). "
        "The first one's CUDA wheel headers serve the csrc units.",
    )
    parser.add_argument("-j", "--jobs", type=int, default=2, help="parallel compilations (a CUTLASS unit needs ~5 GB)")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build", help="where the variants go (default build/)")
    return parser.parse_args()


def cuda_home() -> Path:
    return Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")


def read_torch_env(python: str) -> TorchEnv:
    env = dict(os.environ, CUDA_HOME=str(cuda_home()))
    result = subprocess.run([python, "-c", TORCH_QUERY], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"{python} could not import torch:\n{result.stderr}")
    info = json.loads(result.stdout.strip().splitlines()[-1])
    if info["cuda"] is None:
        sys.exit(f"{python}: torch {info['version']} is a CPU build; the variants need a CUDA build of torch")
    if not info["cxx11_abi"]:
        sys.exit(f"{python}: torch {info['version']} uses the pre-C++11 ABI; kernel-builder builds cxx11 only")
    gpu = tuple(info["gpu"]) if info["gpu"] else None
    return TorchEnv(
        python=python,
        version=info["version"],
        cuda=info["cuda"],
        cxx11_abi=True,
        machine=info["machine"],
        includes=tuple(info["includes"]),
        library_dir=info["library_dir"],
        python_include=info["python_include"],
        cuda_wheel_include=info["cuda_wheel_include"],
        gpu=gpu,
    )


def build_toml_capabilities(config: dict) -> list[str]:
    caps = {c for kernel in config.get("kernel", {}).values() for c in kernel["cuda-capabilities"]}
    return sorted(caps, key=capability_key)


def default_archs(config: dict, gpu: tuple[int, int] | None) -> tuple[set[str] | None, str]:
    """What to build without --archs, and why: the capabilities of build.toml that run on this GPU
    (one arch compiles in a fraction of the time), else every arch (None)."""
    if gpu is None:
        return None, "no GPU visible to torch: every arch in build.toml"
    matching = [c for c in build_toml_capabilities(config) if runs_on(c, gpu)]
    if not matching:
        return None, f"this GPU's capability {gpu[0]}.{gpu[1]} is not in build.toml: every arch"
    return set(matching), f"this machine's GPU (capability {gpu[0]}.{gpu[1]}): {', '.join(matching)} only"


def wanted_archs(archs: str | None, config: dict, gpu: tuple[int, int] | None = None) -> tuple[set[str] | None, str]:
    """The --archs selection (None = every arch in build.toml) and a line saying how it was chosen."""
    if archs is None:
        wanted, why = default_archs(config, gpu)
        return wanted, f"{why} (--archs all builds every arch)"
    if archs.strip() == "all":
        return None, "--archs all: every arch in build.toml"
    return set(re.split(r"[,\s]+", archs.strip())), f"--archs {archs}"


def nvcc_path() -> Path:
    return cuda_home() / "bin" / "nvcc"


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
    """Content hash of everything that goes into a variant, so two builds never share a namespace."""
    digest = hashlib.sha256((ROOT / "build.toml").read_bytes())
    files = [ROOT / p for p in config["torch"]["src"]]
    for kernel in config.get("kernel", {}).values():
        files += [ROOT / p for p in kernel["src"]]
    files += sorted((ROOT / "torch-ext" / PACKAGE).glob("*.py"))
    for path in sorted(set(files)):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def ops_name(config: dict) -> str:
    """kernel-builder's `_<python name>_<backend>_<unique id>` (its id is a git revision, ours a content hash)."""
    return f"_{PACKAGE}_{BACKEND}_{unique_id(config)}"


def capability_key(capability: str) -> tuple[int, int]:
    major, minor = capability.rstrip("af").split(".")
    return int(major), int(minor)


def runs_on(capability: str, gpu: tuple[int, int]) -> bool:
    """Whether code built for `capability` runs on a GPU of capability `gpu`: an `a` target on that
    exact capability, an `f` (family) target on the same major with a minor as large or larger."""
    major, minor = capability_key(capability)
    if capability.endswith("f"):
        return gpu[0] == major and gpu[1] >= minor
    return gpu == (major, minor)


def gencode(capability: str) -> str:
    digits = capability.replace(".", "")
    return f"-gencode=arch=compute_{digits},code=sm_{digits}"


def cutlass_includes() -> list[str]:
    """CUTLASS's headers: CUTLASS_INCLUDE_DIR (a checkout's include/, e.g. kernel-builder's cutlass_4_4),
    else those of the PyPI package nvidia-cutlass."""
    override = os.environ.get("CUTLASS_INCLUDE_DIR")
    if override:
        root = Path(override).resolve()
        return [str(root), str(root.parent / "tools" / "util" / "include")]
    import cutlass_library

    source = Path(cutlass_library.__file__).parent / "source"
    return [str(source / "include"), str(source / "tools" / "util" / "include")]


def cuda_includes(env: TorchEnv) -> list[str]:
    """The toolkit's headers, plus the CUDA libraries' headers of torch's nvidia-* wheels (cublasLt.h)."""
    includes = [str(cuda_home() / "include")]
    if env.cuda_wheel_include:
        includes.append(env.cuda_wheel_include)
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


def cudart_ldflags() -> list[str]:
    """Link flags for the toolkit's CUDA runtime: lib64/libcudart.so of a system toolkit, or the
    versioned lib/libcudart.so.<major> that the PyPI nvidia-cuda-runtime wheel ships."""
    home = cuda_home()
    for lib in (home / "lib64", home / "lib"):
        if (lib / "libcudart.so").exists():
            return [f"-L{lib}", "-lcudart"]
        versioned = sorted(lib.glob("libcudart.so.[0-9]*"))
        if versioned:
            return [f"-L{lib}", f"-l:{versioned[0].name}"]
    sys.exit(f"no libcudart under {home}/lib64 or {home}/lib (set CUDA_HOME to a CUDA toolkit)")


def ninja_escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def shell_flags(items: list[str]) -> str:
    return " ".join(shlex.quote(item) for item in items)


def include_flags(paths: list[str]) -> list[str]:
    return [f"-I{p}" for p in paths]


NINJA_RULES = """\
ninja_required_version = 1.3
cxx = {cxx}
nvcc = {nvcc}
rule cxx
  command = $cxx -MMD -MF $out.d $flags -fPIC -c $in -o $out
  depfile = $out.d
  deps = gcc
  description = CXX $in
rule nvcc
  command = $nvcc -MD -MF $out.d $flags -Xcompiler -fPIC -c $in -o $out
  depfile = $out.d
  deps = gcc
  description = NVCC $in
rule link
  command = $cxx -shared $in -o $out $ldflags
  description = LINK $out
"""


class NinjaFile:
    """The build graph: compile units and links, written as one build.ninja."""

    def __init__(self, work: Path) -> None:
        self.work = work
        cxx = shlex.quote(os.environ.get("CXX", "c++"))
        self.lines = [NINJA_RULES.format(cxx=cxx, nvcc=shlex.quote(str(nvcc_path())))]

    def compile(self, source: str, folder: str, flags: list[str]) -> str:
        obj = self.work / "obj" / folder / (source + ".o")
        rule = "nvcc" if source.endswith(".cu") else "cxx"
        self.lines.append(f"build {ninja_escape(str(obj))}: {rule} {ninja_escape(str(ROOT / source))}")
        self.lines.append(f"  flags = {shell_flags(flags)}")
        return str(obj)

    def link(self, library: Path, objects: list[str], ldflags: list[str]) -> None:
        self.lines.append(f"build {ninja_escape(str(library))}: link {' '.join(ninja_escape(o) for o in objects)}")
        self.lines.append(f"  ldflags = {shell_flags(ldflags)}")

    def write(self) -> None:
        (self.work / "build.ninja").write_text("\n".join(self.lines) + "\n")


def csrc_objects(ninja: NinjaFile, sections: list[Section], env: TorchEnv) -> list[str]:
    """Every kernel section's units, compiled once for all variants."""
    base = [f"-std={CSRC_STANDARD}", "-O3", "-DNDEBUG", "-D_GLIBCXX_USE_CXX11_ABI=1"]
    includes = [str(ROOT), *cuda_includes(env)]
    objects = []
    for section in sections:
        section_includes = includes + [str(ROOT / i) for i in section.includes]
        if section.uses_cutlass:
            section_includes += cutlass_includes()
        for source in section.sources:
            if source.endswith(".cu"):
                host = [flag for host_flag in HOST_FLAGS for flag in ("-Xcompiler", host_flag)]
                arch = [gencode(c) for c in section.capabilities]
                flags = [*base, "--expt-relaxed-constexpr", *host, *arch, *section.cuda_flags]
            else:
                flags = [*base, *HOST_FLAGS]
            objects.append(ninja.compile(source, section.name, flags + include_flags(section_includes)))
    return objects


def binding_objects(ninja: NinjaFile, torch_sources: list[str], env: TorchEnv, ops: str) -> list[str]:
    """The torch binding of one variant, compiled against that torch's headers."""
    flags = [f"-std={env.cxx_standard}", "-O3", "-DNDEBUG", "-D_GLIBCXX_USE_CXX11_ABI=1", *HOST_FLAGS]
    flags += [f"-DTORCH_EXTENSION_NAME={ops}", f"-DPy_LIMITED_API={PY_LIMITED_API}"]
    includes = [str(ROOT), str(ninja.work / "gen"), *cuda_includes(env)]
    includes += [p for p in env.includes if p not in includes] + [env.python_include]
    return [ninja.compile(source, env.tag, flags + include_flags(includes)) for source in torch_sources]


def torch_ldflags(env: TorchEnv) -> list[str]:
    return [f"-L{env.library_dir}", "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", *cudart_ldflags()]


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
        name = os.path.relpath(output, work / "obj") if "/obj/" in output else os.path.relpath(output, work)
        print(f"  {(int(end) - int(start)) / 1000:7.1f} s  {name}")


def hash_variant(variant: Path) -> dict[str, str]:
    """kernel-builder's digest (kernels-common digest.rs): per file, SHA-256 as padded standard base64,
    keyed by the POSIX path relative to the variant; the top-level metadata.json(.sigstore),
    __pycache__ and *.pyc are left out."""
    files = {}
    for path in sorted(p for p in variant.rglob("*") if p.is_file()):
        relative = path.relative_to(variant)
        if len(relative.parts) == 1 and relative.name in ("metadata.json", "metadata.json.sigstore"):
            continue
        if "__pycache__" in relative.parts or path.suffix == ".pyc":
            continue
        files[relative.as_posix()] = base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()
    return dict(sorted(files.items()))


def git_provenance() -> dict | None:
    """The kernel source's git state, as kernel-builder records it (None outside a git checkout)."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return None
    dirty = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    return {"commit": head.stdout.strip(), "dirty": dirty}


def metadata(config: dict, ops: str, archs: list[str]) -> dict:
    """metadata.json as kernel-builder 0.19 writes it, before the digest is added."""
    general = config["general"]
    provenance: dict = {"kernel-builder": {"version": f"{LAYOUT_VERSION} (fp4-gemm tools/build.py, no Nix)"}}
    kernel = git_provenance()
    if kernel is not None:
        provenance["kernel"] = kernel
    return {
        "name": general["name"],
        "id": ops,
        "version": general["version"],
        "build-layout": general.get("build-layout", "files"),
        "kernels-minver": KERNELS_MINVER,
        "license": general["license"],
        "python-depends": list(general.get("python-depends", [])),
        "kernel-depends": [],
        # kernel-builder's add_build_metadata.py: sorted(set(archs)), a string sort
        "backend": {"type": BACKEND, "archs": sorted(set(archs))},
        "provenance": provenance,
    }


def write_variant(variant: Path, library: Path, meta: dict) -> None:
    if variant.exists():
        shutil.rmtree(variant)
    variant.mkdir(parents=True)
    for source in sorted((ROOT / "torch-ext" / PACKAGE).glob("*.py")):
        shutil.copy2(source, variant / source.name)
    (variant / "_ops.py").write_text(OPS_PY.format(ops_name=meta["id"]))
    shutil.copy2(library, variant / library.name)
    meta = dict(meta, digest={"algorithm": "sha256", "files": hash_variant(variant)})
    (variant / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def main() -> None:
    args = parse_args()
    config = tomllib.loads((ROOT / "build.toml").read_text())
    envs = [read_torch_env(python) for python in args.pythons or [sys.executable]]
    variants = [env.variant for env in envs]
    if len(set(variants)) != len(variants):
        sys.exit(f"two interpreters give the same variant: {variants}")
    wanted, why = wanted_archs(args.archs, config, envs[0].gpu)
    print(f"archs: {why}")
    cuda = nvcc_version()
    sections = load_sections(config, wanted, cuda)
    if not sections:
        sys.exit(f"no kernel section of build.toml matches --archs {args.archs}")
    archs = sorted({c for section in sections for c in section.capabilities}, key=capability_key)
    ops = ops_name(config)
    print(f"building {ops} for {', '.join(archs)} with nvcc {cuda[0]}.{cuda[1]}")
    for section in sections:
        print(f"  [kernel.{section.name}] {' '.join(section.capabilities)}: {len(section.sources)} unit(s)")
    for env in envs:
        note = "" if env.cuda == f"{cuda[0]}.{cuda[1]}" else f" (nvcc is {cuda[0]}.{cuda[1]})"
        print(f"  {env.variant}: torch {env.version}, binding as {env.cxx_standard}{note}")
        if int(env.cuda.split(".")[0]) != cuda[0]:
            sys.exit(f"torch {env.version} is built for CUDA {env.cuda}; nvcc {cuda[0]}.{cuda[1]} is another major")

    build = args.build_dir.resolve()
    work = build / "_work"
    (work / "gen").mkdir(parents=True, exist_ok=True)
    (work / "gen" / "registration.h").write_text(REGISTRATION_H)
    ninja = NinjaFile(work)
    shared = csrc_objects(ninja, sections, envs[0])
    torch_sources = [s for s in config["torch"]["src"] if s.endswith(SOURCE_SUFFIXES)]
    libraries = {}
    for env in envs:
        library = work / "lib" / env.variant / f"{ops}.abi3.so"
        for stale in library.parent.glob(f"_{PACKAGE}_*.abi3.so"):
            if stale != library:
                stale.unlink()
        ninja.link(library, binding_objects(ninja, torch_sources, env, ops) + shared, torch_ldflags(env))
        libraries[env.variant] = library
    ninja.write()

    started = time.time()
    run_ninja(work, args.jobs)
    elapsed = time.time() - started

    meta = metadata(config, ops, archs)
    for variant, library in libraries.items():
        write_variant(build / variant, library, meta)
        print(f"-> {build / variant}")
    print(f"build time {elapsed:.1f} s")


if __name__ == "__main__":
    main()
