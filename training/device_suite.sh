#!/usr/bin/env bash
# The bundled suites trained side by side on one CUDA device (a GPU lease): the QM9 fine-tunes of the
# base (none, CP r=64, TT r=2/4/8; equal budgets) and the text base with its TT r=4 fine-tune.
# The recipes are the CPU ones (eager here: compile would cost more than it saves in a short lease);
# this script only runs them at once and sizes them to a wall-clock budget. A probe of every run,
# all at once (so under the same contention), measures its seconds per step; each run then gets the
# most steps that fit its budget, capped, with its cosine schedule over exactly those steps. The QM9
# fine-tunes share one step count, set by the slowest of them.
#   QM9_S=240 TEXT_S=170 FT_S=70 bash training/device_suite.sh
#   TOKENIZER=runs/text-base bash training/device_suite.sh     (keep an existing text vocabulary)
# Writes runs/device/{qm9-*,text-base,text-tt-r4} (resumable) and bf16 exports in runs/device/export/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
R=${RUNS:-runs/device}
PROBE=${PROBE_STEPS:-100}
QM9_S=${QM9_S:-240}; TEXT_S=${TEXT_S:-170}; FT_S=${FT_S:-70}
QM9_MAX=${QM9_MAX:-10000}; TEXT_MAX=${TEXT_MAX:-20000}; FT_MAX=${FT_MAX:-6000}
BASE=${BASE:-checkpoints/qm9-base}
TOK=(); [ -n "${TOKENIZER:-}" ] && TOK=(--tokenizer "$TOKENIZER")
SPECS=("tt 8" "none 1" "cp 64" "tt 2" "tt 4")
mkdir -p "$R"

qm9() {  # decomposition rank out steps [extra --set items]
  local dec=$1 rank=$2 out=$3 steps=$4; shift 4
  $PY training/finetune.py --config qm9_finetune --base "$BASE" --decomposition "$dec" --rank "$rank" \
    --head 1layer --out "$out" --max-steps "$steps" --resume --quiet --set compile=false "$@"
}
text_ft() {  # out steps [extra --set items]
  local base=$1 out=$2 steps=$3; shift 3
  $PY training/finetune.py --config text_finetune --base "$base" --decomposition tt --rank 4 --head 2layer \
    --out "$out" --max-steps "$steps" --resume --quiet --set compile=false "$@"
}
# seconds per step of finished runs -> the steps that fit `budget` at the slowest of them, capped
fit_steps() {  # budget cap run...
  $PY - "$@" <<'EOF'
import json, sys
budget, cap, runs = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
metas = [json.load(open(f"{r}/train_state/state.json")) for r in runs]
seconds_per_step = max(m["wall_seconds"] / m["step"] for m in metas)
print(max(1, min(cap, int(budget / seconds_per_step))))
EOF
}
waitall() { local p; for p in "$@"; do wait "$p"; done; }

echo "== probes: $PROBE steps each, all at once ($(date +%T))"
pids=()
for spec in "${SPECS[@]}"; do
  set -- $spec
  qm9 "$1" "$2" "$R/probe-qm9-$1-r$2" "$PROBE" >"$R/probe-qm9-$1-r$2.log" 2>&1 & pids+=($!)
done
$PY training/pretrain.py --config text "${TOK[@]}" --out "$R/probe-text" --max-steps "$PROBE" --quiet \
  --set compile=false >"$R/probe-text.log" 2>&1 & pids+=($!)
waitall "${pids[@]}"
NQ=$(fit_steps "$QM9_S" "$QM9_MAX" "$R"/probe-qm9-*-r*[0-9])
NT=$(fit_steps "$TEXT_S" "$TEXT_MAX" "$R/probe-text")
echo "== QM9 fine-tunes: $NQ steps each; text base: $NT steps ($(date +%T))"

pids=()
for spec in "${SPECS[@]}"; do
  set -- $spec
  qm9 "$1" "$2" "$R/qm9-$1-r$2" "$NQ" total_steps="$NQ" >"$R/qm9-$1-r$2.log" 2>&1 & pids+=($!)
done
(
  text_ft "$R/probe-text" "$R/probe-text-tt-r4" "$PROBE" & probe=$!
  $PY training/pretrain.py --config text "${TOK[@]}" --out "$R/text-base" --max-steps "$NT" --resume --quiet \
    --set compile=false total_steps="$NT"
  wait $probe
  NF=$(fit_steps "$FT_S" "$FT_MAX" "$R/probe-text-tt-r4")
  echo "== text TT r=4 fine-tune: $NF steps ($(date +%T))"
  text_ft "$R/text-base" "$R/text-tt-r4" "$NF" total_steps="$NF"
) >"$R/text.log" 2>&1 & pids+=($!)
waitall "${pids[@]}"
echo "== trained ($(date +%T))"

for spec in "${SPECS[@]}"; do
  set -- $spec
  $PY training/export.py --src "$R/qm9-$1-r$2" --out "$R/export/qm9-$1-r$2" --family qm9
done
for name in text-base text-tt-r4; do
  $PY training/export.py --src "$R/$name" --out "$R/export/$name" --family text
done
grep -h "^- validation\|^- steps" "$R"/export/*/model_card.md || true
echo "== done ($(date +%T))"
