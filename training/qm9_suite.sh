#!/usr/bin/env bash
# The bundled QM9 suite, resumable: every fine-tune of the base gets the same budget (steps, batch,
# schedule), then bf16 exports into checkpoints/ and the few-step quality table. The bundled fine-tunes
# have 6362 steps each (trained on a GPU lease by training/device_suite.sh; about 1.3 h each here).
#   bash training/qm9_suite.sh            (re-run after an interruption: finished runs are skipped)
#   STEPS=1500 bash training/qm9_suite.sh (the session-2 budget)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STEPS=${STEPS:-6362}
# the pre-trained base (bundled; 8000 steps of training/configs/qm9.yaml, see its model card)
BASE=${BASE:-checkpoints/qm9-base}
for spec in "tt 8" "none 1" "cp 64" "tt 2" "tt 4"; do
  set -- $spec
  out="runs/qm9-$1-r$2"
  $PY training/finetune.py --config qm9_finetune --base "$BASE" --decomposition "$1" --rank "$2" \
    --head 1layer --out "$out" --max-steps "$STEPS" --resume --quiet --set total_steps="$STEPS"
done
for spec in "tt 8" "none 1" "cp 64" "tt 2" "tt 4"; do
  set -- $spec
  $PY training/export.py --src "runs/qm9-$1-r$2" --out "checkpoints/qm9-$1-r$2" --family qm9
done
mkdir -p results/qm9
$PY training/evaluate.py --checkpoints checkpoints --out results/qm9 --cards | tee results/qm9/table.txt
