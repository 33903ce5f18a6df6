#!/usr/bin/env bash
# Set everything up and run the whole test suite (pytest arguments pass through, e.g. ./test.sh -m "not slow").
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh requirements-dev.txt
# The real llama.cpp engine (compiled once, needs a C++ compiler) and a 98 MB GGUF for the inference tests;
# without them those tests are skipped with the reason, the rest still run.
scripts/install-inference.sh || echo "warning: could not install the llama.cpp engine; its tests will be skipped" >&2
# Debian packages the tests drive (as root only; without them those tests are skipped with the reason).
install_debian() {  # command package what-for [apt options]
  if ! command -v "$1" >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's $2 for $3…"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${@:4}" "$2" >/dev/null) \
      || echo "warning: could not install $2; $3 will be skipped" >&2
  fi
}
install_debian chromium chromium "the browser tests"
install_debian prometheus prometheus "the Prometheus tests" --no-install-recommends
install_debian nginx nginx-light "the nginx configuration tests" --no-install-recommends
exec .venv/bin/python -m pytest "$@"
