#!/usr/bin/env bash
# Set everything up, then fuzz the whole API (tests/security/test_api_fuzz.py: schemathesis over
# the live OpenAPI schema of a real uvicorn process on a real OpenSearch node and Redis, the
# scripted model as the OpenAI and Anthropic upstream) for longer than CI does, with a random seed
# it prints so a failure can be replayed:
#   scripts/fuzz.sh                          # 200 examples per operation (800 on the proxy), ~20-40 min on 2 cores
#   scripts/fuzz.sh --examples 50 --seed 42  # replay, or a shorter pass
# Extra arguments after -- go to pytest (e.g. -- -k messages). CI runs the same module with 12
# examples per operation (48 on the proxy), derandomized.
set -euo pipefail
cd "$(dirname "$0")/.."
examples=200
seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
while [[ $# -gt 0 ]]; do
  case "$1" in
    --examples) examples=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
bash scripts/setup.sh
echo "fuzz: ${examples} examples per operation, seed ${seed} (replay: scripts/fuzz.sh --examples ${examples} --seed ${seed})"
export TENURE_FUZZ_MAX_EXAMPLES=$examples TENURE_FUZZ_SEED=$seed
exec .venv/bin/python -m pytest tests/security/test_api_fuzz.py -p no:cacheprovider -o timeout=3600 -q "$@"
