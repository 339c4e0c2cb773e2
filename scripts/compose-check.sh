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
bash scripts/setup.sh
# Podman + runc (crun refuses this machine's hybrid cgroups), debootstrap for the base image, and
# Compose 1.29 for the Docker-compatible API (docs/operations.md says why not podman-compose).
missing=()
for tool in podman runc debootstrap docker-compose; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap docker-compose >/dev/null
fi
exec .venv/bin/python -m deploy.compose_check "$@"
