#!/bin/sh
# Container command (also runnable outside Docker from the repository root, same environment):
#   TTCORE_MODE=ray       Ray head + Serve application from deploy/serve_config.yaml (default)
#   TTCORE_MODE=embedded  the same FastAPI app under uvicorn, no Ray
#   TTCORE_MODE=worker    a Ray worker joining RAY_HEAD (docker compose up --scale ray-worker=N)
set -eu
cd "$(dirname "$0")/.."
MODE="${TTCORE_MODE:-ray}"
PORT="${PORT:-8000}"
CHECKPOINTS="${TTCORE_CHECKPOINTS:-checkpoints}"
case "$MODE" in
  embedded)
    exec python -m service --host 0.0.0.0 --port "$PORT" --checkpoints "$CHECKPOINTS" ${TTCORE_ARGS:-}
    ;;
  ray)
    ray start --head --port=6379 --dashboard-host=0.0.0.0 --metrics-export-port=8080 \
      --disable-usage-stats ${RAY_START_ARGS:-}
    TTCORE_CHECKPOINTS="$CHECKPOINTS" exec serve run --address auto deploy/serve_config.yaml
    ;;
  worker)
    exec ray start --address="${RAY_HEAD:-ttcore:6379}" --metrics-export-port=8080 --disable-usage-stats \
      --block ${RAY_START_ARGS:-}
    ;;
  *)
    echo "TTCORE_MODE must be ray, embedded or worker, got '$MODE'" >&2
    exit 2
    ;;
esac
