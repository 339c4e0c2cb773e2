#!/usr/bin/env bash
# Set everything up, then run the fault drills (docs/fault-drills.md): each one starts a whole
# local topology of its own (OpenSearch, Redis with AOF, the scripted upstream, the API, a Celery
# worker and beat; see deploy/localstack.py), kills one component under load, restarts it,
# verifies every acknowledged write and turn, and merges its results into the JSON file:
#   scripts/drills.sh all                       # ~3 min a drill on a 2-core box
#   scripts/drills.sh redis --outage 20
# Exit status 1 when a drill failed its criteria.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
drill=${1:-all}
shift || true
exec .venv/bin/python -m loadtest.drills "$drill" --out docs/fault-drills/results.json "$@"
