#!/usr/bin/env bash
# The serving lease (one call, under 5 minutes of device time; the project never needs a GPU):
#   1. the CUDA exactness tests (tests/test_cuda.py: CUDA graph replays give the eager tokens, ...),
#   2. ops and kernel launches per engine step at 1 / 8 / 32 / 64 requests (benchmarks/step_profile.py), and
#      at 1 / 32 with the random streams eager (without torch.compile),
#   3. the service under load, bf16, 1 / 8 / 32 / 64 clients, CUDA graphs and compiled streams on and off,
#      with the forward-only bound of the same device in the same call (benchmarks/service_load.py),
#   4. the text model's EB and random-order requests at 32 clients (tokens/s committed),
#   5. the serving columns (TTFT, ITL, tokens/s, requests/s, p50 / p99, errors) at 1 / 8 / 32 / 64 clients,
#      QM9 and text through our /generate client (benchmarks/serving.py; guidellm is not on the device).
# The device has no fastapi / pydantic / uvicorn: carry them as wheels in .whl/ (training/device_suite.sh's
# header says how) and carry only checkpoints/qm9-tt-r16 and checkpoints/text-tt-r4.
# Run:       bash benchmarks/device_check.sh                           (device: OUT is set by the tool)
# Rehearse:  SMOKE=1 DEVICE=cpu OUT=/tmp/serving PYTHON=.venv/bin/python bash benchmarks/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
LOG=serving.log
source training/_device_start.sh
PRECISION=bf16; CLIENTS=(1 8 32 64); PER_CLIENT=4; ROUNDS=2; TEXT_CLIENTS=32
if [ "$SMOKE" = 1 ]; then PRECISION=fp32; CLIENTS=(1 2); PER_CLIENT=1; ROUNDS=1; TEXT_CLIENTS=2; fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
status=0

if [ "$DEVICE" != cpu ]; then
  say "CUDA tests"
  "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py || status=$?
fi

say "step profile: ops per step"
timeout 120 "$PY" benchmarks/step_profile.py --device "$DEVICE" --precision "$PRECISION" --clients "${CLIENTS[@]}" \
  --rounds "$ROUNDS" --top 12 || status=$?
if [ "$DEVICE" != cpu ]; then
  say "step profile: ops per step, the streams eager (no torch.compile)"
  timeout 60 "$PY" benchmarks/step_profile.py --device "$DEVICE" --precision "$PRECISION" --clients 1 32 \
    --rounds 1 --top 0 --no-compile-streams || status=$?
fi

say "service load, QM9 (CUDA graphs where the device has them)"
timeout 150 "$PY" benchmarks/service_load.py --device "$DEVICE" --precision "$PRECISION" --clients "${CLIENTS[@]}" \
  --requests-per-client "$PER_CLIENT" || status=$?
if [ "$DEVICE" != cpu ]; then
  say "service load, QM9, eager (no CUDA graphs, no compiled streams)"
  timeout 90 "$PY" benchmarks/service_load.py --device "$DEVICE" --precision "$PRECISION" --clients 32 64 \
    --requests-per-client "$PER_CLIENT" "--server-args=--no-cuda-graphs --no-compile-streams" || status=$?
fi

for request in '{"sampler": "eb", "eb_gamma": 0.5, "steps": 16, "num_samples": 1}' \
               '{"ordering": "random", "steps": 16, "num_samples": 1}'; do
  say "service load, text: $request"
  timeout 90 "$PY" benchmarks/service_load.py --model text --device "$DEVICE" --precision "$PRECISION" \
    --clients "$TEXT_CLIENTS" --requests-per-client 1 --request "$request" || status=$?
done
say "serving columns: TTFT, ITL, tokens/s, requests/s, p50 / p99, errors (QM9 and text through our client)"
for model in qm9 text; do
  timeout 120 "$PY" benchmarks/serving.py --only molecules --molecule-model "$model" --device "$DEVICE" \
    --precision "$PRECISION" --concurrency "${CLIENTS[@]}" --requests "$PER_CLIENT" || status=$?
done
say "done (status $status)"
exit $status
