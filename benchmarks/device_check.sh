#!/usr/bin/env bash
# GPU checks for a session that is lent a CUDA device (the project never needs one):
#   bash benchmarks/device_check.sh
# 1. the exactness tests on the device (tests/test_cuda.py; skipped on CPU-only machines),
# 2. the service load benchmark on the device in bf16 (the 6x target of the service issue).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
status=0
"$PY" -m pytest -q tests/test_cuda.py || status=$?  # the benchmark runs either way
"$PY" benchmarks/service_load.py --device cuda --precision bf16
exit $status
