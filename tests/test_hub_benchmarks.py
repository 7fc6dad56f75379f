"""The benchmarks as the Hub holds them: kernel-builder uploads benchmarks/benchmark*.py and nothing else
of benchmarks/, and `kernels benchmark <repo>` loads each of those files on its own and runs its
Benchmark subclasses' setup_/benchmark_/verify_ workloads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import requires_arch, requires_repo_file, variant_dir

BENCHMARKS = requires_repo_file("benchmarks")
UPLOADED = sorted(BENCHMARKS.glob("benchmark*.py"))


def hub_repo(tmp_path: Path) -> Path:
    """A directory laid out like the Hub repo: the variant at the top, benchmarks/benchmark*.py only."""
    (tmp_path / "benchmarks").mkdir(parents=True)
    for script in UPLOADED:
        shutil.copy2(script, tmp_path / "benchmarks" / script.name)
    (tmp_path / variant_dir().name).symlink_to(variant_dir(), target_is_directory=True)
    return tmp_path


# What `kernels benchmark` does with each file: import it alone (the Hub holds no other file of
# benchmarks/), then run the Benchmark subclasses it defines. Public API only: kernels.benchmark.Benchmark.
DISCOVER = """\
import importlib.util, inspect, sys
from pathlib import Path
from kernels.benchmark import Benchmark
script = Path(sys.argv[1])
spec = importlib.util.spec_from_file_location(script.stem, script)
module = importlib.util.module_from_spec(spec)
sys.modules[script.stem] = module
spec.loader.exec_module(module)
for cls in vars(module).values():
    if inspect.isclass(cls) and issubclass(cls, Benchmark) and cls is not Benchmark and cls.__module__ == script.stem:
        for workload in [n[len("benchmark_"):] for n in dir(cls) if n.startswith("benchmark_")]:
            print(f"{cls.__name__}.{workload}", hasattr(cls, "verify_" + workload))
"""


def uploaded_workloads(script: Path) -> dict[str, bool]:
    """Class.workload -> whether it has a verify_ step, as a fresh interpreter sees the file alone."""
    result = subprocess.run(
        [sys.executable, "-c", DISCOVER, str(script)], capture_output=True, text=True, cwd=script.parent, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {name: verified == "True" for name, verified in (line.split() for line in result.stdout.splitlines())}


def kernels_cli() -> str:
    """The `kernels` command of the installed client (a client installed with pip --no-deps, as on the
    device machine, has none)."""
    found = shutil.which("kernels") or str(Path(sys.executable).with_name("kernels"))
    if not Path(found).is_file():
        pytest.skip("the kernels command is not installed (pip install kernels puts it beside python)")
    return found


def test_uploaded_benchmarks_exist():
    assert [p.name for p in UPLOADED] == ["benchmark.py", "benchmark_quantize.py"]


@pytest.mark.parametrize("script", [p.name for p in UPLOADED])
def test_uploaded_benchmark_loads_alone_with_verified_workloads(tmp_path, script):
    """Each file imported on its own, in a fresh interpreter that sees no other file of benchmarks/."""
    workloads = uploaded_workloads(hub_repo(tmp_path) / "benchmarks" / script)
    assert workloads, f"{script}: no Benchmark workload"
    assert all(workloads.values()), f"{script}: unverified {[w for w, ok in workloads.items() if not ok]}"


@requires_arch()  # kernels benchmark runs on the GPU (its device is torch's CUDA backend)
def test_kernels_benchmark_runs_and_verifies_every_uploaded_workload(tmp_path):
    pytest.importorskip("tabulate", reason="kernels benchmark needs tabulate (requirements.txt)")
    repo = hub_repo(tmp_path / "repo")
    expected = {w for script in sorted((repo / "benchmarks").glob("benchmark*.py")) for w in uploaded_workloads(script)}
    output = tmp_path / "result.json"
    command = [kernels_cli(), "benchmark", str(repo), "--iterations", "3", "--warmup", "1", "--output", str(output)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    workloads = {entry["workload"]: entry.get("verified") for entry in json.loads(output.read_text())["results"]}
    assert set(workloads) == expected and all(workloads.values()), workloads
