#!/usr/bin/env bash
# Set everything up and run the whole test suite against a real OpenSearch node and a real Redis
# (both started by the pytest session fixture on free ports, torn down afterwards), then lint and
# type-check. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check service workers evals tests deploy benchmarks clients
.venv/bin/mypy
.venv/bin/lint-imports  # the layering contracts ([tool.importlinter] in pyproject.toml)
.venv/bin/python -m pytest "$@"
