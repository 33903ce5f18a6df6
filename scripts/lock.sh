#!/usr/bin/env bash
# Regenerates the hashed lock files from the .in ranges (uv pip compile, Python 3.11 and newer, any platform).
# Usage: scripts/lock.sh [--upgrade | --upgrade-package NAME ...]   then review the diff and run ./test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=.venv/bin/uv
[ -x "$uv" ] || uv=uv
compile() {  # in-file out-file [uv options]
  local in=$1 out=$2; shift 2
  "$uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes --no-header \
    --custom-compile-command scripts/lock.sh "$@" "$in" -o "$out"
}
compile agents/requirements.in agents/requirements.txt "$@"
compile requirements.in requirements.txt "$@"
compile requirements-dev.in requirements-dev.txt "$@"
compile requirements-inference.in requirements-inference.txt "$@"
