#!/usr/bin/env bash
# A GPU lease for the distillation two CPU cores could only start (docs/distillation.md, grown students): two
# rank-64 TT students of the bundled TT r = 16, on data states, at the length the free rank-64 fit needed to reach
# 24.7% at K = 1 (768,000 sequences: 3,000 steps of 256), side by side:
#   qm9-tt-r64-d4   K = 4 from the teacher at 24 steps (k = 6), the recipe's learning rate
#   qm9-tt-r64-d2   K = 2 from the teacher at 22 steps (k = 11), its head at 10x the learning rate
# then each student's molecules at K = 1, 2, 4, 8 (1,024 a setting, random order) drawn on the device by
# evaluate.py --sample-only (the device has no RDKit) and brought back under $OUT/samples with the logs. A rank-64
# student is about 80 MB in bf16, more than a call brings back: its weights stay there. Measured here afterwards:
#   python training/evaluate.py --from-samples --data qm9 --samples-dir OUT/samples --samples 1024 \
#       --steps 1 2 4 8 --orderings random --eb-gammas --distribution --out results/distill-gpu
#
#   bash training/device_distill.sh                 (device: OUT set by the tool; timeout_s 590)
#   SMOKE=1 OUT=/tmp/distill PYTHON=.venv/bin/python TEACHER=... bash training/device_distill.sh   (rehearsal, CPU)
# Prepared: .lease/cache/qm9-*.json.gz (the QM9 cache), .lease/qm9-tt-r16 (the teacher; TEACHER overrides it);
# checkpoints/ moved out of the tree for the call (64 MiB travel). MINUTES bounds each student's training (the
# wall-clock guard beside the step budget), SAMPLE_MINUTES the sampling.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
STEPS=${STEPS:-3000}
MINUTES=${MINUTES:-6}
SAMPLE_MINUTES=${SAMPLE_MINUTES:-2}
TEACHER=${TEACHER:-.lease/qm9-tt-r16}
LOG=distill.log RUNS=${RUNS:-/tmp/distill-runs}
. training/_lease.sh
RANK=64 BATCH=256 SAMPLES=1024 DATA=()
if [ "${SMOKE:-0}" = 1 ]; then  # the recipe's path at the tiny size, on the committed sample
  RANK=4 BATCH=8 SAMPLES=16 DATA=(--data tests/data/qm9_sample.txt)
  SMALL+=(precision=fp32 threads=1)
fi
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
run() {  # name student-steps k extra-settings...
  local name=$1 steps=$2 k=$3
  shift 3
  "$PY" training/distill.py --config qm9_distill --teacher "$TEACHER" "${DATA[@]}" --steps "$steps" --k "$k" \
    --states data --student-rank "$RANK" --out "$RUNS/$name" --max-steps "$STEPS" --max-minutes "$MINUTES" \
    --resume --quiet --set batch_size="$BATCH" lr=3e-4 total_steps="$STEPS" compile=false ckpt_minutes=2 \
    val_every=1000 "$@" "${SMALL[@]}" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"; tail -n 2 "$OUT/$name.log"
}
run qm9-tt-r64-d4 4 6 &
A=$!
run qm9-tt-r64-d2 2 11 head_lr_ratio=10 &
B=$!
wait $A $B  # by PID: a bare `wait` also waits for the log's process substitution (tee), which never ends
for name in qm9-tt-r64-d4 qm9-tt-r64-d2; do  # the share of the chip each used
  "$PY" - "$RUNS/$name/train_state/state.json" "$name" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
t = s.get("throughput", {})
step, per_step, share = s["step"], s["seconds_per_step"], 100 * t.get("mfu", 0)
print(f"{sys.argv[2]}: step {step}, {per_step:.3f} s/step, student forward-backward-only MFU {share:.2f}% of the "
      f"{t.get('peak')} (the FLOPs of one plain training step of the student per token; a distillation step does "
      "more, the teacher's passes and the objective's own: an understatement of the share used)")
EOF
done
DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
"$PY" training/evaluate.py --checkpoints "$RUNS/qm9-tt-r64-d4" "$RUNS/qm9-tt-r64-d2" --device "$DEVICE" \
  --samples "$SAMPLES" --steps 1 2 4 8 --orderings random --eb-gammas --sample-only --samples-dir "$OUT/samples" \
  --max-minutes "$SAMPLE_MINUTES"
echo "sampling exit $?; $(( $(date +%s) - START )) s"
ls -R "$OUT"
