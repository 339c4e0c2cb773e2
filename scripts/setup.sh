#!/usr/bin/env bash
# Install everything this project needs on a fresh machine of its kind (Debian, Python 3.11,
# OpenJDK 17, Maven): redis-server from apt, the Python virtualenv, the OpenSearch node jars from
# Maven Central. Idempotent and quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing redis-server (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  # the package starts a system service on :6379; our stack runs its own servers
  (systemctl disable --now redis-server >/dev/null 2>&1 || service redis-server stop >/dev/null 2>&1 || true)
fi

# The console's browser tests drive Debian's Chromium through Playwright (a test tool's own browser
# download does not work on this kind of machine).
if ! command -v chromium >/dev/null 2>&1; then
  echo "setup: installing chromium (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# Caddy, the compose deployment's TLS proxy: built at the release the compose file's image pins,
# so the tests and the compose check run the proxy operators get (Debian bookworm ships 2.6.2).
bash scripts/build-caddy.sh

# The compose deployment is run for real at the end of the test command (scripts/compose-check.sh):
# Podman with runc (crun refuses this machine kind's hybrid cgroups), debootstrap for the base image
# (no container registry is reachable) and Compose 1.29 for Podman's Docker-compatible API
# (docs/operations.md "Compose, run for real" says why not podman-compose).
missing=()
for tool in podman runc debootstrap docker-compose; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing podman, runc, debootstrap, docker-compose (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq podman runc debootstrap docker-compose >/dev/null
fi

# Helm lints and renders deploy/helm in the tests (tests/test_helm.py). No registry here serves
# its binary, so it is built once from its Go module into GOPATH/bin (a few minutes of CPU; the Go
# build cache makes later runs instant).
HELM_VERSION=v3.18.6
GO=$(command -v go || echo /usr/local/go/bin/go)
if ! command -v helm >/dev/null 2>&1 && [ -x "$GO" ] && [ ! -x "$("$GO" env GOPATH)/bin/helm" ]; then
  echo "setup: building helm $HELM_VERSION from its Go module (once)"
  "$GO" install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

# The interpreter: Debian's own python3.11 first. Debian builds it with profile-guided and link-time
# optimisation into one static executable, as the official python image the compose deployment
# runs is built; a pyenv build (libpython shared, no PGO or LTO) ran the same recalls with 6-15 %
# more API CPU (docs/benchmarks.md, issue 16: "The interpreter"). PYTHON=/path/to/python overrides.
if [ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3.11 ] && ! /usr/bin/python3.11 -c 'import ensurepip' 2>/dev/null; then
  echo "setup: installing python3.11-venv (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3.11-venv >/dev/null
fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in /usr/bin/python3.11 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import ensurepip, venv' 2>/dev/null; then
      PY=$candidate
      break
    fi
  done
fi
PY=$("${PY:-python3}" -c 'import os, sys; print(os.path.realpath(sys.executable))')
# a .venv made from another interpreter (an earlier default, or PYTHON changed) is made again
if [ -x .venv/bin/python ] &&
  [ "$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys._base_executable))' 2>/dev/null)" != "$PY" ]; then
  echo "setup: .venv was made from another interpreter; making it again from $PY"
  rm -rf .venv
fi
stamp=$(cat pyproject.toml clients/python/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
  echo "setup: installing Python dependencies into .venv ($PY)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[dev,evals,tracing]" -e "clients/python[openai,anthropic]"
  echo "$stamp" > .venv/.installed
fi

bash deploy/opensearch/build.sh
