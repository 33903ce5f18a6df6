#!/usr/bin/env bash
# Set everything up and run the whole test suite (pytest arguments pass through, e.g. ./test.sh -m "not slow").
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh requirements-dev.txt
# The real llama.cpp engine (compiled once, needs a C++ compiler) and a 98 MB GGUF for the inference tests;
# without them those tests are skipped with the reason, the rest still run.
scripts/install-inference.sh || echo "warning: could not install the llama.cpp engine; its tests will be skipped" >&2
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's chromium for the browser tests…"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi
if ! command -v prometheus >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's prometheus for the /metrics tests…"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
    || echo "warning: could not install prometheus; the Prometheus tests will be skipped" >&2
fi
exec .venv/bin/python -m pytest "$@"
