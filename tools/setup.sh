#!/usr/bin/env bash
# Make the virtual environments and build the variants:
#   .venv                requirements.txt (torch 2.14.1, the release matrix's newest torch)
#   .venv-torch<MM>      one more per `--torch VERSION` (e.g. --torch 2.13.0 -> .venv-torch213): that
#                        torch's CUDA build from PyPI plus the rest of requirements.txt
# then `tools/build.py --torch <each venv's python> <the other arguments>`: one variant per torch, the
# csrc objects shared. Safe to re-run: installs and builds are incremental.
#   tools/setup.sh                                 # .venv and its variant (this GPU's arch, else every arch)
#   tools/setup.sh --torch 2.13.0 --archs all      # both release torches, every arch (what CI builds)
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { "$1/bin/python" -m pip install --quiet --disable-pip-version-check "${@:2}"; }

pythons=(--torch .venv/bin/python)
build_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch)
      version="$2"; shift 2
      venv=".venv-torch$(echo "$version" | cut -d. -f1-2 | tr -d .)"
      [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
      # --isolated: pip's user configuration may point at a local CPU build of torch (find-links)
      pip_install "$venv" --isolated "torch==$version"
      pip_install "$venv" -r <(grep -v '^torch==' requirements.txt)
      pythons+=(--torch "$venv/bin/python");;
    *) build_args+=("$1"); shift;;
  esac
done
[ -x .venv/bin/python ] || python3 -m venv .venv
pip_install .venv -r requirements.txt
.venv/bin/python tools/build.py "${pythons[@]}" "${build_args[@]}"
