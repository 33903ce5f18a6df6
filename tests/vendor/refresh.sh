#!/usr/bin/env bash
# Refresh the pinned axe-core (the accessibility audit the browser tests inject into every page) from npm.
# Test-only: it is never served by the dashboard. Usage: tests/vendor/refresh.sh (needs npm); commit the result.
set -euo pipefail
AXE_VERSION=4.14.1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "axe-core@$AXE_VERSION" >/dev/null
tar -xzf "axe-core-$AXE_VERSION.tgz"
cp package/axe.min.js "$here/axe.min.js"
cp package/LICENSE "$here/LICENSE-axe-core.txt"
printf 'axe-core %s\n' "$AXE_VERSION" > "$here/VERSIONS"
echo "refreshed: axe-core $AXE_VERSION"
