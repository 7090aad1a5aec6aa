#!/usr/bin/env bash
# A GPU lease's rest: the two served QM9 fine-tunes (TT r=16 and rank 1) continued side by side at an
# equal budget with the bundled recipe (finetune.py --base <checkpoint>, marginal-consistency term at
# weight 3 for TT, as it was trained), bf16 exports back under $OUT.
#   STEPS=5000 MINUTES=4 bash training/device_continue.sh            (device: OUT set by the tool)
#   SMOKE=1 OUT=/tmp/cont PYTHON=.venv/bin/python bash training/device_continue.sh   (rehearsal, CPU)
# Prepared: .lease/cache/qm9-*.json.gz (the QM9 cache); checkpoints/ other than qm9-tt-r16 and
# qm9-none-r1 moved out of the tree for the call.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-5000}
MINUTES=${MINUTES:-4}
LOG=continue.log RUNS=${RUNS:-/tmp/continue-runs}
. training/_lease.sh
common=(--config qm9_finetune --head 1layer --max-steps "$STEPS" --max-minutes "$MINUTES" --resume --quiet)
"$PY" training/finetune.py "${common[@]}" --base checkpoints/qm9-tt-r16 --decomposition tt --rank 16 \
  --out "$RUNS/qm9-tt-r16-more" --set total_steps="$STEPS" marginal_weight=3.0 compile=false ckpt_minutes=3 \
  "${SMALL[@]}" > "$OUT/tt.log" 2>&1 &
A=$!
"$PY" training/finetune.py "${common[@]}" --base checkpoints/qm9-none-r1 --decomposition none --rank 1 \
  --out "$RUNS/qm9-none-r1-more" --set total_steps="$STEPS" compile=false ckpt_minutes=3 \
  "${SMALL[@]}" > "$OUT/none.log" 2>&1 &
B=$!
wait $A; echo "tt exit $?"; wait $B; echo "none exit $?"
tail -n 2 "$OUT/tt.log" "$OUT/none.log"
for name in qm9-tt-r16-more qm9-none-r1-more; do
  "$PY" training/export.py --src "$RUNS/$name" --out "$RUNS/export/$name" --family qm9
done
tar -C "$RUNS/export" -cf - . | split -b 15M - "$OUT/continued.tar.part-"  # files come back <= 16 MiB
ls -la "$OUT"
