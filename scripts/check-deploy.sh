#!/usr/bin/env bash
# Django's deployment checks on the production profile as deploy/server.env.example configures it, with a
# fresh SECRET_KEY (the example has none); any warning fails. CI runs this; so does tests/test_production_settings.py.
# Usage: scripts/check-deploy.sh   (PYTHON=/path/to/python to use another interpreter than .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
set -a
. deploy/server.env.example
SECRET_KEY=$("$python" -c 'import secrets; print(secrets.token_urlsafe(50))')
set +a
exec "$python" manage.py check --deploy --fail-level WARNING
