#!/usr/bin/env bash
# A GPU lease for block diffusion at budgets two CPU cores cannot train (docs/block-diffusion.md): three chains
# side by side on the device, each the CPU chains' recipe: BD3-LM's start from a bundled MDLM (train_blocks.py
# --base), then a TT r = 8 head fine-tuned on clipped block times (eps = 0.75), each stage sized by --fit-minutes.
# QM9 at b = 4 and b = 8 from qm9-none-r1, MOSES at b = 4 from moses-none-r1 (54 positions padded to 56).
# Each TT and each block base (the rank-1 rows) is exported in bf16. Then their molecules are drawn on the device
# at k = 1, 2 and b steps a block, the TTs' rank-1 views too (evaluate.py / evaluate_moses.py --sample-only: RDKit
# is not there); the exact NLL of the k = 1 sampler on the held-out split is each run's last validation.
#   bash training/device_blocks.sh                                   (device: OUT set by the tool; timeout_s 590)
#   SMOKE=1 OUT=/tmp/blocks PYTHON=.venv/bin/python bash training/device_blocks.sh   (rehearsal, CPU, a minute)
# Prepared here (55 MB carried in all): mkdir -p .lease/blocks-base && cp -r checkpoints/qm9-none-r1
# checkpoints/moses-none-r1 .lease/blocks-base/; .lease/moses (molsets' train, test and test_scaffolds.csv.gz);
# .lease/cache/qm9-*.gz (this machine's QM9 cache, gzipped); checkpoints/ moved out of the tree for the call.
# Comes back under $OUT: blocks.log, one log a stage, moses.tar.part-* (the MOSES block base and TT, 51 MB: the
# QM9 exports do not fit beside them) and samples.tgz (every setting's molecules and how each was drawn); the
# commands that measure them here: docs/block-diffusion.md ("At a GPU's budget").
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
LEASE_SECONDS=${LEASE_SECONDS:-570} BASE_MINUTES=${BASE_MINUTES:-2} FT_MINUTES=${FT_MINUTES:-1.5}
SAMPLES=${SAMPLES:-10000} DEVICE=${DEVICE:-cuda}
BASE_GUARD=$(awk "BEGIN { print $BASE_MINUTES + 1.5 }") FT_GUARD=$(awk "BEGIN { print $FT_MINUTES + 1 }")  # wall clock
LOG=blocks.log RUNS=${RUNS:-runs/blocks-lease}
. training/_lease.sh
BASES=${BASES:-.lease/blocks-base} EXPORT=$RUNS/export SAMPLED=$RUNS/samples
mkdir -p "$EXPORT" "$SAMPLED/qm9" "$SAMPLED/moses"
SET=(batch_size=512 warmup_steps=50 val_every=100000 val_batches=8 ckpt_minutes=2 marginal_weight=0)
BUDGET=(--fit-minutes "$BASE_MINUTES") FT_BUDGET=(--fit-minutes "$FT_MINUTES")
QM9=(--config qm9_finetune) MOSES=(--config moses_finetune) EVAL=(--samples "$SAMPLES" --batch 2000)
if [ "${SMOKE:-0}" = 1 ]; then  # the chains' path at the tiny size, on the committed sample, from tiny bases
  DEVICE=cpu BUDGET=(--max-steps 2) FT_BUDGET=(--max-steps 2) EVAL=(--samples 8 --batch 8)
  TINY=(model.hidden_dim=32 model.cond_dim=16 model.n_blocks=1 model.n_heads=2 compile=false precision=fp32)
  SET=(batch_size=16 "${SMALL[@]}" val_every=100000 compile=false precision=fp32 marginal_weight=0)
  QM9=(--config tiny --data tests/data/qm9_sample.txt) MOSES=("${QM9[@]}") BASES=$RUNS/tiny-bases
  for name in qm9-none-r1 moses-none-r1; do
    [ -f "$BASES/$name/config.json" ] || "$PY" training/pretrain.py "${QM9[@]}" --out "$BASES/$name" --max-steps 2 \
      --quiet --set "${TINY[@]}" batch_size=16 "${SMALL[@]}" > "$OUT/$name.log" 2>&1
  done
fi
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
left_minutes() {  # what the call has left for sampling, less 40 s for packing the results
  awk "BEGIN { m = ($LEASE_SECONDS - $(date +%s) + $START - 40) / 60; print (m > 0 ? m : 0) }"
}

blocks_of() {  # checkpoint -> its number of blocks (length / block_size)
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1]+'/config.json'))['model']['dit']; \
print(d['length'] // d['block_size'])" "$1"
}
chain() {  # name family base block-size config...: the block base, its TT, both exported, their molecules drawn
  local name=$1 family=$2 base=$3 b=$4 labelled=$2
  shift 4
  [ "${SMOKE:-0}" = 1 ] && labelled=qm9  # the rehearsal's data is the QM9 sample
  "$PY" training/train_blocks.py "$@" --base "$base" --block-size "$b" --out "$RUNS/$name-base" "${BUDGET[@]}" \
    --max-minutes "$BASE_GUARD" --resume --quiet --set "${SET[@]}" > "$OUT/$name-base.log" 2>&1
  echo "$name-base exit $?"
  "$PY" training/finetune.py "$@" --base "$RUNS/$name-base" --decomposition tt --rank 8 --head 1layer \
    --out "$RUNS/$name-tt" "${FT_BUDGET[@]}" --max-minutes "$FT_GUARD" --resume --quiet --set "${SET[@]}" eps=0.75 \
    > "$OUT/$name-tt.log" 2>&1
  echo "$name-tt exit $?"
  for run in "$name-base" "$name-tt"; do
    "$PY" training/export.py --src "$RUNS/$run" --out "$EXPORT/$run" --family "$labelled" >> "$OUT/$name-tt.log" 2>&1 \
      || echo "$run not exported"
  done
  [ -f "$EXPORT/$name-tt/config.json" ] || return 1
  local n minutes
  n=$(blocks_of "$EXPORT/$name-tt") minutes=$(left_minutes)
  local steps=("$n" $((2 * n)) $((b * n)))
  if [ "$family" = moses ]; then
    "$PY" training/evaluate_moses.py --checkpoints "$EXPORT/$name-base" "$EXPORT/$name-tt" --sample-only \
      --samples-dir "$SAMPLED/moses" --steps "${steps[@]}" --eb-gammas --device "$DEVICE" "${EVAL[@]}" \
      --max-minutes "$minutes" >> "$OUT/$name-sample.log" 2>&1
  else
    "$PY" training/evaluate.py --checkpoints "$EXPORT/$name-base" "$EXPORT/$name-tt" --sample-only \
      --samples-dir "$SAMPLED/qm9" --steps "${steps[@]}" --orderings random --eb-gammas --rank-one-view also \
      --device "$DEVICE" "${EVAL[@]}" --max-minutes "$minutes" >> "$OUT/$name-sample.log" 2>&1
  fi
  echo "$name sampling exit $? (K = ${steps[*]})"
}
chain qm9-b4 qm9 "$BASES/qm9-none-r1" 4 "${QM9[@]}" & B4=$!
chain qm9-b8 qm9 "$BASES/qm9-none-r1" 8 "${QM9[@]}" & B8=$!
chain moses-b4 moses "$BASES/moses-none-r1" 4 "${MOSES[@]}" & M4=$!
wait "$B4"; wait "$B8"; wait "$M4"  # by PID: a bare wait also waits for the log's tee
rm -f "$OUT"/moses.tar.part-*  # the MOSES pair comes back (51 MB): evaluate_moses.py loads what it measures;
# the QM9 rows are measured from their molecules alone (evaluate.py --from-samples), their weights stay there
PAIR=()
for name in moses-b4-base moses-b4-tt; do [ -f "$EXPORT/$name/config.json" ] && PAIR+=("$name"); done
[ ${#PAIR[@]} -gt 0 ] && tar -C "$EXPORT" -cf - "${PAIR[@]}" | split -b 15M - "$OUT/moses.tar.part-"
tar -C "$SAMPLED" -czf "$OUT/samples.tgz" .
"$PY" - "$RUNS" <<'PY'
import json, sys
from pathlib import Path
for state in sorted(Path(sys.argv[1]).glob("*/train_state/state.json")):  # each stage: its budget and validation
    meta = json.loads(state.read_text())
    t, val = meta.get("throughput", {}), meta.get("val", {})
    print(f"{state.parent.parent.name}: step {meta.get('step', 0)}, {t.get('tokens_per_second', 0):,.0f} tokens/s, "
          f"MFU {100 * t.get('mfu', 0):.1f}%, {t.get('train_seconds', 0):.0f} s in training steps; validation {val}")
PY
echo "brought back: ${PAIR[*]:-none}; $(( $(date +%s) - START )) s"
ls -la "$OUT"
