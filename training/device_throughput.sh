#!/usr/bin/env bash
# A GPU lease for training throughput: tokens/s and MFU of the model presets (model: size:) on the device, with
# torch.compile off, then on for the sizes that fill a GPU (benchmarks/train_throughput.py); about 3 minutes.
#   bash training/device_throughput.sh                                               (device: OUT set by the tool)
#   SMOKE=1 OUT=/tmp/tput PYTHON=.venv/bin/python bash training/device_throughput.sh   (rehearsal, CPU)
# The table comes back as $OUT/throughput.log; every cell is printed as it is measured, and each pass stops at
# its time limit, so what a short lease measured still comes back.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=throughput.log RUNS=${RUNS:-/tmp/throughput-runs}
. training/_lease.sh
if [ "${SMOKE:-0}" = 1 ]; then
  "$PY" benchmarks/train_throughput.py --smoke
  exit $?
fi
timeout 60 "$PY" benchmarks/train_throughput.py --sizes s m l xl --batches 256 --compile off --steps 20
timeout 120 "$PY" benchmarks/train_throughput.py --sizes m l xl --batches 512 --compile on --steps 20 --warmup 3
ls -la "$OUT"
