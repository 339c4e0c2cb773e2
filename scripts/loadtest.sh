#!/usr/bin/env bash
# Set everything up, then run the load test against a whole local topology it starts itself
# (OpenSearch, Redis with AOF, the scripted upstream LLM, the API, a Celery worker and beat; see
# deploy/localstack.py), verify every acknowledged write, and print the results:
#   scripts/loadtest.sh --duration 120 --concurrency 32 --api-workers 2 --out results.json
# Any `python -m loadtest` option can be given (see loadtest/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m loadtest --local "$@"
