#!/usr/bin/env bash
# One GPU lease in one call (the project never needs a GPU; this is what a lease buys):
#   1. the CUDA exactness tests (tests/test_cuda.py),
#   2. the service under load on the device, bf16, 1 / 8 / 32 / 64 clients (benchmarks/service_load.py),
#   3. side by side on the same device, until the lease's deadline: the QM9 TT r=16 fine-tune of the
#      bundled recipe (the served r=8's: same base, 6362 steps, marginal-consistency term at weight 3) and
#      the text TT r=4 continued with the marginal-consistency term (finetune.py --base checkpoints/text-tt-r4);
#      both exported in bf16 and brought back under $OUT as a split tar (the tool returns files <= 16 MiB).
#
# Prepared here (the device has no registry and no RDKit; 64 MiB of tree travel):
#   echo /.whl/ >> .git/info/exclude; echo /.lease/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl fastapi starlette pydantic \
#       pydantic_core typing-inspection annotated-types uvicorn opentelemetry-api typing_extensions
#   .lease/cache/*.gz   the gzipped QM9 and text caches (TTCORE_CACHE), .lease/qm9-base the QM9 base
#   move checkpoints/ other than qm9-tt-r16 and text-tt-r4 out of the tree for the call
# Run:       bash training/device_suite.sh                       (device: OUT is set by the tool)
# Rehearse:  SMOKE=1 OUT=/tmp/lease PYTHON=.venv/bin/python bash training/device_suite.sh   (CPU, minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
LEASE_S=${LEASE_S:-540}   # the whole script's wall-clock budget, exports included
LOG=lease.log
source training/_device_start.sh
export TTCORE_CACHE=${TTCORE_CACHE:-/tmp/ttcore-cache}
mkdir -p "$TTCORE_CACHE"
for f in .lease/cache/*.gz; do [ -e "$f" ] && gunzip -c "$f" > "$TTCORE_CACHE/$(basename "$f" .gz)"; done
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

say "1. CUDA tests"
"$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py

say "2. service load"
SVC=/tmp/svc-checkpoints; rm -rf "$SVC"; mkdir -p "$SVC"; ln -s "$PWD/checkpoints/qm9-tt-r16" "$SVC/"
if [ "$SMOKE" = 1 ]; then
  "$PY" benchmarks/service_load.py --checkpoints "$SVC" --clients 2 --requests-per-client 1 --precision bf16
else
  "$PY" benchmarks/service_load.py --checkpoints "$SVC" --clients 1 8 32 64 --precision bf16 --device cuda
fi

say "3. training, side by side until the deadline"
RUNS=/tmp/lease-runs; mkdir -p "$RUNS"
left_min=$(python3 -c "print(max(0.5, ($LEASE_S - ($(date +%s) - $T0) - 60) / 60))")  # 60 s for exports
if [ "$SMOKE" = 1 ]; then QSTEPS=2; TSTEPS=1; SMALL=(val_batches=1 warmup_steps=1); else QSTEPS=6362; TSTEPS=1200; SMALL=(); fi
"$PY" training/finetune.py --config qm9_finetune --base .lease/qm9-base --decomposition tt --rank 16 --head 1layer \
  --out "$RUNS/qm9-tt-r16" --max-steps $QSTEPS --max-minutes "$left_min" --resume --quiet \
  --set total_steps=$QSTEPS marginal_weight=3.0 compile=false ckpt_minutes=3 "${SMALL[@]}" > "$OUT/qm9-tt-r16.log" 2>&1 &
Q=$!
"$PY" training/finetune.py --config text_finetune --base checkpoints/text-tt-r4 --decomposition tt --rank 4 \
  --head 2layer --out "$RUNS/text-tt-r4-m3" --max-steps $TSTEPS --max-minutes "$left_min" --resume --quiet \
  --set total_steps=$TSTEPS marginal_weight=3.0 compile=false ckpt_minutes=3 "${SMALL[@]}" > "$OUT/text-tt-r4-m3.log" 2>&1 &
T=$!
wait $Q; echo "qm9-tt-r16 exit $?"; wait $T; echo "text-tt-r4-m3 exit $?"
tail -n 3 "$OUT/qm9-tt-r16.log" "$OUT/text-tt-r4-m3.log"

say "exports"
mkdir -p "$RUNS/export"
"$PY" training/export.py --src "$RUNS/qm9-tt-r16" --out "$RUNS/export/qm9-tt-r16" --family qm9
"$PY" training/export.py --src "$RUNS/text-tt-r4-m3" --out "$RUNS/export/text-tt-r4-m3" --family text
for d in "$RUNS"/*/train_state; do echo "$d"; "$PY" -c "import json, sys; d = json.load(open(sys.argv[1]))
print({k: d[k] for k in ('step', 'wall_seconds', 'seconds_per_step', 'val', 'device')})" "$d/state.json"; done
tar -C "$RUNS/export" -cf - . | split -b 15M - "$OUT/exports.tar.part-"
ls -la "$OUT"
say "done"
