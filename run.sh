#!/usr/bin/env bash
# Set everything up and run layercake: Redis (embedded unless REDIS_URL), the ASGI server, a Celery
# worker and beat, and a demo fleet of simulated agents. Prints the admin login and the dashboard URL.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh requirements.txt
exec .venv/bin/python manage.py runstack "$@"
