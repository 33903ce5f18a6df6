#!/usr/bin/env bash
# Refresh the pinned Chart.js bundle and its date adapter from the npm registry.
# Operators' browsers are often offline, so these files are committed and served by Django, never from a CDN.
# Usage: static/vendor/refresh.sh   (needs npm; bump the versions below on purpose, then commit the result)
set -euo pipefail
CHARTJS_VERSION=4.6.1
ADAPTER_VERSION=3.0.0
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "chart.js@$CHARTJS_VERSION" "chartjs-adapter-date-fns@$ADAPTER_VERSION" >/dev/null
tar -xzf "chart.js-$CHARTJS_VERSION.tgz" && mv package chartjs
tar -xzf "chartjs-adapter-date-fns-$ADAPTER_VERSION.tgz" && mv package adapter
# Without its source map (not vendored): collectstatic's hashed-name storage fails on a reference to a missing file.
sed '/^\/\/# sourceMappingURL=/d' chartjs/dist/chart.umd.min.js > "$here/chart.umd.min.js"
cp adapter/dist/chartjs-adapter-date-fns.bundle.min.js "$here/chartjs-adapter-date-fns.bundle.min.js"
cp chartjs/LICENSE.md "$here/LICENSE-chart.js.md"
cp adapter/LICENSE.md "$here/LICENSE-chartjs-adapter-date-fns.md"
printf 'chart.js %s\nchartjs-adapter-date-fns %s\n' "$CHARTJS_VERSION" "$ADAPTER_VERSION" > "$here/VERSIONS"
echo "refreshed: chart.js $CHARTJS_VERSION, chartjs-adapter-date-fns $ADAPTER_VERSION"
