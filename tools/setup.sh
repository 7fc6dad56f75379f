#!/usr/bin/env bash
# Create .venv, install requirements.txt from PyPI, and build the variant (arguments go to
# tools/build.py, e.g. --archs 9.0a). Safe to re-run: installs and builds are incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
.venv/bin/python tools/build.py "$@"
