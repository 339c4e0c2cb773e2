#!/usr/bin/env bash
# Set everything up and run the whole test suite against a real OpenSearch node and a real Redis
# (both started by the pytest session fixture on free ports, torn down afterwards), then lint and
# type-check. Extra arguments go to pytest.
#
# The whole suite (no arguments, as CI runs it) ends with the compose deployment run for real
# (scripts/compose-check.sh: images, up, health, a key, the load profile through the TLS proxy with
# nothing lost, a restart on the volumes, tear-down) in its short form: a small fleet for 30 s.
# Figures and the time it adds: docs/operations.md "Compose, run for real".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check service workers evals tests deploy benchmarks clients
.venv/bin/mypy
.venv/bin/lint-imports  # the layering contracts ([tool.importlinter] in pyproject.toml)
.venv/bin/python -m pytest "$@"
if [ $# -eq 0 ]; then
  bash scripts/compose-check.sh --load-seconds 30 --tenants 2 --users-per-tenant 2 --concurrency 8 --seed-beliefs 5
fi
