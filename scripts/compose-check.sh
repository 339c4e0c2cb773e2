#!/usr/bin/env bash
# Run docker-compose.yml for real through Podman and check it (deploy/compose_check.py): build the
# images (cached by a hash of their inputs), `up`, wait for health, bootstrap a key, run the `load`
# profile for a bounded time and verify that no acknowledged write was lost, `down` + `up` and check
# the data survived on its volumes, then tear everything down. CI runs it from scripts/test.sh.
#   scripts/compose-check.sh                         # 45 s of load
#   scripts/compose-check.sh --load-seconds 120 --out compose-check.json
# Figures: docs/operations.md "Compose, run for real".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh  # also installs Podman, runc, debootstrap and docker-compose (apt)
exec .venv/bin/python -m deploy.compose_check "$@"
