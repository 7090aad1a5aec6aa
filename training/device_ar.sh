#!/usr/bin/env bash
# A GPU lease for the AR baselines' rows that two CPU cores cannot train (docs/baselines.md): the MOSES and text
# autoregressive models, each the DiT of the diffusion model it is compared with (moses_gpu: 384 x 6; text: 256 x 6,
# l = 128, 8k BPE) with that model's tokenizer, trained side by side on the device at its diffusion model's budget:
# MOSES the base's 3 minutes plus the fine-tune's 1 (--fit-minutes, as device_moses.sh sized them), text the text
# base's 3,781 steps plus the TT fine-tune's 797 at batch 64 (--max-steps, a wall-clock guard beside). Both exported
# in bf16 and brought back under $OUT as a split tar with the log.
#   bash training/device_ar.sh                                  (device: OUT set by the tool; timeout_s 590)
#   SMOKE=1 OUT=/tmp/ar PYTHON=.venv/bin/python bash training/device_ar.sh   (rehearsal, CPU, a minute)
# Prepared here: .lease/moses (molsets' files), .lease/cache/*.gz (the gzipped text cache, TTCORE_CACHE), and the
# two tokenizers: mkdir -p .lease/ar-tok/{moses,text}; cp checkpoints/moses-none-r1/tokenizer.json
# .lease/ar-tok/moses/; cp checkpoints/text-tt-r4/tokenizer.json .lease/ar-tok/text/ (checkpoints/ moved out of the
# tree for the call). Afterwards, here: cat pair.tar.part-* | tar -x -C runs/; then benchmarks/ar_baselines.py
# (MOSES: evaluate_moses.py on the AR checkpoint; text: evaluate.py --data text).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
MOSES_MINUTES=${MOSES_MINUTES:-4} TEXT_STEPS=${TEXT_STEPS:-4578} TEXT_MINUTES=${TEXT_MINUTES:-7}
LOG=ar.log RUNS=${RUNS:-runs/ar-lease}
. training/_lease.sh
TOK=${TOK:-.lease/ar-tok}
MOSES=(--config moses_gpu --tokenizer "$TOK/moses" --fit-minutes "$MOSES_MINUTES")
TEXT=(--config text --tokenizer "$TOK/text" --max-steps "$TEXT_STEPS" --max-minutes "$TEXT_MINUTES")
SET=(ckpt_minutes=2 val_every=1000 val_batches=4)
TEXT_SET=(total_steps="$TEXT_STEPS")
if [ "${SMOKE:-0}" = 1 ]; then  # the recipe's path at the tiny size, on the committed sample
  TINY=(model.hidden_dim=32 model.cond_dim=16 model.n_blocks=1 model.n_heads=2 batch_size=16 compile=false
        precision=fp32)
  MOSES=(--config tiny --data tests/data/qm9_sample.txt --tokenizer "$TOK/moses" --fit-minutes 0.01)
  TEXT=(--config tiny --data tests/data/qm9_sample.txt --tokenizer "$TOK/text" --max-steps 3)
  SET=("${TINY[@]}" "${SMALL[@]}") TEXT_SET=(total_steps=3)
fi
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
"$PY" training/train_ar.py "${MOSES[@]}" --out "$RUNS/moses-ar" --resume --quiet --set "${SET[@]}" \
  > "$OUT/moses-ar.log" 2>&1 &
MOSES_PID=$!
"$PY" training/train_ar.py "${TEXT[@]}" --out "$RUNS/text-ar" --resume --quiet --set "${SET[@]}" "${TEXT_SET[@]}" \
  > "$OUT/text-ar.log" 2>&1 &
TEXT_PID=$!
wait "$MOSES_PID"; echo "moses-ar exit $?"  # by PID: a bare wait also waits for the log's tee
wait "$TEXT_PID"; echo "text-ar exit $?"
tail -n 3 "$OUT/moses-ar.log" "$OUT/text-ar.log"
EXPORTED=()
for name in moses-ar text-ar; do
  family=${name%-ar}
  [ "${SMOKE:-0}" = 1 ] && family=qm9
  if [ -f "$RUNS/$name/config.json" ] && "$PY" training/export.py --src "$RUNS/$name" --out "$RUNS/export/$name" \
      --family "$family"; then
    EXPORTED+=("$name")
  fi
done
rm -f "$OUT"/ar.tar.part-*
[ ${#EXPORTED[@]} -gt 0 ] && tar -C "$RUNS/export" -cf - "${EXPORTED[@]}" | split -b 15M - "$OUT/ar.tar.part-"
echo "exported: ${EXPORTED[*]:-none}; $(( $(date +%s) - START )) s"
ls -la "$OUT"
