#!/usr/bin/env bash
# Build the compose deployment's TLS proxy, Caddy, at the version deploy/caddy/release/go.mod pins,
# from the Go module proxy (go.sum checks every module), into /usr/local/bin/caddy. The tests and
# the compose check run this binary; docker-compose.yml's `tls` image is the same release
# (tests/test_compose.py checks the tag). Quick when that version is already there.
set -euo pipefail
cd "$(dirname "$0")/../deploy/caddy/release"

want="$(awk '$1 == "require" && $2 == "github.com/caddyserver/caddy/v2" {print $3}' go.mod)"
target=/usr/local/bin/caddy
if [ -x "$target" ] && [ "$("$target" version | cut -d' ' -f1)" = "$want" ]; then
  exit 0
fi
go=$(command -v go || echo /usr/local/go/bin/go)
if [ ! -x "$go" ]; then
  echo "build-caddy: Go is needed to build Caddy $want (this machine kind has it in /usr/local/go)" >&2
  exit 1
fi
echo "setup: building caddy $want (Go module proxy; a few minutes the first time)"
"$go" build -mod=readonly -trimpath -ldflags "-s -w" -o "$target.new" . 2> >(grep -v "^go: downloading" >&2)
mv "$target.new" "$target"
"$target" version
