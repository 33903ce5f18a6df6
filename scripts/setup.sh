#!/usr/bin/env bash
# Shared by run.sh and test.sh: a virtualenv in .venv with the project's locked requirements.
# Usage: scripts/setup.sh [lock file]   (idempotent; reinstalls only when the locks changed)
# Installs only from hashed locks (requirements.txt: server, requirements-dev.txt: tests and tools), so every
# install gets exactly the versions the tests ran against. VENV=path puts the virtualenv elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=${1:-requirements.txt}
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "error: layercake needs Python 3.11 or newer as '$python' (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
venv=${VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" || { echo "error: '$python -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2; exit 1; }
fi
stamp=$venv/.installed-$(cat "$requirements" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --require-hashes -r "$requirements"
  "$venv/bin/python" -m pip check >/dev/null || { "$venv/bin/python" -m pip check >&2; exit 1; }
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
mkdir -p var/static var/log
