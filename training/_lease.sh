# Sourced by the lease scripts (device_continue.sh, device_rank.sh, device_moses.sh) after they set LOG, STEPS
# and RUNS: the log under $OUT, the QM9 cache and tokenized splits (split-*) from .lease/cache, the MOSES files
# from .lease/moses, and the
# rehearsal size (SMOKE=1: 2 steps of 32 sequences, 1 validation batch).
OUT=${OUT:?set OUT}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$LOG") 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TTCORE_CACHE=${TTCORE_CACHE:-/tmp/ttcore-cache}
mkdir -p "$TTCORE_CACHE"
for f in .lease/cache/qm9-*.gz; do [ -e "$f" ] && gunzip -c "$f" > "$TTCORE_CACHE/$(basename "$f" .gz)"; done
# tokenized splits (ttcore/data/cache.py: MOSES's is 38 MB and loads in seconds instead of tokenizing again)
for d in .lease/cache/split-*; do [ -d "$d" ] && cp -r "$d" "$TTCORE_CACHE/"; done
[ -d .lease/moses ] && export TTCORE_MOSES_DIR=${TTCORE_MOSES_DIR:-$PWD/.lease/moses}
SMALL=()
if [ "${SMOKE:-0}" = 1 ]; then STEPS=2; SMALL=(val_batches=1 warmup_steps=1 batch_size=32); fi
mkdir -p "$RUNS"
