#!/bin/sh
# Runs the compose file's own redis-server command unchanged, adding only where to listen: on host
# networking (the local override) every container shares the host's loopback, so Redis binds
# 127.0.0.1 on the port the override gives it (REDIS_PORT) instead of 0.0.0.0:6379.
set -eu
if [ "${1:-}" = "redis-server" ]; then
  shift
  exec redis-server "$@" --bind 127.0.0.1 --port "${REDIS_PORT:-6379}"
fi
exec "$@"
