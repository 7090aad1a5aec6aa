#!/usr/bin/env bash
# A GPU lease for MOSES at scale (one call, and a second for the samples left): the base
# (training/configs/moses_gpu.yaml, 12.6M parameters, compiled, sized to BASE_MINUTES by --fit-minutes), its
# TT r = 8 fine-tune sized to FT_MINUTES, the rank-1 fine-tune at exactly the TT's steps (equal budget;
# moses_finetune: marginal-consistency term at weight 3), bf16 exports, then MOSES's 30,000 samples per setting
# drawn on the device until the call's time is spent (evaluate_moses.py --sample-only: K = 16, 8, 4, 32, 64,
# EB; the metrics need RDKit and run afterwards here).
#   bash training/device_moses.sh                 (device: OUT set by the tool; timeout_s 590)
#   LEASE_SECONDS=200 bash training/device_moses.sh   (a second call on the warm machine: the samples left; 230)
#   SMOKE=1 OUT=/tmp/moses PYTHON=.venv/bin/python bash training/device_moses.sh   (rehearsal, CPU)
# Prepared: .lease/moses/{train,test,test_scaffolds}.csv.gz (molsets' files; the device has no registry) and
# .lease/cache/split-* (the tokenized split built here, 38 MB; without it the base tokenizes MOSES into
# TTCORE_CACHE first and the fine-tunes load that); checkpoints/ moved out of the tree for the call
# (docs/results-moses.md has the commands).
# Comes back under $OUT: moses.log, pair.tar.part-* (the pair's exports: 49 MiB; the base's alone if the
# fine-tunes did not finish) and samples.tgz (the molecules and how each setting was drawn).
# Resumable: each stage is skipped when its export exists, and sampling skips the settings already drawn.
# A second call on the still-warm machine (runs/ is kept) goes on where the first stopped; on a later lease,
# carry what came back as .lease/moses-export/<name>/ (and the samples as .lease/moses-samples/) and the
# stages they cover are skipped. Training itself does not continue across leases: a run's train state
# (weights, AdamW moments: 150 MB) cannot come back, so an unfinished stage starts again.
# Afterwards, here: python training/evaluate_moses.py --checkpoints <pair> --samples-dir <samples> --out ...
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
LEASE_SECONDS=${LEASE_SECONDS:-570} BASE_MINUTES=${BASE_MINUTES:-3} FT_MINUTES=${FT_MINUTES:-1}
SAMPLES=${SAMPLES:-30000} DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-}  # a model.size preset instead of moses_gpu's width: s fits; m and up cannot come back (64 MiB)
LOG=moses.log RUNS=${RUNS:-runs/moses-lease}
. training/_lease.sh
EXPORT=$RUNS/export SAMPLED=$RUNS/samples
mkdir -p "$EXPORT" "$SAMPLED"
RAN=()
[ -d .lease/moses-export ] && cp -rn .lease/moses-export/. "$EXPORT/"
[ -d .lease/moses-samples ] && cp -rn .lease/moses-samples/. "$SAMPLED/"
BASE_SET=(ckpt_minutes=2) FT_SET=(batch_size=1024 ckpt_minutes=2 val_every=2000 val_batches=4)
[ -n "$SIZE" ] && BASE_SET+=(model.size="$SIZE")
BASE_BUDGET=(--fit-minutes "$BASE_MINUTES") FT_BUDGET=(--fit-minutes "$FT_MINUTES")
EVAL=(--samples "$SAMPLES" --batch 5000 --memory-mb 40000 --steps 16 8 4 32 64 --eb-gammas 0.5 1.0)
if [ "${SMOKE:-0}" = 1 ]; then
  DEVICE=cpu BASE_BUDGET=(--fit-minutes 0.01) FT_BUDGET=(--fit-minutes 0.01)  # at least 11 steps: the probe
  SMALL+=(model.hidden_dim=32 model.cond_dim=16 model.n_blocks=1 model.n_heads=2 batch_size=16
          compile=false)  # on the CPU rehearsal, compiling costs more than its steps
  FT_SET=()
  EVAL=(--samples 8 --batch 8 --steps 2 --eb-gammas 1.0 --precision fp32)
fi
left() { echo $(( LEASE_SECONDS - $(date +%s) + START )); }  # seconds
plus() { awk "BEGIN { print $1 + $2 }"; }
exported() { [ -f "$EXPORT/$1/config.json" ]; }
export_run() {  # name: the run's bf16 export, written where the next stages (and the tar) find it
  "$PY" training/export.py --src "$RUNS/$1" --out "$EXPORT/$1" --family moses && echo "$1 exported"
}
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"

if ! exported moses-base && ! { exported moses-tt-r8 && exported moses-none-r1; }; then
  "$PY" training/pretrain.py --config moses_gpu --out "$RUNS/moses-base" "${BASE_BUDGET[@]}" \
    --max-minutes "$(plus "$BASE_MINUTES" 2)" --resume --quiet --set "${BASE_SET[@]}" "${SMALL[@]}"
  echo "base exit $?"
  RAN+=(moses-base)
  export_run moses-base
fi
BASE=$RUNS/moses-base
[ -f "$BASE/config.json" ] || BASE=$EXPORT/moses-base
finetune() {  # name decomposition rank; the budget in BUDGET (flags) and EXTRA (config overrides)
  "$PY" training/finetune.py --config moses_finetune --base "$BASE" --decomposition "$2" --rank "$3" \
    --head 1layer --out "$RUNS/$1" "${BUDGET[@]}" --max-minutes "$(plus "$FT_MINUTES" 1.5)" --resume --quiet \
    --set "${FT_SET[@]}" "${EXTRA[@]}" "${SMALL[@]}"
  echo "$1 exit $?"
  RAN+=("$1")
  export_run "$1"
}
BUDGET=("${FT_BUDGET[@]}") EXTRA=()
exported moses-tt-r8 || finetune moses-tt-r8 tt 8
if ! exported moses-none-r1; then  # the TT's steps and schedule: the two fine-tunes at an equal budget
  TT_STEPS=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" \
             "$RUNS/moses-tt-r8/train_state/state.json" 2>/dev/null || echo 0)
  if [ "$TT_STEPS" -gt 0 ]; then
    BUDGET=(--max-steps "$TT_STEPS") EXTRA=(total_steps="$TT_STEPS")
    finetune moses-none-r1 none 1
  else
    echo "moses-none-r1 skipped: the TT fine-tune's steps are not known (its train state is not here)"
  fi
fi
TRAINED=$(date +%s)  # the training phase ends here (data, compile, validation and export included)
rm -f "$OUT"/pair.tar.part-*
if exported moses-tt-r8 && exported moses-none-r1; then
  tar -C "$EXPORT" -cf - moses-tt-r8 moses-none-r1 | split -b 15M - "$OUT/pair.tar.part-"  # <= 16 MiB each
  SAMPLE_MINUTES=$(awk "BEGIN { m = ($(left) - 20) / 60; print (m > 0 ? m : 0) }")
  echo "sampling for at most $SAMPLE_MINUTES minutes"
  "$PY" training/evaluate_moses.py --checkpoints "$EXPORT/moses-tt-r8" "$EXPORT/moses-none-r1" \
    --samples-dir "$SAMPLED" --sample-only --max-minutes "$SAMPLE_MINUTES" --device "$DEVICE" --adaptive-path fast \
    "${EVAL[@]}"
  echo "sampling exit $?"
  tar -C "$SAMPLED" -czf "$OUT/samples.tgz" .
elif exported moses-base; then
  tar -C "$EXPORT" -cf - moses-base | split -b 15M - "$OUT/pair.tar.part-"
fi
"$PY" - "$RUNS" "$START" "$TRAINED" "${RAN[@]}" <<'PY'
import json, sys, time
from pathlib import Path
runs, start, trained, ran = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
train = 0.0
for name in ran:  # the runs this call trained (a stage skipped or carried in trained elsewhere)
    state = runs / name / "train_state" / "state.json"
    meta = json.loads(state.read_text()) if state.exists() else {}
    t = meta.get("throughput", {})
    train += t.get("train_seconds", 0.0)
    print(f"{name}: step {meta.get('step', 0)}, {t.get('tokens_per_second', 0):,.0f} tokens/s, "
          f"MFU {100 * t.get('mfu', 0):.1f}%, {t.get('train_seconds', 0):.0f} s in training steps")
phase, wall = max(trained - start, 1), time.time() - start
print(f"training phase: {train:.0f} s of training steps in {phase:.0f} s ({100 * train / phase:.0f}%; data load, "
      f"compile, validation and export are the rest)")
print(f"lease: {train:.0f} s of training steps in {wall:.0f} s of wall time ({100 * train / wall:.0f}%; "
      f"sampling {wall - phase:.0f} s)")
PY
ls -la "$OUT"
