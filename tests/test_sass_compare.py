"""tools/sass_compare.py, which proves a refactor left every kernel's machine code as it was."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT, variant_metadata
from machine_code import all_kernels, cubin_arch, disassembly_env, library

pytestmark = pytest.mark.machine_code


def test_a_build_compared_with_itself_is_identical_in_every_kernel():
    cc = int(variant_metadata()["backend"]["archs"][0].rstrip("af").replace(".", ""))  # "9.0a" -> 90
    arch = cubin_arch(cc)
    command = [sys.executable, str(ROOT / "tools" / "sass_compare.py"), str(library()), str(library()),
               "--arch", arch, "--expect-identical"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=disassembly_env())
    assert result.returncode == 0, result.stderr
    counts = re.search(rf"^{arch}: (\d+) identical, 0 differ, 0 missing, 0 new$", result.stdout, re.MULTILINE)
    assert counts is not None, result.stdout
    assert int(counts.group(1)) == len(all_kernels(cc))
