#!/usr/bin/env bash
# Set everything up and run the service on its local stack:
#   real OpenSearch (127.0.0.1:${TENURE_OPENSEARCH_PORT:-9200}) and Redis (127.0.0.1:${TENURE_REDIS_PORT:-6379}),
#   a Celery worker (cheap + heavy queues) with the beat schedule, and the API on
#   http://127.0.0.1:${TENURE_API_PORT:-8000} (OpenAPI at /docs) with ${API_WORKERS:-2} uvicorn workers:
#   the topology of docker-compose.yml as local processes. Ctrl-C stops the workers and the API;
#   `python deploy/devstack.py down` stops OpenSearch and Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

OS_PORT=${TENURE_OPENSEARCH_PORT:-9200}
REDIS_PORT=${TENURE_REDIS_PORT:-6379}
API_PORT=${TENURE_API_PORT:-8000}
API_WORKERS=${API_WORKERS:-2}
.venv/bin/python deploy/devstack.py up --opensearch-port "$OS_PORT" --redis-port "$REDIS_PORT"

export TENURE_OPENSEARCH_URL="http://127.0.0.1:$OS_PORT"
export TENURE_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"

# consumes both queues the app declares (tenure.cheap, tenure.heavy); -B runs the beat schedule
.venv/bin/celery -A workers.celery_app:app worker -B --loglevel INFO --concurrency 2 \
  --schedule .devstack/celerybeat-schedule &
WORKER=$!
trap 'kill $WORKER 2>/dev/null || true' EXIT INT TERM

echo "Tenure API on http://127.0.0.1:$API_PORT (first admin key: .venv/bin/tenure bootstrap; see README)"
.venv/bin/uvicorn service.app:create_app --factory --host 127.0.0.1 --port "$API_PORT" --workers "$API_WORKERS" \
  --http service.api.http_protocol:JsonErrorHttpProtocol
