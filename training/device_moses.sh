#!/usr/bin/env bash
# A GPU lease for MOSES: the base (training/configs/moses.yaml), then its TT r=8 and rank-1 fine-tunes side by
# side at the same budget (moses_finetune: marginal-consistency term at weight 3), bf16 exports back under $OUT
# as moses-none-r1 and moses-tt-r8; evaluate_moses.py measures them here afterwards.
#   bash training/device_moses.sh                 (device: OUT set by the tool)
#   SMOKE=1 OUT=/tmp/moses PYTHON=.venv/bin/python bash training/device_moses.sh   (rehearsal, CPU)
# Prepared: .lease/moses/{train,test,test_scaffolds}.csv.gz (molsets' files; the device has no registry);
# checkpoints/ moved out of the tree for the call (64 MiB travel). BASE_STEPS / FT_STEPS set the schedules,
# BASE_MINUTES / FT_MINUTES cap the wall time (the schedules are the budget: size them to finish). The
# configs compile the backbone (torch.compile: 0.97M tokens/s against 0.62M eager on an H200, measured).
# SIZE picks the base's model preset (model.size: s, m, l, xl; the fine-tunes keep their base's); FIT=1 sizes the
# base to BASE_MINUTES of training on the device (--fit-minutes: the steps that fit, measured and printed)
# instead of BASE_STEPS. The last lines say what share of the lease's wall time went to training steps.
set -uo pipefail
cd "$(dirname "$0")/.."
BASE_STEPS=${BASE_STEPS:-8000} FT_STEPS=${FT_STEPS:-3000}
BASE_MINUTES=${BASE_MINUTES:-5} FT_MINUTES=${FT_MINUTES:-3} SIZE=${SIZE:-} FIT=${FIT:-0}
LOG=moses.log RUNS=${RUNS:-/tmp/moses-runs}
START=$(date +%s)
. training/_lease.sh
BASE_SET=()
[ -n "$SIZE" ] && BASE_SET+=(model.size="$SIZE")
BASE_BUDGET=(--max-steps "$BASE_STEPS") BASE_CAP=$BASE_MINUTES
[ "$FIT" = 1 ] && BASE_BUDGET=(--fit-minutes "$BASE_MINUTES") BASE_CAP=$((BASE_MINUTES + 2))  # the cap: a safety stop
if [ "${SMOKE:-0}" = 1 ]; then
  BASE_STEPS=2 FT_STEPS=2 BASE_SET=() BASE_BUDGET=(--max-steps 2)
  SMALL+=(model.hidden_dim=32 model.cond_dim=16 model.n_blocks=1 model.n_heads=2 batch_size=16
          data.val_fraction=0.001 compile=false)  # on the CPU rehearsal, compiling costs more than 2 steps
fi
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
"$PY" training/pretrain.py --config moses --out "$RUNS/moses-base" "${BASE_BUDGET[@]}" \
  --max-minutes "$BASE_CAP" --resume --quiet --set total_steps="$BASE_STEPS" ckpt_minutes=2 \
  "${BASE_SET[@]}" "${SMALL[@]}"
echo "base exit $?"
finetune() {  # name decomposition rank
  "$PY" training/finetune.py --config moses_finetune --base "$RUNS/moses-base" --decomposition "$2" --rank "$3" \
    --head 1layer --out "$RUNS/$1" --max-steps "$FT_STEPS" --max-minutes "$FT_MINUTES" --resume --quiet \
    --set total_steps="$FT_STEPS" ckpt_minutes=2 "${SMALL[@]}" > "$OUT/$1.log" 2>&1
  echo "$1 exit $?"; tail -n 1 "$OUT/$1.log"
}
finetune moses-tt-r8 tt 8 &
A=$!
finetune moses-none-r1 none 1 &
B=$!
wait $A $B  # by PID: a bare `wait` also waits for the log's process substitution (tee), which never ends
for name in moses-base moses-tt-r8 moses-none-r1; do
  "$PY" training/export.py --src "$RUNS/$name" --out "$RUNS/export/$name" --family moses
done
tar -C "$RUNS/export" -cf - . | split -b 15M - "$OUT/moses.tar.part-"  # files come back <= 16 MiB
"$PY" - "$RUNS" "$START" <<'PY'
import json, sys, time
from pathlib import Path
runs, start = Path(sys.argv[1]), float(sys.argv[2])
train = 0.0
for name in ("moses-base", "moses-tt-r8", "moses-none-r1"):
    state = runs / name / "train_state" / "state.json"
    t = json.loads(state.read_text()).get("throughput", {}) if state.exists() else {}
    train += t.get("train_seconds", 0.0)
    print(f"{name}: {t.get('tokens_per_second', 0):,.0f} tokens/s, MFU {100 * t.get('mfu', 0):.1f}%, "
          f"{t.get('train_seconds', 0):.0f} s in training steps")
wall = time.time() - start  # the fine-tunes run side by side: their steps overlap in wall time
print(f"lease: {train:.0f} s of training steps (the fine-tunes' summed) in {wall:.0f} s of wall time "
      f"({100 * train / wall:.0f}%; data load, compile, validation and export are the rest)")
PY
ls -la "$OUT"
