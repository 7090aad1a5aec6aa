#!/bin/sh
# Container command (also runnable outside Docker from the repository root, same environment):
#   TTCORE_MODE=ray       Ray head + Serve application from deploy/serve_config.yaml (default)
#   TTCORE_MODE=embedded  the same FastAPI app under uvicorn, no Ray
#   TTCORE_MODE=worker    a Ray worker joining RAY_HEAD (docker compose up --scale ray-worker=N)
# Ray token authentication (RAY_AUTH_MODE=token, the image's default): the token is $RAY_AUTH_TOKEN, or the
# file $RAY_AUTH_TOKEN_PATH (default ~/ray-auth/token), which the head creates (random, mode 600) when it is
# missing and workers sharing that volume wait for. Nothing of it is committed.
set -eu
cd "$(dirname "$0")/.."
MODE="${TTCORE_MODE:-ray}"
PORT="${PORT:-8000}"
CHECKPOINTS="${TTCORE_CHECKPOINTS:-checkpoints}"

ray_token() {  # $1: head or worker
  if [ "${RAY_AUTH_MODE:-disabled}" != token ] || [ -n "${RAY_AUTH_TOKEN:-}" ]; then
    return 0
  fi
  RAY_AUTH_TOKEN_PATH="${RAY_AUTH_TOKEN_PATH:-$HOME/ray-auth/token}"
  export RAY_AUTH_TOKEN_PATH
  file="$RAY_AUTH_TOKEN_PATH"
  if [ "$1" = head ] && [ ! -s "$file" ]; then
    mkdir -p "$(dirname "$file")"
    (umask 077 && python -c "import secrets; print(secrets.token_hex(32))" > "$file")
  fi
  while [ ! -s "$file" ]; do sleep 1; done
}

case "$MODE" in
  embedded)
    exec python -m service --host 0.0.0.0 --port "$PORT" --checkpoints "$CHECKPOINTS" ${TTCORE_ARGS:-}
    ;;
  ray)
    ray_token head
    ray start --head --port=6379 --dashboard-host=0.0.0.0 --metrics-export-port=8080 \
      --disable-usage-stats ${RAY_START_ARGS:-}
    TTCORE_CHECKPOINTS="$CHECKPOINTS" exec serve run --address auto deploy/serve_config.yaml
    ;;
  worker)
    ray_token worker
    exec ray start --address="${RAY_HEAD:-ttcore:6379}" --metrics-export-port=8080 --disable-usage-stats \
      --block ${RAY_START_ARGS:-}
    ;;
  *)
    echo "TTCORE_MODE must be ray, embedded or worker, got '$MODE'" >&2
    exit 2
    ;;
esac
