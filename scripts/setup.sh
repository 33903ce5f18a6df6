#!/usr/bin/env bash
# Shared by run.sh and test.sh: a virtualenv in .venv with the project's requirements, and the database migrated.
# Usage: scripts/setup.sh [requirements file]   (idempotent; reinstalls only when the requirements changed)
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=${1:-requirements.txt}
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "error: layercake needs Python 3.11 or newer as '$python' (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv || { echo "error: '$python -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2; exit 1; }
fi
stamp=.venv/.installed-$(cat requirements*.txt agents/requirements.txt "$requirements" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r "$requirements"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
mkdir -p var/static var/log
