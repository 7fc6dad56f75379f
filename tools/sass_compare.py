#!/usr/bin/env python3
"""Compare the machine code of two builds, function by function:

    python tools/sass_compare.py OLD NEW [--arch sm_90a ...] [--expect-identical]

OLD and NEW are build directories (tools/build.py --build-dir, holding one variant directory) or the
variants' shared libraries. For every arch both hold (or those named), each kernel's SASS
instructions are hashed and the functions listed as identical, different, missing from NEW or new
in NEW. A refactor that must not change code generation is proven this way on the CPU; a change
that does is measured on the GPU by name (docs/PERFORMANCE.md). With --expect-identical the exit
status is 1 when any function differs, is missing or is new.

cuobjdump and nvdisasm come from PATH or the nvidia-cuda-* wheels of requirements.txt, found as
tests/machine_code.py finds them: kernel-builder's ci-test copies tests/ without tools/, and this
tool runs without pytest, so neither imports the other.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", re.MULTILINE)
# A kernel in an anonymous namespace carries hashes of its translation unit and of the path it was
# compiled from, which change from build to build and checkout to checkout: named by its source file
# instead. After the file name come 8 hex digits, then either the next name's length or an
# underscore and a counter that differs between builds and runs into that length: taken whole.
ANONYMOUS = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_(\w+?)_cu_[0-9a-f]{8}(?:_\d+)?")


def cuda_binary_tool(name: str) -> str:
    """`name` on PATH, else in the nvidia-cuda-* wheels (the namespace package nvidia, cu13/bin)."""
    try:
        import nvidia

        wheel_dirs = [str(Path(root) / "cu13" / "bin") for root in nvidia.__path__]
    except ImportError:
        wheel_dirs = []
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(wheel_dirs))
    if found is None:
        raise SystemExit(f"{name} not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    return found


def shared_library(path: Path) -> Path:
    if path.is_file():
        return path
    libraries = sorted(path.glob("*/_fp4_gemm_*.so")) or sorted(path.glob("_fp4_gemm_*.so"))
    if len(libraries) != 1:
        raise SystemExit(f"{path}: expected one variant library, found {[str(p) for p in libraries]}")
    return libraries[0]


def cubin_archs(library: Path, cuobjdump: str) -> set[str]:
    listing = subprocess.run([cuobjdump, "--list-elf", str(library)], capture_output=True, text=True, check=True)
    return set(re.findall(r"\.(sm_\d+[af]?)\.cubin", listing.stdout))


def kernel_hashes(library: Path, arch: str, cuobjdump: str, env: dict[str, str]) -> dict[str, str]:
    """Mangled kernel name -> hash of its instructions (opcode and operands, no addresses)."""
    command = [cuobjdump, "--dump-sass", "--gpu-architecture", arch, str(library)]
    sass = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    hashes = {}
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name, _, body = chunk.partition("\n")
        code = "\n".join(INSTRUCTION.findall(body))
        key = ANONYMOUS.sub(r"(anonymous namespace of \1.cu)", name.strip())
        hashes[key] = hashlib.sha256(code.encode()).hexdigest()
    return hashes


def compare(old: dict[str, str], new: dict[str, str]) -> dict[str, list[str]]:
    return {
        "identical": sorted(k for k in old.keys() & new.keys() if old[k] == new[k]),
        "differ": sorted(k for k in old.keys() & new.keys() if old[k] != new[k]),
        "missing": sorted(old.keys() - new.keys()),
        "new": sorted(new.keys() - old.keys()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--arch", nargs="+", help="cubin archs, e.g. sm_90a sm_100f (default: all both hold)")
    parser.add_argument("--expect-identical", action="store_true", help="exit 1 unless every function is identical")
    args = parser.parse_args()
    cuobjdump, nvdisasm = cuda_binary_tool("cuobjdump"), cuda_binary_tool("nvdisasm")
    path = os.pathsep.join([str(Path(nvdisasm).parent), os.environ["PATH"]])
    env = dict(os.environ, NVDISASM_PATH=nvdisasm, PATH=path)
    old, new = shared_library(args.old), shared_library(args.new)
    archs = args.arch or sorted(cubin_archs(old, cuobjdump) & cubin_archs(new, cuobjdump))
    changed = False
    for arch in archs:
        result = compare(kernel_hashes(old, arch, cuobjdump, env), kernel_hashes(new, arch, cuobjdump, env))
        counts = ", ".join(f"{len(names)} {kind}" for kind, names in result.items())
        print(f"{arch}: {counts}")
        for kind in ("differ", "missing", "new"):
            for name in result[kind]:
                print(f"  {kind}: {name}")
        changed |= any(result[kind] for kind in ("differ", "missing", "new"))
    return 1 if args.expect_identical and changed else 0


if __name__ == "__main__":
    sys.exit(main())
