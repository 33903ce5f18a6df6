#!/usr/bin/env bash
# Refresh the pinned Chart.js bundle, its date adapter and Swagger UI (the API docs page) from the npm registry.
# Operators' browsers are often offline, so these files are committed and served by Django, never from a CDN.
# Usage: static/vendor/refresh.sh   (needs npm; bump the versions below on purpose, then commit the result)
set -euo pipefail
CHARTJS_VERSION=4.6.1
ADAPTER_VERSION=3.0.0
SWAGGER_UI_VERSION=5.35.0
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "chart.js@$CHARTJS_VERSION" "chartjs-adapter-date-fns@$ADAPTER_VERSION" \
  "swagger-ui-dist@$SWAGGER_UI_VERSION" >/dev/null
tar -xzf "chart.js-$CHARTJS_VERSION.tgz" && mv package chartjs
tar -xzf "chartjs-adapter-date-fns-$ADAPTER_VERSION.tgz" && mv package adapter
tar -xzf "swagger-ui-dist-$SWAGGER_UI_VERSION.tgz" && mv package swagger
# Without its source map (not vendored): collectstatic's hashed-name storage fails on a reference to a missing file.
sed '/^\/\/# sourceMappingURL=/d' chartjs/dist/chart.umd.min.js > "$here/chart.umd.min.js"
cp adapter/dist/chartjs-adapter-date-fns.bundle.min.js "$here/chartjs-adapter-date-fns.bundle.min.js"
cp chartjs/LICENSE.md "$here/LICENSE-chart.js.md"
cp adapter/LICENSE.md "$here/LICENSE-chartjs-adapter-date-fns.md"
mkdir -p "$here/swagger-ui"
sed '/^\/\/# sourceMappingURL=/d' swagger/swagger-ui-bundle.js > "$here/swagger-ui/swagger-ui-bundle.js"
sed '/^\/\*# sourceMappingURL=/d' swagger/swagger-ui.css > "$here/swagger-ui/swagger-ui.css"
cp swagger/LICENSE "$here/swagger-ui/LICENSE"
cp swagger/NOTICE "$here/swagger-ui/NOTICE"
printf 'chart.js %s\nchartjs-adapter-date-fns %s\nswagger-ui-dist %s\n' "$CHARTJS_VERSION" "$ADAPTER_VERSION" \
  "$SWAGGER_UI_VERSION" > "$here/VERSIONS"
echo "refreshed: chart.js $CHARTJS_VERSION, chartjs-adapter-date-fns $ADAPTER_VERSION, swagger-ui-dist $SWAGGER_UI_VERSION"
