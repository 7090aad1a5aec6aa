#!/usr/bin/env bash
# A GPU lease for the rank rows of the QM9 quality table, three fine-tunes side by side with the bundled
# recipe (qm9_finetune, 1-layer head, marginal-consistency term at weight 3, bf16), bf16 exports back under $OUT:
#   qm9-tt-r32     TT r=32 from the QM9 base, the served r=8's budget (6362 steps)
#   qm9-cp-r256    CP r=256 from the QM9 base, same budget: as many head outputs per position as TT r=16
#                  (r*V + r against r*r*V)
#   qm9-tt-r16-x2  the TT r=16 fine-tune (.lease/qm9-tt-r16, trained at that budget on an earlier lease)
#                  continued 6362 more steps: the "longer fine-tune" lever at twice the budget
#   MINUTES=6 bash training/device_rank.sh        (device: OUT set by the tool; start-up and data loading
#                                                  take 1-2 min there, exports ~15 s)
#   SMOKE=1 OUT=/tmp/rank PYTHON=.venv/bin/python bash training/device_rank.sh   (rehearsal, CPU)
# Prepared: .lease/cache/qm9-*.json.gz (the QM9 cache), .lease/qm9-base, .lease/qm9-tt-r16 (carried);
# checkpoints/ moved out of the tree for the call (64 MiB travel). BASE, CONT and CONT_RANK override the
# base and the run continued (the CPU rehearsal in the tests uses the bundled checkpoints).
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-6362}
MINUTES=${MINUTES:-6}
BASE=${BASE:-.lease/qm9-base}
CONT=${CONT:-.lease/qm9-tt-r16}
CONT_RANK=${CONT_RANK:-16}
LOG=rank.log RUNS=${RUNS:-/tmp/rank-runs}
. training/_lease.sh
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
run() {  # name base decomposition rank
  "$PY" training/finetune.py --config qm9_finetune --head 1layer --max-steps "$STEPS" --max-minutes "$MINUTES" \
    --resume --quiet --base "$2" --decomposition "$3" --rank "$4" --out "$RUNS/$1" \
    --set total_steps="$STEPS" marginal_weight=3.0 compile=false ckpt_minutes=3 "${SMALL[@]}" > "$OUT/$1.log" 2>&1
  echo "$1 exit $?"; tail -n 1 "$OUT/$1.log"
}
run qm9-tt-r32 "$BASE" tt 32 &
A=$!
run qm9-cp-r256 "$BASE" cp 256 &
B=$!
run qm9-tt-r16-x2 "$CONT" tt "$CONT_RANK" &
C=$!
wait $A $B $C  # by PID: a bare `wait` also waits for the log's process substitution (tee), which never ends
for name in qm9-tt-r32 qm9-cp-r256 qm9-tt-r16-x2; do
  "$PY" training/export.py --src "$RUNS/$name" --out "$RUNS/export/$name" --family qm9
done
tar -C "$RUNS/export" -cf - . | split -b 15M - "$OUT/rank.tar.part-"  # files come back <= 16 MiB
ls -la "$OUT"
